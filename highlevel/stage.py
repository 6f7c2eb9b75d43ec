"""The Spark stage of one query: spool stream -> combine -> Meld punctuation -> close windows -> sinks.

One Structured Streaming query per oopscope query reads the spool's Parquet files (file source,
fixed schema) and hands each micro-batch to `Stage.process_batch` (`foreachBatch`). Per batch:

1. one small job reads the marker rows (link, seq, punctuation) and counts late rows;
2. each link's punctuation goes through Meld in sequence order (a file whose predecessor has not
   been read yet waits), giving the combined punctuation P;
3. the batch's partial rows and the open state of the previous batch are combined (one groupBy);
4. windows with end(w) <= P that were open are finalised (HAVING, SELECT list), written to the
   sinks once, and dropped from the state;
5. the remaining open state is written as a Parquet version and `meta.json` is committed by an
   atomic directory rename: `CHECKPOINT/state/<batch>/`.

Why the file source and not a Spark 4 Python data source: the file source already keeps, in
its checkpoint, which files each batch id covered and replays exactly those after a crash, and
it lists a local or shared directory with no Python worker in the loop; a Python streaming
source would have to re-implement offsets and run Python on the executors.
The union of links is a Meld of their punctuation (`spec.union = "merge"` closes windows at the
same points: Merge only orders rows, which combining into windows does not need; its buffer
is modelled by `highlevel.union.Merge` for the IOP memory experiment).

Restart: Spark's checkpoint replays an uncommitted batch id with the same files; a batch whose
state version exists is skipped, sinks skip batch files they already hold, so every window is
written once. Everything here is deterministic for a given batch, so a replay gives equal rows.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from common.spool import (
    LINK,
    PUNCT,
    SEQ,
    cached_rows,
    list_spool,
    not_kept,
    partials_dir,
)
from common.units import INT64_MAX
from highlevel.combine import Combiner
from highlevel.driverrows import DriverRows
from highlevel.errors import HighLevelError
from highlevel.finalize import having_column, ip_text_arrow, output_columns
from highlevel.parallel import map_ordered
from highlevel.session import get_session, lower_priority
from highlevel.sinks import Sink
from highlevel.sorting import sort_indices
from highlevel.spec import StageSpec
from highlevel.union import Meld
from highlevel.windows import window_config

log = logging.getLogger(__name__)

DEFAULT_TRIGGER = "200 milliseconds"
#: the session setting a driver-closed stage's stream runs with (`Stage._start`)
_WHOLE_STAGE = "spark.sql.codegen.wholeStage"
_START_LOCK = threading.Lock()


@dataclass
class StageState:
    """What survives a micro-batch (and a restart): committed as `state/<batch>/meta.json`."""

    batch: int = -1
    open_dir: str | None = None          # Parquet dir of the open (not yet closed) panes
    punctuation: int | None = None       # combined punctuation P the windows are closed through
    meld: dict | None = None
    next_seq: dict = field(default_factory=dict)     # link -> next file seq to apply
    pending: dict = field(default_factory=dict)      # link -> {seq: punctuation or None}
    late_rows: int = 0
    closed_rows: int = 0
    corrected_rows: int = 0              # late 'correct': correction rows written
    extra: dict = field(default_factory=dict)       # what other stage kinds keep (join, merge)

    def to_json(self) -> str:
        d = dict(self.__dict__)
        d["pending"] = {k: {str(s): p for s, p in v.items()} for k, v in self.pending.items()}
        return json.dumps(d, sort_keys=True)

    def for_batch(self, batch_id: int) -> "StageState":
        """A copy to update in micro-batch `batch_id` (this one stays as committed)."""
        return StageState(**{**self.__dict__, "batch": batch_id, "next_seq": dict(self.next_seq),
                             "pending": {k: dict(v) for k, v in self.pending.items()},
                             "extra": dict(self.extra)})

    @classmethod
    def from_json(cls, text: str) -> "StageState":
        d = json.loads(text)
        d["pending"] = {k: {int(s): p for s, p in v.items()} for k, v in d["pending"].items()}
        return cls(**d)


class Stage:
    """The high level of one query on Spark."""

    #: niceness of the thread that processes this stage's batches (0: unchanged); a bounded
    #: replay's stages running beside the low level yield to it
    nice = 0
    #: remove each spool file once the batch that read it on the driver is committed (a run's
    #: own temporary spool: the files are never read again, and removing them as the run
    #: goes costs less than removing the whole spool at its end)
    prune_spool = False
    cache_input = True     # subclasses (row stages) read their micro-batch several times

    def __init__(self, spec: StageSpec, spool: str | os.PathLike, checkpoint: str | os.PathLike,
                 sinks: Sequence[Sink], *, spark=None, master: str | None = None,
                 trigger: str = DEFAULT_TRIGGER, keep_versions: int = 3,
                 max_files_per_trigger: int | None = None,
                 clock: Callable[[], float] = time.time, input_schema=None,
                 prepare: Callable[[DataFrame], DataFrame] | None = None):
        # input_schema / prepare: a stage over another query's rows reads them in their raw
        # layout (highlevel.rows) and `prepare` turns each micro-batch into partial rows
        self.input_schema = input_schema
        self.prepare = prepare
        self.spec = spec
        self.spool = Path(spool)
        self.checkpoint = Path(checkpoint)
        self.sinks = list(sinks)
        self._spark, self._master = spark, master
        self.trigger = trigger
        self.keep_versions = keep_versions
        self.max_files_per_trigger = max_files_per_trigger
        self.clock = clock
        self.window = window_config(spec.window).build()
        self.state_root = self.checkpoint / "state"
        self.state_root.mkdir(parents=True, exist_ok=True)
        self.state = self._load_latest()
        self.batch_seconds: list[float] = []
        self._correct = spec.late == "correct"
        self._order = order_plan(spec)[0]
        # rows unique per (window, keys), e.g. flow records keyed by their flow id: combining
        # is the identity, so no groupBy (and no shuffle) at all
        self.unique_rows = bool(spec.extras.get("unique_rows"))
        # A spool micro-batch is read twice (markers, then rows), each time only the columns
        # it needs (Parquet column pruning): cheaper than caching every column of it. A
        # prepared frame (a row plan over another query's rows) is computed once and cached.
        self.cache_input = prepare is not None
        self.query = None
        # flow records whose batches can close on the driver (highlevel.driverrows)
        self._driver = DriverRows.for_stage(self)
        if self._driver is None:
            not_kept(spec.query)          # no driver here to take the rows from memory
            # Spark's expressions now: building them checks the outputs and HAVING (a
            # driver path's layout resolved every output already, and it has no HAVING)
            _ = (self.spark, self._outputs, self._having, self._correction_outputs,
                 self._combine, self._hidden)
        self.driver_batches = 0
        self.ahead_batches = 0          # driver batches that found `speculate`'s result
        # what `speculate` computed for the next batch: (inputs, done event, result holder)
        self._speculation: tuple | None = None
        partials_dir(self.spool, spec.query).mkdir(parents=True, exist_ok=True)

    @property
    def spark(self):
        """The Spark session. A stage that closes its batches on the driver can be made
        before Spark is up (`speculate`): it gets the session when it first needs it."""
        if self._spark is None:
            self._spark = get_session(self._master)
        return self._spark

    @spark.setter
    def spark(self, session) -> None:
        self._spark = session

    # --- Spark expressions ---------------------------------------------------------------------
    # built once, on first use: every py4j call building an expression costs driver time (the
    # netflow stage's took 0.18 s), and a stage that closes its batches on the driver never
    # needs them
    @cached_property
    def _outputs(self) -> list[Column]:
        return output_columns(self.spec)

    @cached_property
    def _having(self) -> Column | None:
        return having_column(self.spec)

    @cached_property
    def _correction_outputs(self) -> list[Column] | None:
        return correction_columns(self.spec) if self._correct else None

    @cached_property
    def _combine(self) -> Combiner:
        return Combiner(self.spec.states, self.spec.distinct_registers)

    @cached_property
    def _hidden(self) -> list[Column]:
        return order_columns(self.spec)[1]

    # --- state versions ----------------------------------------------------------------------
    def _version_dir(self, batch: int) -> Path:
        return self.state_root / f"{batch:010d}"

    def _load_latest(self) -> StageState:
        versions = sorted(p for p in self.state_root.iterdir()
                          if p.is_dir() and p.name.isdigit() and (p / "meta.json").exists())
        if not versions:
            return StageState()
        state = StageState.from_json((versions[-1] / "meta.json").read_text())
        log.info("query %s: resuming after batch %d (P=%s)", self.spec.query, state.batch,
                 state.punctuation)
        return state

    def _commit(self, state: StageState) -> None:
        final = self._version_dir(state.batch)
        tmp = self.state_root / f".{final.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        (tmp / "meta.json").write_text(state.to_json())
        for sink in self.sinks:
            # before the commit: a crash in between replays the batch, and the sinks are
            # idempotent per batch id
            end = getattr(sink, "end_batch", None)
            if end is not None:
                end(state.batch, self.sink_punctuation(sink, state))
        os.rename(tmp, final)   # the commit point of the batch
        self.state = state
        self._collect_garbage()

    def sink_punctuation(self, sink, state: StageState) -> int | None:
        """The punctuation a sink gets with a batch: the stage's (a join gives a reader on one
        side's time that side's)."""
        return state.punctuation

    def _collect_garbage(self) -> None:
        versions = sorted(p for p in self.state_root.iterdir() if p.name.isdigit())
        keep = versions[-self.keep_versions:]
        referenced = set()
        for v in keep:
            meta = v / "meta.json"
            if meta.exists():
                referenced.add(json.loads(meta.read_text()).get("open_dir"))
        for v in versions[:-self.keep_versions]:
            shutil.rmtree(v, ignore_errors=True)
        for d in self.state_root.glob("open-*"):
            if d.name not in referenced and int(d.name.split("-")[1]) < self.state.batch:
                shutil.rmtree(d, ignore_errors=True)

    # --- streaming ---------------------------------------------------------------------------
    def stream(self) -> DataFrame:
        schema = self.input_schema or self.spec.spool_schema()
        reader = self.spark.readStream.schema(schema).option("maxFileAge",
                                                                                "3650d")
        if self.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", self.max_files_per_trigger)
        return reader.parquet(str(partials_dir(self.spool, self.spec.query)))

    def _writer(self):
        return (self.stream().writeStream.foreachBatch(self.process_batch)
                .queryName(f"oopscope_{self.spec.query}")
                .option("checkpointLocation", str(self.checkpoint / "stream")))

    def start(self):
        """Start the continuous stage (micro-batches every `trigger`); returns the query."""
        self.query = self._start(self._writer().trigger(processingTime=self.trigger))
        return self.query

    def _start(self, writer):
        """`writer.start()`. A stage that closes its batches on the driver starts its stream
        without whole-stage code generation, in the stream's own session (Spark clones the
        session when the query starts; the shared one is set back at once): Spark's
        foreachBatch sink turns each micro-batch's scan into an RDD, which compiles generated
        code (0.17 s at the first batch: Janino's classes come from a signed jar, outside the
        class-data archive) for rows the driver path never reads through Spark. Its rare Spark
        jobs (rows that may be late) then run interpreted."""
        if getattr(self, "_driver", None) is None:     # row stages have no driver path
            return writer.start()
        with _START_LOCK:
            conf = self.spark.conf
            before = conf.get(_WHOLE_STAGE, None)
            conf.set(_WHOLE_STAGE, "false")
            try:
                return writer.start()
            finally:
                if before is None:
                    conf.unset(_WHOLE_STAGE)
                else:
                    conf.set(_WHOLE_STAGE, before)

    def run_available(self) -> None:
        """Process every file in the spool now, then return (for finite runs and tests)."""
        from pyspark.errors import StreamingQueryException

        self._run_started = self.clock()
        query = self._start(self._writer().trigger(availableNow=True))
        try:
            query.awaitTermination()
        except StreamingQueryException as exc:
            # Spark's message embeds the Python traceback; the first line says what failed
            first = str(exc).strip().splitlines()[0][:300]
            raise HighLevelError(f"query {self.spec.query!r}: Spark stage failed: {first}") \
                from exc

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.query = None

    # --- one micro-batch ---------------------------------------------------------------------
    def process_batch(self, df: DataFrame, batch_id: int) -> None:
        started = self.clock()
        if self.nice:
            lower_priority(self.nice)
        if getattr(self, "_run_started", None) is not None:
            # Structured Streaming's own start (checkpoint, listing, planning) before batch 1
            log.debug("query %s: stream start to first batch %.3f s", self.spec.query,
                      started - self._run_started)
            self._run_started = None
        if self._version_dir(batch_id).exists() or batch_id <= self.state.batch:
            log.info("query %s: batch %d already committed; skipped", self.spec.query, batch_id)
            return
        if self.prepare is not None:
            df = self.prepare(df)
        if not self.cache_input:
            self._process(df, batch_id)
        else:
            df = df.persist()
            try:
                self._process(df, batch_id)
            finally:
                df.unpersist()
        self.batch_seconds.append(self.clock() - started)

    def _process(self, df: DataFrame, batch_id: int) -> None:
        spec, win, prev = self.spec, self.window, self.state
        tick = self._tick = Ticker(self.clock)
        files = self._footer_markers(batch_id, prev.punctuation)
        on_driver = files is not None and self._driver is not None
        late = keep = None
        if files is None:
            is_row = F.col("window").isNotNull()
            late, keep = self._late_columns(is_row, prev.punctuation)
            more = self.marker_columns
            files = (df.select(LINK, SEQ, PUNCT, "window", *more, *self.late_reads)
                     .groupBy(LINK, SEQ)
                     .agg(F.max(PUNCT).alias("p"), F.sum(is_row.cast("long")).alias("rows"),
                          F.sum(late.cast("long")).alias("late"),
                          F.sum(keep.cast("long")).alias("kept"),
                          *[F.max(c).alias(c) for c in more])
                     .collect())
        tick("markers")
        state = prev.for_batch(batch_id)
        punctuation = self._meld(state, files)
        late_rows = sum(int(f["late"] or 0) for f in files)
        kept = sum(int(f["kept"] or 0) for f in files)
        if on_driver and not late_rows:
            self._process_on_driver(files, prev, state, punctuation, kept)
            return
        if late is None:          # rows from the footers' markers: Spark's job after all
            late, keep = self._late_columns(F.col("window").isNotNull(), prev.punctuation)
        columns = [f.name for f in spec.partial_schema().fields]
        corrections = None
        if late_rows:
            log.warning("query %s: %d partial rows arrived for windows already closed "
                        "(P=%s); %s", spec.query, late_rows, prev.punctuation,
                        "correction rows follow" if self._correct else "dropped and counted")
            if self._correct:
                corrections = self._corrections(df.where(late).select(*columns),
                                                prev.punctuation)
        state.late_rows += late_rows
        advanced = self._advanced(prev, state, punctuation)
        if not kept and not advanced:
            self._write_corrections(state, batch_id, corrections)
            self._commit(state)
            return
        parts = df.where(keep).select(*columns) if kept else None
        if prev.open_dir is not None:
            old = self.spark.read.schema(spec.partial_schema()).parquet(
                str(self.state_root / prev.open_dir))
            parts = old if parts is None else parts.unionByName(old)
        if parts is None:
            state.punctuation = punctuation if advanced else prev.punctuation
            state.open_dir = None
            self._write_corrections(state, batch_id, corrections)
            self._commit(state)
            return
        # at the end of input (P = the largest int64) every window closes: nothing stays open
        closes_all = advanced and punctuation >= INT64_MAX
        if self.unique_rows:
            combined = parts
        else:
            combined = self._combine(parts, ["window"] + spec.key_columns())
        # persisted only when two jobs read it (the closed and the open rows); with unique
        # rows each job reads its own rows from the Parquet files again, which costs less
        # than caching them
        cached = not self.unique_rows and advanced and not closes_all
        if cached:
            combined = combined.persist()
        try:
            if advanced:
                state.closed_rows += self._close(combined, batch_id, prev.punctuation,
                                                 punctuation, corrections)
                if corrections is not None:
                    state.corrected_rows += corrections.num_rows
                state.punctuation = punctuation
                combined_open = combined.where(self._retained(punctuation))
            else:
                self._write_corrections(state, batch_id, corrections)
                combined_open = combined
            if closes_all:
                state.open_dir = None
            else:
                open_dir = f"open-{batch_id:010d}"
                combined_open.write.mode("overwrite").parquet(str(self.state_root / open_dir))
                tick("write state")
                state.open_dir = open_dir
            self._commit(state)
            tick("commit")
            log.debug("query %s: batch %d timings %s", spec.query, batch_id, tick.laps)
        finally:
            if cached:
                combined.unpersist()

    def _process_on_driver(self, files, prev: StageState, state: StageState, punctuation,
                           kept: int) -> None:
        """`_process` for flow records whose markers came from the footers: the same
        closing, read and selected with Arrow on the driver (highlevel.driverrows)."""
        driver, batch_id = self._driver, state.batch
        self.driver_batches += 1
        advanced = self._advanced(prev, state, punctuation)
        if not kept and not advanced:
            self._commit(state)
            self._prune(files)
            return
        ready = self._speculated(files, prev, punctuation) if advanced else None
        if ready is not None:
            table, still_open = ready
            state.closed_rows += self._emit(None, batch_id, punctuation, table)
            state.punctuation = punctuation
        else:
            rows = self._driver_rows(files, prev)
            self._tick("read")
            still_open = rows
            if advanced and not rows.num_rows:
                state.punctuation = punctuation   # nothing open, nothing new: no sink write
            elif advanced:
                closed, still_open = driver.split(rows, prev.punctuation, punctuation)
                state.closed_rows += self._emit(driver.result(closed), batch_id, punctuation)
                state.punctuation = punctuation
        state.open_dir = None
        if still_open.num_rows:
            state.open_dir = f"open-{batch_id:010d}"
            driver.write_open(still_open, self.state_root / state.open_dir)
            self._tick("write state")
        self._commit(state)
        self._prune(files)
        self._tick("commit")
        log.debug("query %s: batch %d timings %s (on the driver)", self.spec.query, batch_id,
                  self._tick.laps)

    def _driver_rows(self, files, prev: StageState, keep: bool = False) -> pa.Table:
        """The partial rows of a driver batch: its files' and the open state's."""
        open_dir = self.state_root / prev.open_dir if prev.open_dir is not None else None
        return self._driver.read([(f["path"], f["rows"]) for f in files if f["rows"]],
                                 open_dir, keep)

    # --- speculation -------------------------------------------------------------------------
    def speculate(self) -> bool:
        """Compute what the next micro-batch will write: its closed rows, sorted and in the
        sinks' layout, and the rows left open. Its files are those the stream's log names
        when the stream planned it already, else every spool file there is now.

        A bounded run whose low level ended before the first batch began calls this: the
        streaming query's start or its first planning take most of a second on a fresh JVM,
        on one core, and the batch then finds its rows ready (`_process_on_driver`). The
        batch uses them when its files, state and punctuation are the ones computed with,
        and computes its own otherwise; rows kept in memory for it stay there. Only for a
        stage that closes its batches on the driver and has no raw sinks. Returns whether
        there was something to compute."""
        from highlevel.batchfiles import batch_files, files_markers

        driver, prev = self._driver, self.state
        if driver is None or any(getattr(sink, "raw", False) for sink in self.sinks) \
                or self.prepare is not None or self.marker_columns or self.late_reads:
            return False
        # a batch the stream planned already reads the files its log names; else every file
        paths = batch_files(self.checkpoint / "stream", prev.batch + 1)
        if paths is None:
            paths = [path for _, _, path in list_spool(self.spool, self.spec.query)]
        files = files_markers(paths, self._earliest_end, prev.punctuation) if paths else None
        if not files:
            return False
        state = prev.for_batch(prev.batch + 1)
        punctuation = self._meld(state, files)
        if not self._advanced(prev, state, punctuation):
            return False
        done, holder = threading.Event(), []
        self._speculation = (_inputs(files, prev, punctuation), done, holder)
        try:
            rows = self._driver_rows(files, prev, keep=True)
            closed, still_open = driver.split(rows, prev.punctuation, punctuation)
            holder.append((self._output_table(driver.result(closed)), still_open))
        finally:
            done.set()
        log.debug("query %s: next batch computed ahead over %d spool files: %d rows close",
                  self.spec.query, len(files), holder[0][0].num_rows if holder else 0)
        return True

    def _speculated(self, files, prev: StageState, punctuation) -> tuple | None:
        """`speculate`'s (output table, open rows) when it computed them for these inputs
        (waiting for it when it is still at work), else None."""
        if self._speculation is None:
            return None
        inputs, done, holder = self._speculation
        done.wait()
        self._speculation = None
        if not holder or inputs != _inputs(files, prev, punctuation):
            log.debug("query %s: the batch computed ahead is not this one", self.spec.query)
            return None
        self.ahead_batches += 1
        return holder[0]

    def _prune(self, files: list[dict]) -> None:
        """Remove a committed driver batch's spool files (`prune_spool`)."""
        if self.prune_spool:
            for f in files:
                cached_rows(f["path"])          # rows still kept for it (none read) go too
                Path(f["path"]).unlink(missing_ok=True)

    #: marker columns besides the punctuation that the markers job reads, and further
    #: columns its late condition reads (highlevel.joint)
    marker_columns: tuple[str, ...] = ()
    late_reads: tuple[str, ...] = ()

    def _footer_markers(self, batch_id: int, before: int | None) -> list | None:
        """The markers job's answer read from the batch's spool file footers when no row can
        be late (highlevel.batchfiles); None: run the job. Only for partial rows spooled by
        the low level (not a prepared frame) and the stage's own late rule."""
        if self.prepare is not None or self.marker_columns or self.late_reads:
            return None
        from highlevel.batchfiles import batch_markers

        return batch_markers(self.checkpoint / "stream", batch_id, self._earliest_end, before)

    def _earliest_end(self, pane: int) -> int:
        """The end of the first window a pane counts in."""
        win = self.window
        return win.window_end(win.windows_of_pane(pane)[0]) if self._correct \
            else win.pane_end(pane)

    def _advanced(self, prev: StageState, state: StageState, punctuation) -> bool:
        """Whether this batch's punctuation closes more than the last one did."""
        return punctuation is not None and (prev.punctuation is None
                                            or punctuation > prev.punctuation)

    def _retained(self, punctuation: int) -> Column:
        """The rows (panes) that stay open after closing through `punctuation`."""
        return self.window.retained_col(F.col("window"), punctuation)

    def _closing(self, before: int | None, upto: int) -> Column:
        """The tumbling windows that close now: end in (before, upto]."""
        end = self.window.pane_end_col(F.col("window"))
        closed = end <= F.lit(upto)
        return closed if before is None else closed & (end > F.lit(before))

    def _meld(self, state: StageState, files) -> int | None:
        """Apply each link's punctuation in file order; the combined punctuation after it."""
        meld = Meld(self.spec.links).build(state.meld)
        for link, p in self._in_order(state, files):
            meld.on_punctuation(link, p)
        state.meld = meld.to_state()
        return meld.output

    def _file_marker(self, f):
        """What a file's markers say (JSON-able; None: nothing): its punctuation here."""
        return None if f["p"] is None else int(f["p"])

    def _in_order(self, state: StageState, files) -> list[tuple[str, object]]:
        """Queue each file's `_file_marker` under its link and sequence number; return the
        markers now due, (link, marker) in sequence order per link (a file after a gap waits
        in `state.pending` for its predecessor)."""
        for f in files:
            link = f[LINK]
            if link not in self.spec.links:
                log.warning("query %s: spool file of link %r, which is not one of the query's "
                            "links %s; its punctuation is ignored", self.spec.query, link,
                            list(self.spec.links))
                continue
            state.pending.setdefault(link, {})[int(f[SEQ])] = self._file_marker(f)
        due = []
        for link in list(state.pending):
            pending = state.pending[link]
            nxt = state.next_seq.get(link, 0)
            while nxt in pending:
                marker = pending.pop(nxt)
                nxt += 1
                if marker is not None:
                    due.append((link, marker))
            state.next_seq[link] = nxt
        return due

    # --- late 'correct' (SEMANTICS.md 8) ------------------------------------------------------
    def _late_columns(self, is_row: Column, before: int | None) -> tuple[Column, Column]:
        """(late, keep) row conditions against the punctuation the windows were closed
        through. `drop`: a row whose pane ended by then is late and not kept. `correct`: a row
        with a closed window is late (it goes to the correction rows), and a row that an open
        window still needs is kept too (a sliding window's pane can be in both)."""
        win = self.window
        if before is None:
            return F.lit(False), is_row
        pane = F.col("window")
        if not self._correct:
            late = is_row & (win.pane_end_col(pane) <= F.lit(before))
            return late, is_row & ~late
        late = is_row & (win.window_end_col(win.first_window_col(pane)) <= F.lit(before))
        return late, is_row & win.retained_col(pane, before)

    def _corrections(self, late: DataFrame, before: int) -> pa.Table:
        """The correction rows of late partial rows: per closed window and group, the final
        values over the late rows only (the delta), with the correction column 1. HAVING is
        not applied (it is a condition on totals, not on deltas). Spark's Arrow result, in the
        layout `_close` collects."""
        spec, win = self.spec, self.window
        combined = self._combine(late, ["window"] + spec.key_columns())
        if win.tumbling:
            closed = combined
        else:
            exploded = combined.withColumn("window", F.explode(win.windows_col(F.col("window"))))
            exploded = exploded.where(win.window_end_col(F.col("window")) <= F.lit(before))
            closed = self._combine(exploded, ["window"] + spec.key_columns())
        return closed.select(*self._correction_outputs, *self._hidden).toArrow()

    def _write_corrections(self, state: StageState, batch_id: int,
                           corrections: pa.Table | None) -> None:
        """Write correction rows in a batch that closes no window."""
        if corrections is not None and corrections.num_rows:
            state.corrected_rows += self._emit(corrections, batch_id, state.punctuation)

    def _close(self, combined: DataFrame, batch_id: int, before: int | None, upto: int,
               corrections: pa.Table | None = None) -> int:
        """Finalise and write every window with before < end(w) <= upto (and the batch's
        correction rows, in the same sink write); rows written."""
        spec, win = self.spec, self.window
        if win.tumbling:
            closed = combined.where(self._closing(before, upto))
        else:
            exploded = combined.withColumn("window", F.explode(win.windows_col(F.col("window"))))
            end = win.window_end_col(F.col("window"))
            exploded = exploded.where(end <= F.lit(upto))
            if before is not None:
                exploded = exploded.where(end > F.lit(before))
            # unique pane rows stay unique per window: a row's keys include its pane's identity
            closed = exploded if self.unique_rows else \
                self._combine(exploded, ["window"] + spec.key_columns())
        if self._having is not None:
            closed = closed.where(self._having)
        # sort on the driver: results are small, and a Spark orderBy costs a sampling job
        result = closed.select(*self._outputs, *self._hidden).toArrow()
        self._tick("combine+collect")
        extra = 0
        if corrections is not None and corrections.num_rows:
            extra = corrections.num_rows
            result = pa.concat_tables([corrections, result.cast(corrections.schema)])
        return self._emit(result, batch_id, upto) - extra

    def _output_table(self, result: pa.Table) -> pa.Table:
        """Spark's Arrow result sorted, in the output schema."""
        if result.num_rows <= 1:
            return to_output_table(result, self.spec)
        # one chunk per column first: sorting and taking across many Arrow batches of 10K
        # rows costs twice as much
        result = result.combine_chunks()
        return sorted_output_table(result, sort_indices(result, self._order), self.spec)

    def _emit(self, result: pa.Table | None, batch_id: int, upto: int | None,
              table: pa.Table | None = None) -> int:
        """Sort Spark's Arrow result, write it to the sinks once; rows written. `table`:
        the result's `_output_table` already (no raw sinks)."""
        spec, win = self.spec, self.window
        if table is None and any(getattr(sink, "raw", False) for sink in self.sinks):
            if result.num_rows > 1:
                result = result.combine_chunks()
                result = result.take(sort_indices(result, self._order))
            table = to_output_table(result, spec)
        elif table is None:
            table = self._output_table(result)
        self._tick("sort+format")
        raw = None
        for sink in self.sinks:
            if getattr(sink, "raw", False):
                if raw is None:
                    window = np.asarray(result.column("__window").combine_chunks()
                                        .fill_null(0))
                    ends = win.pane_end(window) if win.tumbling else win.window_end(window)
                    raw = raw_output_table(result.append_column("__time", pa.array(ends)),
                                           spec)
                sink.write(batch_id, raw)
            else:
                sink.write(batch_id, table)
        self._tick("sinks")
        log.info("query %s: batch %d closed windows up to P=%s: %d rows", spec.query, batch_id,
                 upto, table.num_rows)
        return table.num_rows


def _inputs(files: list[dict], prev: StageState, punctuation) -> tuple:
    """What a driver batch's result depends on: its files (path and rows), the open state it
    starts from, and the punctuations it closes between."""
    return (frozenset((str(f["path"]), f["rows"]) for f in files), prev.open_dir,
            prev.punctuation, punctuation)


def correction_columns(spec: StageSpec) -> list:
    """The SELECT list of correction rows: the outputs with the correction column = 1."""
    from dataclasses import replace

    from highlevel.spec import OutputColumn
    from queries import expressions as E

    if spec.correction is None:
        raise HighLevelError(f"query {spec.query!r}: late 'correct' needs a correction "
                             f"output column (the planner adds one)")
    outputs = tuple(OutputColumn(o.name, E.Literal(value=1, kind="int"), o.type)
                    if o.name == spec.correction else o for o in spec.outputs)
    return output_columns(replace(spec, outputs=outputs))


def order_plan(spec: StageSpec) -> tuple[list[str], list[tuple[str, str]]]:
    """(result columns to sort by, hidden columns to fetch besides the outputs as (alias,
    partial column)).

    Rows are sorted by (window, keys). A key that an output already holds unchanged (the
    output is the bare key, of the same Spark type) is sorted by through that output rather
    than fetched twice: with flow records every key but the flow id is an output, and the
    Arrow transfer to the driver costs per column. The window id is always fetched, as
    `__window` (the raw layout's window end is computed from it)."""
    from highlevel.finalize import unwrap_ip_str
    from queries import expressions as E

    spark_type = {"int64": "long", "uint64": "long", "float64": "double", "string": "string",
                  "bool": "boolean", "ip": "ip"}
    shown: dict[str, str] = {}          # key name -> output name holding it unchanged
    for o in spec.outputs:
        expr = unwrap_ip_str(o.expr)
        if isinstance(expr, (E.Column, getattr(E, "Field", E.Column))) and \
                expr.name != spec.window.column:
            shown.setdefault(expr.name, (o.name, o.type))
    order, hidden = ["__window"], [("__window", "window")]
    for k in spec.keys:
        held = shown.get(k.name)
        same = held is not None and spark_type[held[1]] == spark_type[k.type]
        for c in k.columns():
            suffix = c[len(k.name):]          # "" or "__hi"/"__lo"
            if same:
                order.append(held[0] + suffix)
            else:
                name = f"__order{len(hidden)}"
                hidden.append((name, c))
                order.append(name)
    return order, hidden


def order_columns(spec: StageSpec) -> tuple[list[str], list]:
    """`order_plan` with the hidden columns as Spark columns."""
    order, hidden = order_plan(spec)
    return order, [F.col(c).alias(name) for name, c in hidden]


class Ticker:
    """Lap times of one batch's steps (for the debug log and the latency tool)."""

    def __init__(self, clock):
        self.clock, self.last, self.laps = clock, clock(), {}

    def __call__(self, name: str) -> None:
        now = self.clock()
        self.laps[name] = round(now - self.last, 3)
        self.last = now


def raw_output_table(table: pa.Table, spec: StageSpec) -> pa.Table:
    """Spark's Arrow result in the raw layout of `highlevel.rows` (for readers' spools):
    `window` = the window's end (ns), ip outputs as `name__hi`/`name__lo`, the rest as Spark
    computed them (unsigned as int64 bits)."""
    names = set(table.column_names)
    cols = {"window": table.column("__time")}
    for o in spec.outputs:
        if o.name not in names and f"{o.name}__hi" in names:
            cols[f"{o.name}__hi"] = table.column(f"{o.name}__hi")
            cols[f"{o.name}__lo"] = table.column(f"{o.name}__lo")
        else:
            cols[o.name] = table.column(o.name)
    return pa.table(cols)


#: rows of a closed batch taken and formatted per part (`sorted_output_table`)
OUTPUT_PART_ROWS = 1 << 18


def sorted_output_table(table: pa.Table, order: np.ndarray, spec: StageSpec,
                        part_rows: int = OUTPUT_PART_ROWS) -> pa.Table:
    """`to_output_table(table.take(order))`, one chunk per part of `part_rows` rows, the
    parts taken and formatted side by side (`highlevel.parallel`)."""
    parts = [order[i:i + part_rows] for i in range(0, len(order), part_rows)]
    tables = list(map_ordered(lambda idx: to_output_table(table.take(idx), spec), parts))
    return pa.concat_tables(tables) if tables else to_output_table(table.slice(0, 0), spec)


def to_output_table(table: pa.Table, spec: StageSpec) -> pa.Table:
    """Spark's Arrow result in the output schema (uint64 outputs travel as int64 bits)."""
    schema = spec.output_arrow_schema()
    arrays = []
    names = set(table.column_names)
    for f in schema:
        if f.name not in names and f"{f.name}__hi" in names:
            arrays.append(ip_text_arrow(_one_chunk(table.column(f"{f.name}__hi")),
                                        _one_chunk(table.column(f"{f.name}__lo"))))
            continue
        col = _one_chunk(table.column(f.name))
        if pa.types.is_uint64(f.type) and pa.types.is_int64(col.type):
            col = col.view(pa.uint64())         # the same bits and nulls, no copy
        arrays.append(col if col.type == f.type else col.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _one_chunk(col: pa.ChunkedArray) -> pa.Array:
    """The column as one array (`combine_chunks` copies even a single chunk)."""
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def warm_up(spark, work: str | os.PathLike) -> float:
    """Run a tiny stage end to end in `work` (an empty directory): streaming start, Parquet
    scan, markers, combine, close, Arrow to the driver. A fresh JVM loads and compiles these
    paths on first use (seconds); done while the low level runs, the real stage finds them
    ready. Returns the seconds it took."""
    from common.spool import SpoolWriter
    from highlevel.testing import ListSink, demo_spec, random_partials

    started = time.perf_counter()
    work = Path(work)
    spec = demo_spec(query="warmup", links=("a",), registers=4)
    rows = random_partials(np.random.default_rng(0), [1, 2], 64, registers=4, query="warmup")
    SpoolWriter(work / "spool", "warmup", "a", fsync=False).write([rows], INT64_MAX)
    Stage(spec, work / "spool", work / "ck", [ListSink()], spark=spark).run_available()
    return time.perf_counter() - started
