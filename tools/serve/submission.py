"""One submitted query file of the appliance: its record on disk, its low-level feeds on the
links, its Spark stages, and its outputs.

A submission is planned once when it is submitted (a bad query changes nothing) and again,
from the text kept in its record, when the server restarts. It runs the file's chosen
queries (`--output` ones, else every query no other query reads); each chosen query is a
*stream* that can be tailed, named after the submission (`NAME`, or `NAME.QUERY` when the
file has several).

Its first output window is the first one that starts after the submission: packets older
than that start are held back from its operators, and windows that begin before it are not
written. After a crash the same holds for the *gap*: the windows between the last
punctuation that reached the spool before the crash and the restart's first full window are
not written (they would hold part of their packets), and the gap is reported.

State directory layout (the server's `--state DIR`):

    queries/NAME.json        the record: text, parameters, outputs, generation, gaps, state
    run/NAME/gN/spool        the spool of generation N (partial rows, punctuation)
    run/NAME/gN/checkpoint   Spark's checkpoint and the stages' state of generation N

A generation lasts until the query is stopped cleanly (cancel, shutdown): its windows are then
all closed and written, and the next start begins generation N+1 with an empty spool and
checkpoint. A crash keeps the generation: the restart resumes its spool and checkpoint, so
every window that had closed is written once (output files are named by generation and
batch id, written atomically, and a replayed batch finds its file).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.datafiles import NO_FILES, DataFiles
from tools.errors import RunConfigError
from tools.pipeline.feeds import AttachedFeed
from tools.serve.carryover import KeepCounters, Tally
from tools.serve.tail import StreamOutput

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$")
FORMATS = ("csv", "jsonl", "parquet")
_SAVING = threading.Lock()


@dataclass
class Record:
    """What the server remembers of a submission (`queries/NAME.json`)."""

    name: str
    file: str                                   # the file's name as submitted (for messages)
    text: str
    params: dict = field(default_factory=dict)
    sets: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)  # query -> output directory (absolute)
    format: str = "csv"
    submitted_ns: int = 0
    first_window_ns: int = 0
    generation: int = 1
    #: [from, to) ns: windows overlapping one are not written (before the first window, gaps)
    suppress: list = field(default_factory=list)
    gaps: list = field(default_factory=list)    # {"from_ns", "to_ns", "reason"}
    state: str = "running"                      # running | cancelled | failed
    error: str | None = None
    stopped_cleanly: bool = False               # the generation's windows were all written
    #: the counters when it stopped running (cancelled or failed), for `queries`
    final: dict = field(default_factory=dict)
    #: link -> host id of each link a capture agent runs the low level of
    #: (`tools.serve.agents`); its spool is then below `spool_root`, the shared directory
    agents: dict = field(default_factory=dict)
    spool_root: str = ""
    #: link -> N of the links the server captures with N fanout members (`serve --fanout`):
    #: its spool holds their sub-links `NAME#K`, melded by the stages; `agents` names the
    #: member of each sub-link
    fanout: dict = field(default_factory=dict)
    #: [path, text] of the schema files it was submitted with (`submit --schema`, and the
    #: packet_schema.txt beside its file), kept so that a restart plans it the same way
    schemas: list = field(default_factory=list)
    #: the generation it was submitted in: its output files are those of this one on
    #: (counted at a restart, `tools.serve.carryover`)
    first_generation: int = 1
    #: its counters as of the last save, carried across restarts (`carryover.Tally`)
    counted: dict = field(default_factory=dict)
    #: the query's link names -> the server's links it reads (`submit --link-map main=L`)
    link_map: dict = field(default_factory=dict)
    #: {query: {link: slots}}: its adaptive tables' sizes as of the last save, where they
    #: start when it runs again (`tools.pipeline.tablesizes`)
    tables: dict = field(default_factory=dict)

    def save(self, state_dir: Path) -> None:
        d = state_dir / "queries"
        d.mkdir(parents=True, exist_ok=True)
        # the stages save their counters from their own threads: one writer at a time
        with _SAVING:
            tmp = d / f".{self.name}.json.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(asdict(self), indent=1))
            os.replace(tmp, d / f"{self.name}.json")

    @classmethod
    def load_all(cls, state_dir: Path,
                 output_problem: Callable[[Path], str | None] = lambda p: None,
                 spool_roots: tuple[str, ...] = ("",)) -> list[Record]:
        """Every record of the state directory that is sound: of the right shape, named
        as its file, its outputs allowed (`output_problem` of each: None) and its spool
        on one of `spool_roots`. Another is skipped with one line saying what is wrong
        (not what it holds), and nothing it names is touched."""
        out = []
        for path in sorted((state_dir / "queries").glob("*.json")):
            try:
                record = cls.parse(path.stem, path.read_bytes(), output_problem,
                                   spool_roots)
            except OSError as exc:
                log.error("%s: cannot read this query record (%s); skipped", path,
                          exc.strerror)
            except RecordError as exc:
                log.error("%s: not a sound query record (%s); skipped", path, exc)
            else:
                out.append(record)
        return out

    @classmethod
    def parse(cls, stem: str, data: bytes,
              output_problem: Callable[[Path], str | None] = lambda p: None,
              spool_roots: tuple[str, ...] = ("",)) -> Record:
        """The record of file `queries/STEM.json` holding `data` (RecordError: why not)."""
        try:
            value = json.loads(data)
        except (ValueError, RecursionError):
            raise RecordError("not JSON") from None
        if not isinstance(value, dict):
            raise RecordError("not a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in value if k not in fields)
        if unknown:
            raise RecordError(f"{len(unknown)} unknown field(s)")
        for key in ("name", "file", "text"):
            if key not in value:
                raise RecordError(f"no {key}")
        for key, v in value.items():
            if not _SHAPES[key](v):
                raise RecordError(f"{key}: not {_SHAPE_NAMES[key]}")
        name = value["name"]
        if not NAME_RE.match(name):
            raise RecordError("its name is not a query name (letters, digits, _ . : -)")
        if name != stem:
            raise RecordError("its name is not its file's name")
        for d in value.get("outputs", {}).values():
            p = Path(d)
            why = "not an absolute path" if not p.is_absolute() else \
                output_problem(Path(os.path.normpath(p)).resolve())
            if why is not None:
                raise RecordError(f"an output directory: {why}")
        if value.get("spool_root", "") not in spool_roots:
            raise RecordError("its spool_root is not the server's shared directory (its "
                              "--spool, or STATE/shared with --fanout): start the server "
                              "as when it was submitted")
        return cls(**value)


class RecordError(ValueError):
    """A query record of the state directory that the server must not act on (why)."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str_dict(v, value_ok) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and value_ok(x)
                                       for k, x in v.items())


def _pairs(v, item_ok) -> bool:
    return isinstance(v, list) and all(isinstance(x, list) and len(x) == 2
                                       and all(item_ok(y) for y in x) for x in v)


def _table_sizes(v) -> bool:
    from tools.pipeline.tablesizes import sound

    return sound(v)


def _scalar(v) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


#: the counters of a record's `final` that the listing and the metrics add up
_COUNTERS = ("rows_out", "partial_rows", "evictions", "flushes", "late_packets",
             "zero_divisor_packets", "zero_divisor_rows", "generation")

#: field -> (whether a JSON value fits it, what it should be): a record loaded from the state
#: directory is checked against these before anything acts on it
_FIELD_SHAPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (lambda v: isinstance(v, str), "a string"),
    "file": (lambda v: isinstance(v, str), "a string"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "params": (lambda v: _str_dict(v, _scalar), "an object of scalars"),
    "sets": (lambda v: _str_dict(v, _scalar), "an object of scalars"),
    "outputs": (lambda v: _str_dict(v, lambda x: isinstance(x, str)), "an object of paths"),
    "format": (lambda v: v in FORMATS, f"one of {', '.join(FORMATS)}"),
    "submitted_ns": (_is_int, "an integer"),
    "first_window_ns": (_is_int, "an integer"),
    "generation": (lambda v: _is_int(v) and 1 <= v < 1 << 31, "a positive integer"),
    "suppress": (lambda v: _pairs(v, _is_int), "a list of [from, to] integers"),
    "gaps": (lambda v: isinstance(v, list) and all(
        _str_dict(g, lambda x: x is None or _is_int(x) or isinstance(x, str)) for g in v),
             "a list of objects"),
    "state": (lambda v: v in ("running", "cancelled", "failed"),
              "running, cancelled or failed"),
    "error": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "stopped_cleanly": (lambda v: isinstance(v, bool), "true or false"),
    "final": (lambda v: isinstance(v, dict) and all(
        v.get(k) is None or (isinstance(v[k], (int, float)) and not isinstance(v[k], bool))
        for k in _COUNTERS), "an object of counters"),
    "agents": (lambda v: _str_dict(v, lambda x: isinstance(x, str)), "an object of hosts"),
    "spool_root": (lambda v: isinstance(v, str), "a string"),
    "fanout": (lambda v: _str_dict(v, lambda x: _is_int(x) and 1 <= x <= 1024),
               "an object of counts"),
    "schemas": (lambda v: _pairs(v, lambda x: isinstance(x, str)),
                "a list of [path, text]"),
    "first_generation": (lambda v: _is_int(v) and 1 <= v < 1 << 31, "a positive integer"),
    "counted": (lambda v: _str_dict(v, lambda x: _is_int(x) or _str_dict(
        x, lambda y: _is_int(y) or (isinstance(y, list) and len(y) == 3
                                    and all(_is_int(z) for z in y)))),
                "an object of counters"),
    "link_map": (lambda v: _str_dict(v, lambda x: isinstance(x, str)), "an object of links"),
    "tables": (_table_sizes, "an object of {link: slots} per query"),
}
_SHAPES = {k: f for k, (f, _) in _FIELD_SHAPES.items()}
_SHAPE_NAMES = {k: n for k, (_, n) in _FIELD_SHAPES.items()}


class Submission:
    """A running submission (module docstring). Made by the appliance, which owns its life."""

    def __init__(self, record: Record, state_dir: Path, link_names: list[str],
                 remote: dict[str, str] | None = None, fanout: dict[str, int] | None = None,
                 server_schemas: list | tuple = (), files: DataFiles = NO_FILES):
        from tools.pipeline.config import QuerySummary, plan_text

        self.record = record
        self.state_dir = state_dir
        #: the layers of (path, text) schema files it is planned with: the server's (`serve
        #: --schema`), then its own (those the server has not read already), whose protocols
        #: replace the server's of their names
        server = [tuple(f) for f in server_schemas]
        texts = {t for _, t in server}
        self.schema_layers = [server, [tuple(f) for f in record.schemas
                                       if tuple(f)[1] not in texts]]
        schema = None
        if any(self.schema_layers):
            from queries.schemafile import layered_schema

            schema = layered_schema(self.schema_layers)
        self.plan = plan_text(record.text, record.file, list(link_names), dict(record.params),
                              dict(record.sets), subset=True, schema=schema, files=files,
                              link_map=record.link_map)
        names = list(record.outputs) or [qp.name for qp in self.plan.queries
                                          if not qp.read_by]
        for q in names:
            try:
                self.plan.query(q)
            except KeyError:
                raise RunConfigError(f"--output {q}=...: no query {q!r} in {record.file}; its "
                                     f"queries are {', '.join(self.plan.names)}") from None
        self.chosen = [self.plan.query(q) for q in names]
        self.links = list(self.plan.links)
        #: link -> N of its links captured by N fanout members (`Record.fanout`)
        self.fanout = {n: int(k) for n, k in (record.fanout if fanout is None
                                              else fanout).items()
                       if n in self.links and int(k) > 1}
        #: spool link -> agent host of the spool links whose low level an agent runs (the
        #: others are the server's own); a fanned-out link's are its sub-links, one member
        #: each
        self.remote = {n: h for n, h in (remote or {}).items() if n in self.spool_links}
        self.summaries = {q: QuerySummary(q, "", record.format) for q in self.plan.names}
        #: lp -> allow(slots): the memory budget's grant for an adaptive table (the server
        #: sets it before `build`; None: no budget but the plan's cap)
        self.allow_slots: Callable | None = None
        self.outputs: dict[str, StreamOutput] = {}
        self.feeds: dict[str, AttachedFeed] = {}
        self.graph: Any = None                  # highlevel.graph.StageGraph once built
        self.spool_queue: Any = None            # tools.pipeline.feeds.SpoolQueue once built
        self._counting = threading.Lock()       # save_counters: one thread at a time
        self.stages_started = False
        #: its stages were made (their counters can be read, even once stopped)
        self.stages_made = False
        self.error: str | None = record.error
        #: counters carried from before this process (`carryover`), made by `build`
        self.tally: Tally | None = None
        #: stream -> rows its output files held when it was built (written before a restart)
        self.rows_before: dict[str, int] = {}

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def streams(self) -> dict[str, str]:
        """Stream name -> query name of each chosen query."""
        return {self.stream_name(q.name): q.name for q in self.chosen}

    def stream_name(self, query: str) -> str:
        return self.name if len(self.chosen) == 1 else f"{self.name}.{query}"

    @property
    def spool_links(self) -> list[str]:
        """The links its spool has: its links, a fanned-out one as its sub-links."""
        from highlevel.graph import sublink_names

        return [s for n in self.links
                for s in (sublink_names(n, self.fanout[n]) if n in self.fanout else (n,))]

    def check_fanout(self) -> None:
        """Refuse, before anything starts, what cannot meld a fanned-out link's sub-links
        (MERGE, tuple-count windows need one ordered stream per link)."""
        import tempfile

        from highlevel.errors import StageConfigError
        from highlevel.graph import StageGraph
        from tools.errors import UnsupportedQueryError

        if not self.fanout:
            return
        try:
            with tempfile.TemporaryDirectory(prefix="oopscope-serve-") as unused:
                StageGraph(self.plan, [qp.name for qp in self.chosen], unused, unused,
                           sinks={}, fanout=self.fanout)
        except StageConfigError as exc:
            raise UnsupportedQueryError(str(exc)) from None

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run" / self.name / f"g{self.record.generation}"

    @property
    def spool_dir(self) -> Path:
        """Its spool: in the state directory, or on the shared directory when agents write
        to it (`tools.cluster.work.spool_of`)."""
        if self.record.spool_root:
            from tools.cluster.work import spool_of

            return spool_of(Path(self.record.spool_root), self.name, self.record.generation)
        return self.run_dir / "spool"

    # --- building ------------------------------------------------------------------------------
    def build(self, hub, clock) -> None:
        """Make the stage graph, the outputs and the low-level feeds (no Spark needed yet)."""
        from highlevel.errors import StageConfigError
        from highlevel.graph import StageGraph
        from tools.errors import UnsupportedQueryError
        from tools.pipeline.feeds import OperatorFeed, SpoolQueue
        from tools.results.formats import arrow_schema

        spool, checkpoint = self.spool_dir, self.run_dir / "checkpoint"
        spool.mkdir(parents=True, exist_ok=True)
        checkpoint.mkdir(parents=True, exist_ok=True)
        # a shared spool's temporaries may be an agent's file being written: left alone
        mine = () if self.record.spool_root else (spool,)
        for d in (*mine, checkpoint):
            _remove_temporaries(d)
        # in an output directory (below the output root, `StateDir.output_dir`) only the
        # part files a killed writer left: the directory may hold others' files too
        for out in self.record.outputs.values():
            _remove_temporaries(Path(out), ".part-*.tmp", recursive=False)
        sinks: dict[str, list] = {}
        self.tally = Tally(self.record)
        for qp in self.chosen:
            stream = self.stream_name(qp.name)
            out = Path(self.record.outputs[qp.name])
            self.rows_before[stream] = self.tally.rows_at_start(
                stream, out, self.record.format, self.record.first_generation)
            self.outputs[stream] = StreamOutput(
                stream, qp.high.outputs, arrow_schema(qp.name, qp.high.outputs), out,
                self.record.format, f"g{self.record.generation:04d}-", hub, clock, self.links)
            # the counters first: saved before the rows are in their file
            sinks[qp.name] = [KeepCounters(functools.partial(self._batch_ended, stream),
                                           self.save_counters),
                              self.outputs[stream]]
        try:
            self.graph = StageGraph(self.plan, [qp.name for qp in self.chosen], spool,
                                    checkpoint, sinks=sinks, fanout=self.fanout or None)
        except StageConfigError as exc:
            raise UnsupportedQueryError(str(exc)) from None
        for qp in self.chosen:      # for the page: each stream's windows in time, its history
            out = self.outputs[self.stream_name(qp.name)]
            out.set_window(qp.high.window)
            out.recall(self.record.first_generation)
        self.spool_queue = SpoolQueue(before_write=self.save_counters)
        per_link: dict[str, list] = {n: [] for n in self.spool_links if n not in self.remote}
        for lp in self.graph.low_plans():
            if lp.link in self.remote:          # its agent runs it (tools.cluster.watch)
                continue
            summary = self.summaries[self.graph.query_of(lp)]
            # latency first: a pane's groups leave the table as its punctuation closes it
            # an adaptive table starts at the size it had when the query last ran
            feed = OperatorFeed(lp, spool, summary, "snappy", punctuation_flush=True,
                                allow_slots=self.allow_slots(lp)
                                if self.allow_slots is not None and lp.max_slots else None,
                                start_slots=self.record.tables.get(lp.query, {}).get(lp.link))
            feed.spool_queue = self.spool_queue
            per_link[lp.link].append(feed)
        start = self.record.suppress[-1][1] if self.record.suppress else None
        self.feeds = {n: AttachedFeed(fs, start if start is not None else 0)
                      for n, fs in per_link.items() if fs}

    def last_punctuation(self) -> int | None:
        """The smallest over this submission's spools of the last punctuation each link wrote
        (None: some link wrote none): every window ending by then is complete in the spool."""
        from common.spool import last_punctuations

        spool = self.spool_dir
        if not spool.is_dir():
            return None
        assert self.graph is not None
        plans = self.graph.low_plans()
        found = {q: last_punctuations(spool, q) for q in {lp.query for lp in plans}}
        lows = [found[lp.query].get(lp.link, (0, None))[1] for lp in plans]
        if not lows or any(p is None for p in lows):
            return None
        return min(p for p in lows if p is not None)

    def start_stages(self, spark) -> None:
        assert self.graph is not None
        self.graph.bind(spark)
        self.graph.run_continuously()
        for _, stage in self.graph.stages:
            stage.label = f"{self.name}__"
            stage.suppress = tuple((int(a), int(b)) for a, b in self.record.suppress)
        self.stages_made = True
        self.graph.start()
        self.stages_started = True

    # --- stopping ------------------------------------------------------------------------------
    def finish_low(self) -> None:
        """The links' end for this submission: every operator flushes and punctuates end of
        input, so every open window closes."""
        for feed in self.feeds.values():
            feed.finish()
        if self.spool_queue is not None:
            self.spool_queue.flush()
            self.spool_queue.close()

    def stop_stages(self, spark) -> None:
        """Let the stages write everything in their spools, then stop them."""
        if self.graph is None:
            return
        if not self.stages_started:
            if spark is None:
                return
            self.graph.bind(spark)
            for _, stage in self.graph.stages:
                stage.label = f"{self.name}__"
                stage.suppress = tuple((int(a), int(b)) for a, b in self.record.suppress)
            self.stages_made = True
            self.graph.run_available()
            return
        self.graph.stop()
        self.stages_started = False

    def abandon_stages(self) -> None:
        if self.graph is not None and self.stages_started:
            for _, stage in self.graph.stages:
                try:
                    stage.stop()
                except Exception as exc:  # noqa: BLE001 - stopping anyway
                    log.debug("query %s: stop: %s", self.name, exc)
            self.stages_started = False

    def close_outputs(self) -> None:
        for out in self.outputs.values():
            out.close()

    def release(self) -> None:
        """Let go of what runs it once it ended (cancelled, failed, or not launched): the
        spool queue's thread ends and the operators' tables and the stage graph are dropped,
        so that a failed query leaks nothing (its counters are in its record by then)."""
        if self.spool_queue is not None:
            self.spool_queue.close()      # at most its depth of files written first
            self.spool_queue = None
        self.feeds = {}
        self.graph = None
        self.stages_started = self.stages_made = False

    # --- reporting -----------------------------------------------------------------------------
    def live_counters(self) -> dict:
        """This process's counts of the counters a restart carries (`carryover.CARRIED`)."""
        low = {"evictions": 0, "flushed": 0, "late": 0, "zero_divisors": 0}
        for feed in self.feeds.values():
            for f in feed.feeds:
                c = f.op.counters
                for k in low:
                    low[k] += int(c.get(k, 0))
        suppressed = zero_rows = 0
        graph = self.graph
        if graph is not None and self.stages_made:
            suppressed = sum(st.suppressed_rows for _, st in graph.stages)
            zero_rows = sum(st.state.zero_divisor_rows for _, st in graph.stages)
        return {"partial_rows": sum(s.partial_rows for s in self.summaries.values()),
                "evictions": low["evictions"], "flushes": low["flushed"],
                "late_packets": low["late"],
                "before_start_packets": sum(f.before_start for f in self.feeds.values()),
                "suppressed_rows": suppressed, "zero_divisor_packets": low["zero_divisors"],
                "zero_divisor_rows": zero_rows}

    def table_slots(self) -> int:
        """The slots of this process's hash tables for the submission, now."""
        return sum(int(f.op.counters.get("slots", 0)) for feed in self.feeds.values()
                   for f in feed.feeds)

    def _batch_ended(self, stream: str, batch_id: int) -> None:
        tally, out = self.tally, self.outputs.get(stream)
        if tally is not None and out is not None:
            tally.batch_ended(stream, batch_id, self.rows_before.get(stream, 0) + out.rows)

    def keep_counters(self) -> None:
        """Its counters, and its tables' sizes, into its record (saved with it)."""
        if self.tally is not None:
            self.tally.keep(self.record, self.live_counters())
        from tools.pipeline.tablesizes import sizes_of

        sizes = sizes_of(f for feed in self.feeds.values() for f in feed.feeds)
        if sizes:                   # a new dict: a save on another thread may be reading it
            tables = {q: dict(links) for q, links in self.record.tables.items()}
            for q, links in sizes.items():
                tables.setdefault(q, {}).update(links)
            self.record.tables = tables

    def save_counters(self) -> None:
        """Its counters into its record, saved (while it runs: a stage's end of batch)."""
        if self.tally is None or self.record.state != "running":
            return
        # from the stages' threads and the spool queue's (before a file of partial rows is
        # written: a restarted stage reads it, and its rows count)
        with self._counting:
            self.keep_counters()
            try:
                self.record.save(self.state_dir)
            except OSError as exc:     # the next save tries again; nothing is lost but counts
                log.warning("cannot save query %s's counters: %s", self.name,
                            exc.strerror or exc)

    def info(self) -> dict:
        """Its state and counters: those of `carryover.CARRIED` and its rows count from its
        submission, across restarts (`counted_since_ns`); the latencies are this process's."""
        rec = self.record
        live = self.live_counters()
        counters = self.tally.totals(live) if self.tally is not None else live
        streams = [{**out.info(), "rows": out.rows + self.rows_before.get(stream, 0)}
                   for stream, out in self.outputs.items()]
        first = streams[0] if streams else {}
        rows = sum(s["rows"] for s in streams)
        return {"name": rec.name, "file": rec.file, "state": rec.state,
                "error": self.error, "links": self.links, "agents": dict(self.remote),
                "queries": [q.name for q in self.chosen],
                "streams": streams,
                "columns": first.get("columns", []), "numeric": first.get("numeric", []),
                "rows_out": rows,
                **counters,
                # the tables' size now (adaptive ones change between windows) and how much
                # the low level reduces: partial rows per result row (1.0: once per group)
                "slots": self.table_slots(),
                "partials_per_row": round(counters["partial_rows"] / rows, 3) if rows else None,
                "counted_since_ns": rec.submitted_ns,
                "latency_p50_s": first.get("latency_p50_s"),
                "latency_p99_s": first.get("latency_p99_s"),
                "first_window_ns": rec.first_window_ns, "submitted_ns": rec.submitted_ns,
                "generation": rec.generation, "gaps": rec.gaps,
                "outputs": {q: str(p) for q, p in rec.outputs.items()},
                "format": rec.format}


def _remove_temporaries(d: Path, pattern: str = ".*.tmp", recursive: bool = True) -> None:
    """Temporaries a killed writer left (`.NAME.PID.tmp`, never read by anyone)."""
    if not d.is_dir():
        return
    for path in (d.rglob(pattern) if recursive else d.glob(pattern)):
        try:
            path.unlink()
        except OSError:
            pass


def remove_generation(state_dir: Path, name: str, generation: int,
                      spool_root: str = "") -> None:
    shutil.rmtree(state_dir / "run" / name / f"g{generation}", ignore_errors=True)
    if spool_root:
        from tools.cluster.work import spool_of

        shutil.rmtree(spool_of(Path(spool_root), name, generation).parent, ignore_errors=True)

