"""When a run's Spark stages run beside its low level: continuously for a paced or live run
(`StreamingStages`), once at the end or overlapped with a long read for a bounded replay at
full speed (`BoundedStages`)."""

from __future__ import annotations

import time

from common import settings
from tools.pipeline.config import RunSummary
from tools.pipeline.threads import ContinuousStages, OverlappedStages, SessionStarter


class StreamingStages:
    """Paced and live runs: the stages run continuously from when Spark is up, so each
    window appears as soon as its punctuation arrives; at the end they process everything
    in the spool and stop. A resumed live run's stages leave out its gap."""

    def __init__(self, starter: SessionStarter, graph, resume=None):
        self.thread = ContinuousStages(starter, graph, on_bound=None if resume is None
                                       else resume.suppress_gap)

    def start(self, sources) -> None:
        self.thread.start()

    def finish(self, summary: RunSummary, low_done: float) -> None:
        """The low level has ended (at `low_done`, perf_counter): the rest of the stages."""
        self.thread.finish()
        summary.highlevel_seconds = time.perf_counter() - low_done

    def stop(self) -> None:
        """At the end, after `finish` or an error: `finish` stopped the stages (after an
        error, their daemon thread ends with the run)."""


class BoundedStages:
    """Full-speed replays: the JVM starts in the background; when the input is large or a
    stream and Spark is up while the low level still reads, the stages run continuously
    from then on (the two levels overlap on two cores, `OverlappedStages`), otherwise they
    run once over the whole spool when the low level is done. `resumed`: over a resumed
    checkpoint, whose next batch may be a replay, nothing is computed ahead."""

    def __init__(self, starter: SessionStarter, graph, resumed: bool = False):
        self.starter, self.graph, self.resumed = starter, graph, resumed
        self.overlap: OverlappedStages | None = None

    def start(self, sources) -> None:
        self.overlap = OverlappedStages(self.starter, self.graph, sources.read_share)
        # a stream (FIFO, standard input) has no known size and may last: its windows are
        # written as they close once Spark is up, as for a large file
        if sources.input_bytes() >= self.overlap.MIN_BYTES or sources.streams():
            self.overlap.start()

    def finish(self, summary: RunSummary, low_done: float) -> None:
        """The low level has ended (at `low_done`, perf_counter): the rest of the stages."""
        graph = self.graph
        if self.overlap is not None and self.overlap.low_level_done():
            if self.overlap.late and not self.resumed:
                graph.speculate(nice=settings.background_nice())
            self.overlap.finish()
            summary.highlevel_seconds = time.perf_counter() - low_done
            return
        if not self.resumed:
            # the stages' batch computed while Spark starts and while the streaming queries
            # start (~2 s on a fresh JVM even when Spark is up): the run's critical path
            graph.speculate(nice=settings.background_nice())
        graph.bind(self.starter.result())
        summary.spark_wait_seconds = time.perf_counter() - low_done
        high_started = time.perf_counter()
        graph.run_available()
        summary.highlevel_seconds = time.perf_counter() - high_started

    def stop(self) -> None:
        """At the end, after `finish` or an error: no stream left running."""
        if self.overlap is not None and self.overlap.started:
            for _, stage in self.graph.stages:
                stage.stop()
