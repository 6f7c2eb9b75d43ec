"""The offline run: pcap files -> low-level operators -> spool -> Spark stage -> result files.

`run_offline(RunConfig(...)) -> RunSummary` is the library behind `oopscope run` over capture
files, as fast as the data allows (no pacing):

1. plan the query file for the links given (`--link NAME=PCAP`), pick the queries to run: the
   ones named by `--output`, else every query that no other query reads; a picked query the
   Spark stage cannot run yet (join, query-on-query, selection, MERGE) is an error naming it
   before any packet is read. Queries not picked are not run at all, so a file with a join can
   still run its aggregations when the user names them with `--output`.
2. per link, one capture reader feeds every low-level operator of the picked queries that read
   that link. The link's punctuation comes from its data clock: every `punctuate_every_ns` of
   data time, the largest capture time seen so far aligned down to the smallest window slide
   of the link's queries (never repeated). Partial rows are buffered per operator and written
   to the spool with the operator's punctuation whenever that punctuation advances (or the
   buffer grows large), so the number of spool files follows windows, not packets. At end of
   input every operator `finish()`es and the link punctuates END_OF_INPUT (int64 max).
3. the Spark stage of each picked query runs over its spool (`Stage.run_available`; the stages
   of several queries side by side, one driver thread each) into a collecting sink; the rows
   go to the output (stdout table, CSV, JSON lines, Parquet) in query order.

The Spark session starts in a background thread at the beginning, so the JVM start-up overlaps
the low level. Output conventions: CSV/JSON times as integers, `ipv4` columns as dotted quads,
`ip` columns as text (dotted quad for IPv4-mapped addresses, RFC 5952 otherwise, as
`highlevel.finalize.ip_text_arrow` writes them).
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.errors import RunConfigError, RunError, RunLinkError, UnsupportedQueryError

log = logging.getLogger(__name__)

NS = 1_000_000_000
FORMATS = ("table", "csv", "jsonl", "parquet")
_SUFFIX_FORMAT = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
                  ".parquet": "parquet", ".pq": "parquet"}
#: partial rows buffered per operator before a spool file is written without punctuation
SPOOL_FLUSH_ROWS = 1 << 20
#: the punctuation of a link whose capture has ended: every window may close
END_OF_INPUT = (1 << 63) - 1


@dataclass(frozen=True)
class RunConfig:
    """One offline run. `links`: (name, capture path) pairs; `outputs`: (query, path or "-")
    pairs, empty for every query that no other query reads, to stdout."""

    query_file: str
    links: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...] = ()
    format: str | None = None            # None: from the output path's suffix, else table
    overrides: tuple[tuple[str, str], ...] = ()
    params: tuple[tuple[str, str], ...] = ()
    master: str | None = None
    spool: str | None = None             # None: a temporary directory removed at the end
    checkpoint: str | None = None        # None: a temporary directory removed at the end
    punctuate_every_ns: int = NS
    batch_size: int = 65536
    parallel_stages: int = 4             # Spark stages of different queries run side by side


@dataclass
class LinkSummary:
    name: str
    path: str
    packets: int = 0
    bytes: int = 0
    malformed: int = 0
    reasons: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    punctuations: int = 0


@dataclass
class QuerySummary:
    name: str
    output: str
    format: str
    rows: int = 0
    partial_rows: int = 0
    spool_files: int = 0
    evictions: int = 0
    flushed: int = 0
    forced_full_flushes: int = 0
    late_packets: int = 0
    late_partial_rows: int = 0


@dataclass
class RunSummary:
    links: dict[str, LinkSummary]
    queries: dict[str, QuerySummary]
    results: dict = field(default_factory=dict, repr=False)   # query -> pyarrow.Table
    lowlevel_seconds: float = 0.0
    spark_wait_seconds: float = 0.0     # waiting for the session after the low level ended
    highlevel_seconds: float = 0.0
    total_seconds: float = 0.0

    def format(self) -> str:
        """The human summary printed on stderr at the end of a run."""
        lines = []
        from capture.schema import BENIGN_REASONS, REASONS

        benign = {REASONS[c] for c in BENIGN_REASONS}
        for s in self.links.values():
            bad = ", ".join(f"{k} {v}" for k, v in sorted(s.reasons.items())
                            if k not in benign) or "none"
            lines.append(f"link {s.name}: {s.packets} packets, {s.bytes} bytes, "
                         f"{s.malformed} malformed ({bad}), {s.punctuations} punctuations")
            lines += [f"link {s.name}: problem: {p}" for p in s.problems]
        for q in self.queries.values():
            lines.append(f"query {q.name}: {q.rows} rows -> {q.output} ({q.format}); "
                         f"{q.partial_rows} partial rows in {q.spool_files} spool files, "
                         f"{q.evictions} evictions, {q.flushed} flushed, "
                         f"{q.forced_full_flushes} forced full flushes, "
                         f"{q.late_packets} late packets, {q.late_partial_rows} late partials")
        lines.append(f"time: low level {self.lowlevel_seconds:.2f} s, waiting for Spark "
                     f"{self.spark_wait_seconds:.2f} s, Spark stage "
                     f"{self.highlevel_seconds:.2f} s, total {self.total_seconds:.2f} s")
        return "\n".join(lines)


# --- planning and query choice -------------------------------------------------------------------

def load_plan(config: RunConfig):
    """Parse and plan the query file over the configured links (one clear error otherwise)."""
    from queries.errors import QueryError
    from queries.explain import find_query_file, mentioned_links
    from queries.parser import parse
    from queries.planner import plan_file

    path = find_query_file(config.query_file)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QueryError("no such query file (nor a shipped query of that name)",
                         path=str(config.query_file)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise QueryError(f"cannot read the query file: {exc}", path=str(path)) from None
    tree = parse(text, path=str(path))
    names = [name for name, _ in config.links]
    if not names:
        raise RunConfigError("give at least one capture: --link NAME=PCAP")
    wanted = mentioned_links(tree)
    unknown = [n for n in names if wanted and n not in wanted]
    missing = [n for n in wanted if n not in names]
    if wanted and (unknown or missing):
        what = (f"--link {', '.join(unknown)} is not a link of the query file"
                if unknown else f"no capture given for link {', '.join(missing)}")
        raise RunLinkError(f"{path.name}: {what}; its links are {', '.join(wanted)} "
                           f"(write --link {wanted[0]}=PCAP)")
    return plan_file(tree, names, dict(config.params), dict(config.overrides), source=text)


def unsupported_reason(qp) -> str | None:
    """Why the offline run cannot run query plan `qp` yet (None when it can)."""
    h = qp.high
    if h.kind == "join":
        return "joins are not supported by `oopscope run` yet"
    if h.kind == "merge":
        return "MERGE is not supported by `oopscope run` yet"
    if h.input_kind != "links" or any(lp.source_kind != "link" for lp in qp.low):
        return "queries over other queries' results are not supported by `oopscope run` yet"
    if h.kind != "aggregate" or h.window is None:
        return "selections without aggregation are not supported by `oopscope run` yet"
    return None


def choose_queries(plan, config: RunConfig) -> list[tuple[object, str]]:
    """(query plan, output) pairs to run: `--output` ones, else every query nobody reads."""
    if config.outputs:
        chosen = []
        for name, out in config.outputs:
            try:
                chosen.append((plan.query(name), out))
            except KeyError:
                raise RunConfigError(f"--output {name}=...: no query {name!r} in the file; "
                                     f"its queries are {', '.join(plan.names)}") from None
    else:
        chosen = [(qp, "-") for qp in plan.queries if not qp.read_by]
    for qp, _ in chosen:
        why = unsupported_reason(qp)
        if why:
            others = [q.name for q in plan.queries if unsupported_reason(q) is None]
            hint = (f"; run the others with --output, e.g. --output {others[0]}=-"
                    if others else "")
            raise UnsupportedQueryError(f"query {qp.name!r} ({qp.high.kind}): {why} "
                                        f"(supported: windowed aggregations over links){hint}")
    return chosen


def output_format(config: RunConfig, out: str) -> str:
    if config.format is not None:
        if config.format not in FORMATS:
            raise RunConfigError(f"--format {config.format}: allowed {', '.join(FORMATS)}")
        return config.format
    return "table" if out == "-" else _SUFFIX_FORMAT.get(Path(out).suffix.lower(), "csv")


# --- the low level ----------------------------------------------------------------------------

class _Feed:
    """One low-level operator of one link and its spool writer, with buffered partial rows."""

    def __init__(self, plan, spool_root, summary: QuerySummary):
        from highlevel.spool import SpoolWriter
        from lowlevel.operator import LowLevelOperator

        self.op = LowLevelOperator(plan)
        self.writer = SpoolWriter(spool_root, plan.query, plan.link, fsync=False)
        self.summary = summary
        self.buffer: list = []
        self.buffered = 0

    def add(self, parts) -> None:
        for b in parts:
            if b.num_rows:
                self.buffer.append(b)
                self.buffered += b.num_rows

    def write(self, punctuation: int | None) -> None:
        if not self.buffer and punctuation is None:
            return
        self.writer.write(self.buffer, punctuation)
        self.summary.partial_rows += self.buffered
        self.summary.spool_files += 1
        self.buffer, self.buffered = [], 0

    def process(self, batch) -> None:
        self.add(self.op.process(batch))
        if self.buffered >= SPOOL_FLUSH_ROWS:
            self.write(None)

    def punctuate(self, p: int) -> None:
        rows, out = self.op.punctuate(p)
        self.add(rows)
        if out is not None:
            self.write(out)

    def finish(self) -> None:
        # the operator's final punctuation is the end of its last pane; the input is over,
        # though, so the link punctuates "nothing follows": a sliding window that reaches
        # past the last pane closes too (the reference evaluator outputs it)
        rows, _ = self.op.finish()
        self.add(rows)
        self.write(END_OF_INPUT)


def align_down(t: int, step: int) -> int:
    return t - t % step if step > 0 else t


def run_link(name: str, path: str, feeds: list[_Feed], config: RunConfig) -> LinkSummary:
    """Read one capture through the feeds of its link; punctuation from the data clock."""
    from capture.reader import open_capture

    summary = LinkSummary(name, str(path))
    slides = [f.op.plan.window.slide_ns for f in feeds if f.op.plan.window is not None]
    step = min(slides) if slides else 0
    every = max(1, int(config.punctuate_every_ns))
    last_p: int | None = None
    due: int | None = None
    seen: int | None = None      # the largest capture time so far (records may be disordered)
    with open_capture(path, link=name, batch_size=config.batch_size) as reader:
        for batch in reader:
            if len(batch) == 0:
                continue
            for f in feeds:
                f.process(batch)
            top = int(batch["timestamp"].max())
            seen = top if seen is None else max(seen, top)
            if due is None:
                due = seen + every
            if seen < due:
                continue
            due = seen + every
            p = align_down(seen, step)
            if last_p is not None and p <= last_p:
                continue
            last_p = p
            summary.punctuations += 1
            for f in feeds:
                f.punctuate(p)
        stats = reader.stats
    for f in feeds:
        f.finish()
    summary.packets, summary.bytes = stats.packets, stats.bytes
    summary.malformed, summary.reasons = stats.malformed, stats.reasons
    summary.problems = list(stats.problems)
    return summary


# --- output -------------------------------------------------------------------------------------

class CollectSink:
    """A stage sink keeping every micro-batch's closed rows in memory (results are small)."""

    def __init__(self):
        self.tables = []

    def write(self, batch_id: int, table) -> bool:
        if table.num_rows:
            self.tables.append(table)
        return True

    def close(self) -> None:
        pass

    def table(self, schema):
        import pyarrow as pa

        return pa.concat_tables(self.tables) if self.tables else schema.empty_table()


def display_table(table, qp):
    """The output table as written: `ipv4` columns as dotted-quad text."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    types = {o.name: o.type.lower() for o in qp.high.outputs}
    arrays = []
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if types.get(name) == "ipv4" and pa.types.is_integer(col.type):
            v = np.asarray(col.fill_null(0).cast(pa.uint64())).astype(np.uint64)
            octets = [pa.array(((v >> np.uint64(s)) & np.uint64(255)).astype(np.int64))
                      .cast(pa.string()) for s in (24, 16, 8, 0)]
            text = pc.binary_join_element_wise(*octets, ".")
            col = pa.array(text.to_numpy(zero_copy_only=False), pa.string(),
                           mask=np.asarray(col.is_null()))
        arrays.append(col)
    return pa.Table.from_arrays(arrays, names=table.column_names)


def write_output(table, fmt: str, out: str) -> None:
    """Write one query's result table to a file or stdout ("-") in `fmt`."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if fmt == "table":
        text = format_table(table)
        if out == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            Path(out).write_text(text)
        return
    binary = sys.stdout.buffer if out == "-" else None
    try:
        fh = binary or open(out, "wb")
    except OSError as exc:
        raise RunError(f"cannot write the output {out}: {exc}") from None
    try:
        if fmt == "csv":
            # pyarrow quotes every header name; SELECT names are plain identifiers
            fh.write((",".join(table.column_names) + "\n").encode())
            pacsv.write_csv(table, fh, pacsv.WriteOptions(include_header=False,
                                                          quoting_style=_csv_quoting(table)))
        elif fmt == "parquet":
            pq.write_table(table, fh)
        else:
            import json

            for row in table.to_pylist():
                fh.write(json.dumps(row, separators=(",", ":")).encode() + b"\n")
        fh.flush()
    finally:
        if binary is None:
            fh.close()


def _csv_quoting(table) -> str:
    """Quote strings only when some value needs it (addresses as text never do)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for col in table.columns:
        if pa.types.is_string(col.type) and len(col) and \
                pc.any(pc.match_substring_regex(col, r'[,"\r\n]')).as_py():
            return "needed"
    return "none"


def format_table(table) -> str:
    names = table.column_names
    rows = [["" if v is None else str(v) for v in r.values()] for r in table.to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    lines = ["  ".join(n.rjust(w) for n, w in zip(names, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(lines) + "\n"


# --- the run ------------------------------------------------------------------------------------

class _SessionStarter(threading.Thread):
    """Starts the Spark session while the low level runs (JVM start-up takes seconds)."""

    def __init__(self, master: str | None):
        super().__init__(name="oopscope-spark-start", daemon=True)
        self.master, self.session, self.error = master, None, None

    def run(self) -> None:
        try:
            from highlevel.session import get_session

            self.session = get_session(self.master)
        except BaseException as exc:  # handed to the main thread by result()
            self.error = exc

    def result(self):
        self.join()
        if self.error is not None:
            raise self.error
        return self.session


def run_offline(config: RunConfig) -> RunSummary:
    """Run the queries of `config.query_file` over its capture files; results to the outputs."""
    from highlevel.spec import from_high_level

    started = time.perf_counter()
    plan = load_plan(config)
    chosen = choose_queries(plan, config)
    for _, out in chosen:
        output_format(config, out)
        if out != "-" and not Path(out).resolve().parent.is_dir():
            raise RunConfigError(f"--output ...={out}: the directory {Path(out).parent} "
                                 f"does not exist")
    stdout = [qp.name for qp, out in chosen if out == "-"]
    if len(stdout) > 1 and config.format == "parquet":
        raise RunConfigError(f"parquet on stdout takes one query, not {', '.join(stdout)}: "
                             f"name files with --output QUERY=PATH")
    specs = {qp.name: from_high_level(qp.high) for qp, _ in chosen}   # fails early
    for name, path in config.links:
        if not Path(path).is_file():
            raise RunLinkError(f"--link {name}={path}: no such capture file")
    temps = []

    def workdir(given: str | None, prefix: str, option: str) -> Path:
        if given is not None:
            root = Path(given)
            for qp, _ in chosen:
                # a re-run over an old spool or checkpoint would count the old partial rows
                # again or skip new files of the same names: an offline run starts empty
                used = root / qp.name
                if used.is_dir() and any(used.iterdir()):
                    raise RunConfigError(f"{option} {root}: already holds data of query "
                                         f"{qp.name!r} from an earlier run; give an empty "
                                         f"directory")
            try:
                root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise RunConfigError(f"{option} {root}: cannot create it: {exc}") from None
            return root
        d = Path(tempfile.mkdtemp(prefix=prefix))
        temps.append(d)
        return d

    try:
        spool = workdir(config.spool, "oopscope-spool-", "--spool")
        checkpoint = workdir(config.checkpoint, "oopscope-ck-", "--checkpoint")
        starter = _SessionStarter(config.master)
        starter.start()
        queries = {qp.name: QuerySummary(qp.name, out, output_format(config, out))
                   for qp, out in chosen}
        feeds: dict[str, list[_Feed]] = {name: [] for name, _ in config.links}
        for qp, _ in chosen:
            for lp in qp.low:
                feeds[lp.link].append(_Feed(lp, spool, queries[qp.name]))
        summary = RunSummary(links={}, queries=queries)
        for name, path in config.links:
            summary.links[name] = run_link(name, path, feeds[name], config)
        for fs in feeds.values():
            for f in fs:
                c = f.op.counters
                s = f.summary
                s.evictions += c.get("evictions", 0)
                s.flushed += c.get("flushed", 0)
                s.forced_full_flushes += c.get("forced_full_flushes", 0)
                s.late_packets += c.get("late", 0)
        low_done = time.perf_counter()
        summary.lowlevel_seconds = low_done - started
        spark = starter.result()
        summary.spark_wait_seconds = time.perf_counter() - low_done
        high_started = time.perf_counter()
        summary.results = run_stages(chosen, specs, spool, checkpoint, spark, config, summary)
        summary.highlevel_seconds = time.perf_counter() - high_started
    finally:
        for d in temps:
            shutil.rmtree(d, ignore_errors=True)
    summary.total_seconds = time.perf_counter() - started
    return summary


def run_stages(chosen, specs, spool: Path, checkpoint: Path, spark, config: RunConfig,
               summary: RunSummary) -> dict:
    """Run the Spark stage of every chosen query over the spool, then write the outputs.

    The stages run side by side (one driver thread each): a stage's time is mostly small
    Spark jobs and driver round trips, which overlap well on one session."""
    from concurrent.futures import ThreadPoolExecutor

    from highlevel.stage import Stage

    def one(qp):
        spec = specs[qp.name]
        sink = CollectSink()
        stage = Stage(spec, spool, checkpoint / qp.name, [sink], spark=spark)
        stage.run_available()
        return display_table(sink.table(spec.output_arrow_schema()), qp), stage.state.late_rows

    if len(chosen) == 1 or config.parallel_stages <= 1:
        done = [one(qp) for qp, _ in chosen]
    else:
        with ThreadPoolExecutor(min(len(chosen), config.parallel_stages),
                                thread_name_prefix="oopscope-stage") as pool:
            done = list(pool.map(one, [qp for qp, _ in chosen]))
    results = {}
    to_stdout = sum(1 for _, out in chosen if out == "-")
    for (qp, out), (table, late_rows) in zip(chosen, done):
        q = summary.queries[qp.name]
        q.rows = table.num_rows
        q.late_partial_rows = late_rows
        if out == "-" and to_stdout > 1:
            # several results on stdout: say where each one starts
            sys.stdout.write(f"{'' if q.format == 'table' else '# '}query {qp.name}:\n")
        write_output(table, q.format, out)
        results[qp.name] = table
    return results
