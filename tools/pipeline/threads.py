"""The threads that run the Spark side of a run beside the low level: the session starter, the
stages of paced and live runs, the stages that overlap a full-speed replay, and the stop request
(SIGTERM / Ctrl-C)."""

from __future__ import annotations

import logging
import signal
import threading

from common import settings

log = logging.getLogger(__name__)


#: Full-speed replays: the low level (the main thread and the read-ahead) is the run's
#: critical path while it reads, and Spark's work then only has to keep up. With both cores
#: busy, Linux shares them evenly among runnable threads, and the main thread waits for a
#: core. So the Python thread that processes the stages' batches beside the low level runs at
#: a lower priority (niceness BACKGROUND_NICE). The driver JVM keeps niceness 0 (JVM_NICE):
#: niced, the stages of a large run fall behind and are left with more to do at the end, so
#: the run ends later. Once the low
#: level is done, nothing else competes and priorities do not matter. Paced runs keep normal
#: priorities. A live link (an interface, a NETFLOW collector's socket) is the other way
#: round: what its low level does not read in time is lost at the socket, while the high
#: level's input waits in the spool. A router's cache purge arrives as a burst, and the JVM
#: combining the windows the burst closes took up to 0.8 of the 2 cores' CPU-seconds during
#: it: the driver JVM of a run or server with a live link runs at niceness LIVE_JVM_NICE
#: (weight 335 against 1024: it still has every idle cycle and a quarter of a contended
#: core). OOPSCOPE_JVM_NICE, OOPSCOPE_LIVE_JVM_NICE and OOPSCOPE_BACKGROUND_NICE set other
#: values (`common.settings`).


def driver_nice(live: bool, streaming: bool) -> int:
    """The niceness of a local driver JVM (the comment above): of a run or server with a
    live link, of a paced run, of a full-speed replay."""
    if live:
        return settings.live_jvm_nice()
    return 0 if streaming else settings.jvm_nice()


class SessionStarter(threading.Thread):
    """Starts the Spark session while the low level runs (JVM start-up takes seconds)."""

    def __init__(self, master: str | None, quick_jvm: bool = True, nice: int = 0):
        super().__init__(name="oopscope-spark-start", daemon=True)
        self.master, self.session = master, None
        self.error: BaseException | None = None
        self.quick_jvm, self.nice = quick_jvm, nice

    def start(self) -> None:
        """Launch the JVM here (milliseconds), then connect and make the session on the
        thread: started from the thread, the launch waited for the GIL behind the main
        thread's imports."""
        try:
            from highlevel.session import launch_jvm

            launch_jvm(self.master, quick_jvm=self.quick_jvm, nice=self.nice)
        except BaseException as exc:  # handed to the main thread by result()
            self.error = exc
        super().start()

    def run(self) -> None:
        if self.error is not None:
            return
        try:
            from highlevel.session import get_session

            self.session = get_session(self.master, quick_jvm=self.quick_jvm, nice=self.nice)
        except BaseException as exc:  # handed to the main thread by result()
            self.error = exc

    def ready(self) -> bool:
        """Whether the session is up or failed to start (`_run` starts the thread first)."""
        return not self.is_alive()

    def result(self):
        self.join()
        if self.error is not None:
            raise self.error
        return self.session


class ContinuousStages(threading.Thread):
    """Paced and live runs: starts the stages as soon as Spark is up, stops them at the end
    after they have processed everything in the spool."""

    def __init__(self, starter: SessionStarter, graph, on_bound=None):
        super().__init__(name="oopscope-highlevel", daemon=True)
        self.starter, self.graph = starter, graph
        # called with the graph once it has its session, before a stage starts (a resumed
        # live run sets the gap its stages leave out)
        self.on_bound = on_bound
        self.error: BaseException | None = None
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            self.graph.bind(self.starter.result())
            if self.on_bound is not None:
                self.on_bound(self.graph)
            self.graph.start()
        except BaseException as exc:
            self.error = exc
        finally:
            self.ready.set()

    def finish(self) -> None:
        self.ready.wait()
        if self.error is not None:
            raise self.error
        self.graph.stop()


class OverlappedStages(threading.Thread):
    """Full-speed replays: when Spark is up while the low level is still reading (a large
    capture), the stages start running continuously on the spool, so Spark combines and
    writes the windows closed so far on the other core, and at the end only the last spool
    files are left. When the low level ends first (a small capture: the JVM takes seconds to
    start), nothing starts here and the stages run once over the whole spool at the end."""

    #: past this share of the input read, the low level is nearly done: the stages run
    #: once at the end (a continuous start would cut the rest into more micro-batches, each
    #: writing and re-reading the open state, for little overlap). Below it, even a late
    #: start pays: Structured Streaming's own start (checkpoint, listing, planning)
    #: overlaps the rest of the read
    LATE_SHARE = 0.95
    #: smaller inputs are read in about a second: nothing to overlap (and a run over them
    #: keeps one micro-batch per stage, whatever the JVM's speed)
    MIN_BYTES = 64 << 20

    def __init__(self, starter: SessionStarter, graph, read_share=lambda: None):
        super().__init__(name="oopscope-overlap", daemon=True)
        self.starter, self.graph, self.read_share = starter, graph, read_share
        self.error: BaseException | None = None
        self.started = False             # the stages run continuously
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._low_done = False
        self.late = False

    def run(self) -> None:
        try:
            spark = self.starter.result()
            share = self.read_share()
            with self._lock:
                if self._low_done or (share is not None and share > self.LATE_SHARE):
                    log.debug("Spark up with %s of the input read: the stages run at the end",
                              "all" if self._low_done else f"{share:.0%}")
                    return
                self.started = True
            self.graph.bind(spark)
            for _, stage in self.graph.stages:
                stage.nice = settings.background_nice()
            self.graph.start()
            log.debug("Spark stages started while the low level reads")
        except BaseException as exc:
            self.error = exc
        finally:
            self.ready.set()

    def low_level_done(self) -> bool:
        """The low level has ended: True when the stages run continuously (finish them).
        `late` then says whether their streaming queries were still starting: their first
        batches read every spool file."""
        with self._lock:
            self._low_done = True
            started = self.started
        if started:
            self.late = not self.ready.is_set()
            self.ready.wait()
        return started

    def finish(self) -> None:
        """Let each stage, upstream first, process every spool file, then stop it. No new
        streaming query starts (an availableNow run would cost a stream start per stage)."""
        if self.error is not None:
            raise self.error
        try:
            self.graph.drain()
        finally:
            for _, stage in self.graph.stages:
                stage.stop()


class StopRequest:
    """SIGTERM / Ctrl-C: the first asks the sources to stop (windows still close and are
    written), a second Ctrl-C aborts."""

    def __init__(self):
        self.asked = False
        self._old = {}

    def __call__(self) -> bool:
        return self.asked

    def _handle(self, signum, frame) -> None:
        if self.asked and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.asked = True
        log.warning("stopping (%s): closing every window and writing the results; "
                    "Ctrl-C again aborts", signal.Signals(signum).name)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

