"""A stage: one query's Structured Streaming query over its spool directory, and what every kind shares.

One Structured Streaming query per stage reads the spool's Parquet files (file source, fixed
schema) and hands each micro-batch to `Stage.process_batch` (`foreachBatch`). The base class
holds what every stage kind does the same way (docs/architecture.md, "The high level"):

- the stream: its start (continuous, every `trigger`), a run over what is there now
  (`run_available`), its stop (which closes the py4j connection its thread called back
  on, `highlevel.callbacks`);
- the batch dispatch: a batch whose state version exists is skipped (a replay after a crash),
  a prepared frame is made, the frame is persisted when the kind reads it several times;
- each link's punctuation applied through Meld in file sequence order (a file whose
  predecessor has not been read yet waits in the state);
- the state store (`highlevel.state`) and the sinks: the rows in the raw layout to raw sinks,
  in the display schema to the others, and each sink's `end_batch` before the commit.

What a micro-batch does is the kind's `_process`: the aggregations (`highlevel.aggregate`,
whose batches the runners of `highlevel.microbatch` and `highlevel.smallbatch` close;
`highlevel.landmark`, `highlevel.joint`, `highlevel.countwindow`),
and the kinds over result rows that share the batch of `highlevel.select.RowStage`
(`highlevel.select`, `highlevel.merge`, `highlevel.join`). Each kind is made from its configuration object (a
`StageSpec`, a `Selection`, a `MergeSpec`, a `JoinSpec`) and the same stream options.

Why the file source and not a Spark 4 Python data source: the file source already keeps, in
its checkpoint, which files each batch id covered and replays exactly those after a crash, and
it lists a local or shared directory with no Python worker in the loop; a Python streaming
source would have to re-implement offsets and run Python on the executors.

Restart: Spark's checkpoint replays an uncommitted batch id with the same files; a batch whose
state version exists is skipped, sinks skip batch files they already hold, so every window is
written once. Everything here is deterministic for a given batch, so a replay gives equal rows
(docs/semantics.md, "Restart and exactly-once").
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery

from common.spool import partials_dir
from highlevel.batchfiles import SpoolFileMarker, drop_unfinished_logs
from highlevel.callbacks import CallbackConnection
from highlevel.errors import HighLevelError
from highlevel.session import get_session, lower_priority
from highlevel.sinks import Sink
from highlevel.state import StageState, StateStore
from highlevel.union import Meld

log = logging.getLogger(__name__)

DEFAULT_TRIGGER = "200 milliseconds"


class Ticker:
    """Lap times of one batch's steps (for the debug log and the latency tool)."""

    def __init__(self, clock):
        self.clock, self.last, self.laps = clock, clock(), {}

    def __call__(self, name: str) -> None:
        now = self.clock()
        self.laps[name] = round(now - self.last, 3)
        self.last = now


class Stage:
    """The Spark stage of one query (module docstring); a kind defines `_process`.

    spec: the kind's configuration; every kind's has `query` (the spool directory), `links`
    (the `__link` names of its spool files, melded) and `spool_schema()`. input_schema /
    prepare: a stage over another query's rows reads them in their raw layout
    (`highlevel.rowlayout`) and `prepare` turns each micro-batch into partial rows."""

    #: niceness of the thread that processes this stage's batches (0: unchanged); a bounded
    #: replay's stages running beside the low level yield to it
    nice = 0
    #: remove each spool file once the batch that read it on the driver is committed (a run's
    #: own temporary spool: the files are never read again, and removing them as the run
    #: goes costs less than removing the whole spool at its end)
    prune_spool = False
    #: after each commit, remove the spool files it applied but each link's newest and newest
    #: punctuated (`common.spool.prune_applied`): a stage that runs for good (the appliance,
    #: a collector) whose spool would otherwise grow for as long as it runs; counted in
    #: `pruned_files` and `pruned_rows`
    prune_applied = False
    pruned_files = 0
    pruned_rows = 0
    #: the kind reads its micro-batch several times: the frame is persisted for the batch. An
    #: aggregation reads a spool micro-batch twice (markers, then rows), each time only the
    #: columns it needs (Parquet column pruning): cheaper than caching every column of it. A
    #: prepared frame (a row plan over another query's rows) is computed once and cached.
    persist_input = False
    #: the streaming query's name is `oopscope_<label><query>`: the appliance runs queries of
    #: the same name in one session for different submissions, and Spark wants names unique
    label = ""
    #: windows overlapping one of these [from, to) ns intervals are not written (the
    #: appliance: before a query's first full window, and a gap after a crash); aggregations
    #: apply it (`highlevel.aggregate`), and count what they left out in `suppressed_rows`
    suppress: tuple[tuple[int, int], ...] = ()
    suppressed_rows = 0
    #: rows of this batch written with a value that met a zero divisor (added to the state's
    #: count at the commit: a replayed batch counts once)
    zero_divisor_rows = 0
    #: link -> its sub-links: a link captured by N fanout sockets spools as N sub-links
    #: (`highlevel.graph.sublink_names`), each with its own punctuation, and the Meld waits
    #: for every one of them
    sublinks: dict = {}
    #: links left out of the Meld: a collector declares a link silent when its agent's
    #: heartbeats stop (`tools.cluster`), and windows close without it
    silent_links: frozenset = frozenset()
    #: an aggregation's open state is collected and written with Arrow on the driver rather
    #: than by a Spark write job (the appliance: small states, where latency counts)
    open_on_driver = False
    #: an aggregation's small batches are combined on the driver (`highlevel.smallbatch`)
    small_on_driver = False
    #: (column, descending) pairs: the order of the rows each batch gives the display sinks
    #: (DEFINE order_by, the window column first; `StageGraph` sets it). A window closes in
    #: one batch, so its rows come out in this order; by default, (window, keys) ascending
    row_order: tuple[tuple[str, bool], ...] = ()

    def __init__(self, spec, spool: str | os.PathLike, checkpoint: str | os.PathLike,
                 sinks: Sequence[Sink], *, spark=None, master: str | None = None,
                 trigger: str = DEFAULT_TRIGGER, keep_versions: int = 3,
                 max_files_per_trigger: int | None = None,
                 clock: Callable[[], float] = time.time, input_schema=None,
                 prepare: Callable[[DataFrame], DataFrame] | None = None):
        self.spec = spec
        self.spool = Path(spool)
        self.checkpoint = Path(checkpoint)
        self.sinks = list(sinks)
        self._spark, self._master = spark, master
        self.trigger = trigger
        self.max_files_per_trigger = max_files_per_trigger
        self.clock = clock
        self.input_schema = input_schema
        self.prepare = prepare
        self.cache_input = self.persist_input or prepare is not None
        self.store = StateStore(self.checkpoint / "state", keep_versions)
        self.state = self.store.load_latest(spec.query)
        self.batch_seconds: list[float] = []
        self.query: StreamingQuery | None = None
        #: the py4j connection the query's thread calls `process_batch` on: closed when the
        #: query ends, or each query run would leave a thread and a socket behind
        self.callbacks = CallbackConnection()
        #: batches closed on the driver, without a Spark job (`highlevel.microbatch`)
        self.driver_batches = 0
        self._run_started: float | None = None
        self._tick = Ticker(clock)
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

    @property
    def state_root(self) -> Path:
        """The state store's directory (`CHECKPOINT/state`)."""
        return self.store.root

    @property
    def closes_on_driver(self) -> bool:
        """Whether the stage's batches can close on the driver, with no Spark job (flow
        records, `highlevel.flowrecords`)."""
        return False

    @property
    def computes_ahead(self) -> bool:
        """Whether the stage can compute its next batch before it runs (`speculate`): a
        stage that closes on the driver, or writes final rows without a combine, and has not
        begun a batch that way yet."""
        return False

    def speculate(self) -> bool:
        """Compute what the next micro-batch will write before it runs (`computes_ahead`,
        `highlevel.microbatch`); whether there was something to compute."""
        return False

    # --- streaming ---------------------------------------------------------------------------
    def stream(self) -> DataFrame:
        schema = self.input_schema or self.spec.spool_schema()
        reader = self.spark.readStream.schema(schema).option("maxFileAge", "3650d")
        if self.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", self.max_files_per_trigger)
        return reader.parquet(str(partials_dir(self.spool, self.spec.query)))

    def _writer(self):
        drop_unfinished_logs(self.checkpoint / "stream")
        return (self.stream().writeStream.foreachBatch(self.process_batch)
                .queryName(f"oopscope_{self.label}{self.spec.query}")
                .option("checkpointLocation", str(self.checkpoint / "stream")))

    def start(self):
        """Start the continuous stage (micro-batches every `trigger`); returns the query."""
        self.query = self._start(self._writer().trigger(processingTime=self.trigger))
        return self.query

    def _start(self, writer):
        """`writer.start()` (a kind may start its stream in a session of its own)."""
        return writer.start()

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
        finally:
            self.callbacks.close()

    def stop(self) -> None:
        if self.query is not None:
            try:
                self.query.stop()      # returns once the query's thread has ended
            finally:
                self.query = None
                self.callbacks.close()

    # --- one micro-batch ---------------------------------------------------------------------
    def process_batch(self, df: DataFrame, batch_id: int) -> None:
        started = self.clock()
        self.callbacks.note(self.spark)
        if self.nice:
            lower_priority(self.nice)
        if self._run_started is not None:
            # Structured Streaming's own start (checkpoint, listing, planning) before batch 1
            log.debug("query %s: stream start to first batch %.3f s", self.spec.query,
                      started - self._run_started)
            self._run_started = None
        if self.store.version_dir(batch_id).exists() or batch_id <= self.state.batch:
            log.info("query %s: batch %d already committed; skipped", self.spec.query, batch_id)
            return
        if self.prepare is not None:
            df = self.prepare(df)
        self.zero_divisor_rows = 0
        if not self.cache_input:
            self._tick = Ticker(self.clock)
            self._process(df, batch_id)
        else:
            df = df.persist()
            try:
                self._tick = Ticker(self.clock)
                self._process(df, batch_id)
            finally:
                df.unpersist()
        self.batch_seconds.append(self.clock() - started)

    def _process(self, df: DataFrame, batch_id: int) -> None:
        """One micro-batch of this kind: ends with `_commit` of the batch's state."""
        raise NotImplementedError

    def _commit(self, state: StageState) -> None:
        state.zero_divisor_rows += self.zero_divisor_rows
        self.zero_divisor_rows = 0
        self.store.commit(state, self._end_batch)
        self.state = state
        self.store.collect_garbage(state)
        if self.prune_applied and state.next_seq:
            from common.spool import prune_applied

            try:
                files, rows = prune_applied(self.spool, self.spec.query, state.next_seq)
            except OSError as exc:        # the spool is the operator's: say so, go on
                log.warning("query %s: spool files not removed: %s", self.spec.query, exc)
            else:
                self.pruned_files += files
                self.pruned_rows += rows

    def _end_batch(self, state: StageState) -> None:
        for sink in self.sinks:
            # before the commit: a crash in between replays the batch, and the sinks are
            # idempotent per batch id
            sink.end_batch(state.batch, self.sink_punctuation(sink, state))

    def sink_punctuation(self, sink: Sink, state: StageState):
        """The punctuation a sink gets with a batch: the stage's (a join gives a reader on one
        side's time that side's)."""
        return state.punctuation

    def _write_sinks(self, batch_id: int, display: pa.Table | Callable[[], pa.Table],
                     raw: pa.Table | Callable[[], pa.Table]) -> None:
        """Hand a batch's rows to every sink: the raw layout to raw sinks, the display table
        to the others. Each is a table, or a function that makes it when a sink first needs
        it."""
        made: dict[bool, pa.Table] = {}
        for sink in self.sinks:
            if sink.raw not in made:
                table = raw if sink.raw else display
                made[sink.raw] = table if isinstance(table, pa.Table) else table()
                if not sink.raw and self.row_order:
                    made[False] = ordered(made[False], self.row_order)
            sink.write(batch_id, made[sink.raw])

    # --- punctuation in file order -----------------------------------------------------------
    @property
    def meld_inputs(self) -> tuple[str, ...]:
        """The Meld's inputs: the spec's links, each replaced by its sub-links if it has."""
        return tuple(s for link in self.spec.links for s in self.sublinks.get(link, (link,)))

    def _meld(self, state: StageState, files: list[SpoolFileMarker]) -> int | None:
        """Apply each link's punctuation in file order; the combined punctuation after it."""
        meld = Meld(self.meld_inputs).build(state.meld, self.silent_links)
        for link, p in self._in_order(state, files):
            meld.on_punctuation(link, p)
        meld.advance()
        state.meld = meld.to_state()
        return meld.output

    def _file_marker(self, f: SpoolFileMarker):
        """What a file's markers say (JSON-able; None: nothing): its punctuation here."""
        return None if f.punctuation is None else int(f.punctuation)

    def _in_order(self, state: StageState,
                  files: list[SpoolFileMarker]) -> list[tuple[str, Any]]:
        """Queue each file's `_file_marker` under its link and sequence number; return the
        markers now due, (link, marker) in sequence order per link (a file after a gap waits
        in `state.pending` for its predecessor)."""
        names = self.meld_inputs
        for f in files:
            if f.link not in names:
                log.warning("query %s: spool file of link %r, which is not one of the query's "
                            "links %s; its punctuation is ignored", self.spec.query, f.link,
                            list(names))
                continue
            state.pending.setdefault(f.link, {})[int(f.seq)] = self._file_marker(f)
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


def ordered(table: pa.Table, order) -> pa.Table:
    """`table`'s rows by (column, descending) pairs (`Stage.row_order`), ties in the order
    they came; a column the table lacks is left out."""
    import pyarrow.compute as pc

    keys = [(name, "descending" if desc else "ascending") for name, desc in order
            if name in table.column_names]
    if table.num_rows < 2 or not keys:
        return table
    return table.take(pc.sort_indices(table, sort_keys=keys))
