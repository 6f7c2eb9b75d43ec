"""What one run is asked to do (`RunConfig`), what it did (`RunSummary`), and which queries it
runs: the plan of the query file for the run's links, and the queries chosen from it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from common.units import NS_PER_S as NS
from tools.errors import RunConfigError, RunLinkError
from tools.results.formats import output_format as _format_of

if TYPE_CHECKING:
    from queries.plan import QueryPlan

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class RunConfig:
    """One run. `links`: (name, capture path) pairs; `interfaces`: (name, interface) pairs
    (one kind or the other); `outputs`: (query, path or "-") pairs, empty for every query that
    no other query reads, to stdout."""

    query_file: str                      # the first (or only) file of the query set
    links: tuple[tuple[str, str], ...] = ()
    outputs: tuple[tuple[str, str], ...] = ()
    format: str | None = None            # None: from the output path's suffix, else table
    overrides: tuple[tuple[str, str], ...] = ()
    params: tuple[tuple[str, str], ...] = ()
    master: str | None = None
    spool: str | None = None             # None: a temporary directory removed at the end
    checkpoint: str | None = None        # None: a temporary directory removed at the end
    punctuate_every_ns: int = NS         # timer period (data time at full speed, else wall)
    batch_size: int = 65536
    parallel_stages: int = 4             # Spark stages of different queries run side by side
    interfaces: tuple[tuple[str, str], ...] = ()
    speed: float | None = None           # None: as fast as possible; N: N x real time
    duration_ns: int | None = None       # stop after this much of the run's clock
    lull_slack_ns: int = NS              # a silent link punctuates clock - slack
    progress: bool | None = None         # None: when stderr is a terminal
    capture_options: tuple[tuple[str, object], ...] = ()   # capture.live.LiveCapture options
    extra_sinks: tuple = ()              # (query, Sink) pairs beside the outputs (NetFlow ...)
    # every output row also stays in memory, as RunSummary.results (the Python API and the
    # tests read them); the CLI keeps none: rows are written as windows close, and a live run
    # would otherwise grow without bound
    keep_results: bool = True
    # each interface captured by this many processes in one PACKET_FANOUT group, melded as
    # sub-links (`tools.pipeline.fanout`)
    fanout: int = 1
    # GS-lite schema files (`--schema`): record protocols a link may carry instead of packets
    schema_files: tuple[str, ...] = ()
    # user-defined functions (`--functions`, `--udf`): declarations in GS-lite's
    # external_fcns.def syntax and the Python module implementing them (queries.udf)
    function_files: tuple[str, ...] = ()
    udf_module: str | None = None
    # the field separator of CSV record links (None: detected from the first line)
    csv_separator: str | None = None
    #: links given by --netflow-in: read as NETFLOW records only
    netflow_links: tuple[str, ...] = ()
    #: the exporters' active timeout of NETFLOW links (capture.flowreader)
    flow_timeout_ns: int = 30 * 60 * NS
    #: the operator's active timeout of some exporters ((address, ns)), before their own
    flow_exporter_timeouts: tuple[tuple[str, int], ...] = ()
    #: where NETFLOW links keep their templates when not in a resumable run's checkpoint
    #: (an agent's: beside its heartbeat in the spool); None: there
    flow_state_dir: str | None = None
    #: their idle timeout (None: unknown), the lag of a NETFLOW link's punctuation on `last`
    flow_idle_ns: int | None = None
    # the other files of the query set (`oopscope run a.gsql b.gsql`): one set, as GS-lite's
    # translate_fta takes several files
    more_query_files: tuple[str, ...] = ()

    @property
    def query_files(self) -> tuple[str, ...]:
        return (self.query_file, *self.more_query_files)

    @property
    def link_names(self) -> list[str]:
        return [n for n, _ in self.links] + [n for n, _ in self.interfaces]

    @property
    def live(self) -> bool:
        return bool(self.interfaces)

    @property
    def streaming(self) -> bool:
        """Stages run continuously (paced and live runs, and NETFLOW collectors) rather than
        after the low level."""
        return self.live or self.speed is not None or self.collects

    @property
    def collects(self) -> bool:
        """Whether a link is a NETFLOW collector (`--netflow-in NAME=HOST:PORT`): a stream
        of the wall clock, whose windows are written as they close."""
        from capture.flowreader import collector_address

        return any(name in self.netflow_links and collector_address(path) is not None
                   for name, path in self.links)


@dataclass
class LinkSummary:
    name: str
    path: str                           # the capture file, or "interface IFACE"
    packets: int = 0
    bytes: int = 0
    malformed: int = 0
    reasons: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    punctuations: int = 0
    ring_drops: int = 0
    kernel_drops: int = 0
    #: "records" for a record link (its rows are records of a schema-file protocol)
    kind: str = "packets"
    #: a record link's malformed records by reason, with line numbers (`RecordStats.describe`)
    malformed_detail: str = ""
    #: what a link's reader adds to its summary (a NETFLOW link: datagrams, sequence gaps)
    notes: str = ""
    #: a NETFLOW collector's: wall ns when the low level was done with its last record
    last_record_ns: int | None = None


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
    final_rows: int = 0             # partial rows marked final (`lowlevel.finality`)
    late_packets: int = 0           # dropped (late 'drop')
    late_partial_rows: int = 0
    late_corrected: int = 0         # late 'correct': late packets aggregated apart ...
    correction_rows: int = 0        # ... and the correction rows written for them
    # a division or modulo by zero gives 0 (docs/gsql.md): the packets (low level) and the
    # rows written (high level) whose values met one
    zero_divisor_packets: int = 0
    zero_divisor_rows: int = 0
    #: the hash tables' slots at the end (over the query's links) and the times an adaptive
    #: one was re-sized (`lowlevel.sizing`)
    slots: int = 0
    resizes: int = 0

    @property
    def partials_per_row(self) -> float:
        """Partial rows per result row: how much the low level reduced (1.0: a group left
        its table once per window)."""
        return self.partial_rows / self.rows if self.rows else 0.0


@dataclass
class RunSummary:
    links: dict[str, LinkSummary]
    queries: dict[str, QuerySummary]
    results: dict = field(default_factory=dict, repr=False)   # query -> pyarrow.Table
    ended: str = "end of input"         # or "duration", "stopped", "capture failed"
    clock_origin: tuple | None = None   # paced runs: (epoch s, capture ns) of the clock's start
    lowlevel_seconds: float = 0.0
    spark_wait_seconds: float = 0.0     # waiting for the session after the low level ended
    highlevel_seconds: float = 0.0
    total_seconds: float = 0.0
    # a run resumed over a kept spool and checkpoint (`tools.pipeline.resume`): the packets per
    # link read past (already in the spool), and a live run's gap (from, to) ns
    resumed: bool = False
    skipped: dict = field(default_factory=dict)
    gap: tuple | None = None

    @property
    def problems(self) -> list[str]:
        return [f"link {s.name}: {p}" for s in self.links.values() for p in s.problems]

    def format(self) -> str:
        """The human summary printed on stderr at the end of a run."""
        lines = []
        from capture.schema import BENIGN_REASONS, REASONS

        benign = {REASONS[c] for c in BENIGN_REASONS}
        for s in self.links.values():
            if s.kind == "records":
                lines.append(f"link {s.name}: {s.packets} records, {s.bytes} bytes, "
                             f"{s.punctuations} punctuations [{s.path}]")
                if s.malformed:
                    lines.append(f"link {s.name}: {s.malformed} malformed records skipped: "
                                 f"{s.malformed_detail}")
                lines += [f"link {s.name}: problem: {p}" for p in s.problems]
                if s.notes:
                    lines.append(f"link {s.name}: {s.notes}")
                if s.last_record_ns is not None:
                    lines.append(f"link {s.name}: the low level was done with the last record "
                                 f"at {s.last_record_ns / 1e9:.6f} (epoch s)")
                continue
            bad = ", ".join(f"{k} {v}" for k, v in sorted(s.reasons.items())
                            if k not in benign) or "none"
            lines.append(f"link {s.name}: {s.packets} packets, {s.bytes} bytes, "
                         f"{s.malformed} malformed ({bad}), {s.ring_drops} ring drops, "
                         f"{s.kernel_drops} kernel drops, {s.punctuations} punctuations "
                         f"[{s.path}]")
            lines += [f"link {s.name}: problem: {p}" for p in s.problems]
        for q in self.queries.values():
            lines.append(f"query {q.name}: {q.rows} rows -> {q.output} ({q.format}); "
                         f"{q.partial_rows} partial rows in {q.spool_files} spool files, "
                         f"{q.evictions} evictions, {q.flushed} flushed, "
                         f"{q.forced_full_flushes} forced full flushes, "
                         f"{q.late_packets} late packets, {q.late_partial_rows} late partials"
                         + (f"; table {q.slots:,} slots ({q.resizes} resizes), "
                            f"{q.partials_per_row:.2f} partial rows per result row"
                            if q.slots else "")
                         + (f", {q.final_rows / q.partial_rows:.0%} of them final"
                            if q.final_rows and q.partial_rows else "")
                         + (f", {q.late_corrected} late packets corrected in "
                            f"{q.correction_rows} correction rows"
                            if q.late_corrected or q.correction_rows else "")
                         + (f", {q.zero_divisor_packets} packets and {q.zero_divisor_rows} "
                            f"rows met a zero divisor (the quotient is 0)"
                            if q.zero_divisor_packets or q.zero_divisor_rows else ""))
        if self.resumed:
            skipped = ", ".join(f"link {n} {v:,}" for n, v in self.skipped.items() if v)
            lines.append("run resumed from its spool and checkpoint"
                         + (f"; packets already in the spool, read past: {skipped}"
                            if skipped else ""))
        if self.gap is not None:
            from tools.pipeline.windows import when

            def since(ns: int) -> str:
                return "the start" if ns <= -(1 << 63) else when(ns)
            lines.append(f"gap: the windows from {since(self.gap[0])} to {since(self.gap[1])} "
                         f"were not written (the run was down; live packets are not replayed)")
        lines.append(f"run ended: {self.ended}; time: low level {self.lowlevel_seconds:.2f} s, "
                     f"waiting for Spark {self.spark_wait_seconds:.2f} s, Spark stage "
                     f"{self.highlevel_seconds:.2f} s, total {self.total_seconds:.2f} s")
        return "\n".join(lines)


# --- planning and query choice -------------------------------------------------------------------

def load_plan(config: RunConfig):
    """Parse and plan the query files over the configured links (one clear error otherwise)."""
    tree, text, paths = read_query_set(config.query_files)
    names = config.link_names
    option = {n: "--interface" if i >= len(config.links) else "--link"
              for i, n in enumerate(names)}
    return plan_tree(tree, text, _label(paths), names, dict(config.params),
                     dict(config.overrides), option=option,
                     schema=schema_of(paths, config.schema_files),
                     functions=functions_of(config.function_files, config.udf_module))


def read_query_set(names) -> tuple:
    """The query files named (paths, or shipped queries named without a path: `q8_1`) as
    one query set: (its tree, the text of a single file for error snippets else None, the
    paths). Several files are one set, as GS-lite's translate_fta takes them: a query may
    read a query of another file, and query names are unique across them."""
    from queries.errors import QueryError
    from queries.explain import find_query_file
    from queries.parser import parse, parse_files

    paths = [find_query_file(str(n)) for n in names]
    if len(paths) > 1:
        return parse_files(paths), None, paths
    (path,) = paths
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QueryError("no such query file (nor a shipped query of that name)",
                         path=str(names[0])) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise QueryError(f"cannot read the query file: {exc}", path=str(path)) from None
    return parse(text, path=str(path)), text, paths


def schema_of(paths, schema_files):
    """The schema of a run: the built-in protocols, the --schema files and the
    packet_schema.txt beside each query file (`queries.schemafile.schema_for`)."""
    from queries.schemafile import schema_for

    return schema_for(list(paths), schema_files)


def functions_of(function_files, udf_module):
    """The user-defined functions of a run (`queries.udf.FunctionLibrary`), None when no
    --functions or --udf was given."""
    if not function_files and udf_module is None:
        return None
    from queries.udf import FunctionLibrary

    return FunctionLibrary.load(tuple(function_files), udf_module)


def _label(paths) -> str:
    """The query set's name in messages: its file, or its files joined."""
    return " + ".join(str(p) for p in paths)


def plan_text(text: str, path: str, links: list[str], params: dict, overrides: dict, *,
              option: dict | None = None, subset: bool = False, schema=None, files=None,
              link_map: dict | None = None):
    """Parse and plan query text over `links` (`plan_tree`)."""
    from queries.parser import parse

    return plan_tree(parse(text, path=path), text, path, links, params, overrides,
                     option=option, subset=subset, schema=schema, files=files,
                     link_map=link_map)


def plan_tree(tree, text: str | None, path: str, links: list[str], params: dict,
              overrides: dict, *, option: dict | None = None, subset: bool = False,
              schema=None, functions=None, files=None, link_map: dict | None = None):
    """Plan a parsed query set over `links`. The links the FROM clauses name must
    be among them; with `subset` (a server's links, of which a query reads some) the set is
    planned over the links it names only, else every given link must be one of the set's.
    `option`: the command-line option that gave each link (for the message); `files`: which
    files the queries may read (`common.datafiles.DataFiles`; None: any its user names);
    `link_map`: the query's link names -> those it reads instead (`submit --link-map`)."""
    from queries.explain import mentioned_links, rename_links
    from queries.planner import plan_file

    name = " + ".join(Path(p).name for p in path.split(" + "))
    if link_map:
        stray = [k for k in link_map if k not in mentioned_links(tree)]
        if stray:
            raise RunLinkError(f"{name}: --link-map {stray[0]}=...: the query reads no link "
                               f"{stray[0]}; its links are "
                               f"{', '.join(mentioned_links(tree)) or 'none'}")
        tree = rename_links(tree, link_map)
    wanted = mentioned_links(tree)
    missing = [n for n in wanted if n not in links]
    unknown = [] if subset else [n for n in links if wanted and n not in wanted]
    unmapped = [(k, v) for k, v in (link_map or {}).items() if v in missing]
    if unmapped:
        given, to = unmapped[0]
        raise RunLinkError(f"{name}: --link-map {given}={to}: no link {to} "
                           f"{'on this server' if subset else 'given'}; the links are "
                           f"{', '.join(links) or 'none'}")
    if wanted and missing and subset:
        hint = ""
        if len(links) == 1 and len(missing) == 1:
            hint = (f" (submit --link-map {missing[0]}={links[0]} reads {links[0]} where the "
                    f"query says {missing[0]})")
        elif links:
            hint = (f" (submit --link-map {missing[0]}=LINK reads one of them where the query "
                    f"says {missing[0]})")
        raise RunLinkError(f"{name}: no link {', '.join(missing)} on this server; its links "
                           f"are {', '.join(links) or 'none'}{hint}")
    if wanted and (unknown or missing):
        opt = (option or {}).get(unknown[0] if unknown else "", "--link")
        what = (f"{opt} {', '.join(unknown)} is not a link of the query file"
                if unknown else f"no source given for link {', '.join(missing)}")
        target = missing[0] if missing else wanted[0]
        raise RunLinkError(f"{name}: {what}; its links are {', '.join(wanted)} "
                           f"(write {_link_syntax(tree, target, schema)})")
    if subset and wanted:
        links = [n for n in links if n in wanted]
    extra = {} if files is None else {"files": files}
    if schema is None:
        return plan_file(tree, links, params, overrides, source=text, functions=functions,
                         **extra)
    return plan_file(tree, links, params, overrides, source=text, schema=schema,
                     functions=functions, **extra)


def _link_syntax(tree, link: str, schema) -> str:
    """How the command line gives `link`: a records file when the queries read a record
    protocol on it, else a capture file or an interface."""
    from capture.schema import BUILTIN
    from queries import expressions as E

    for src in tree.find_all(E.Source):
        if link not in (src.links or ()) or not src.protocol:
            continue
        try:
            fmt = (schema or BUILTIN).record_format(src.protocol)
        except KeyError:
            continue
        if fmt is not None:
            kind = "GDAT" if fmt.kind.lower() == "gdat" else "CSV"
            return (f"--link {link}=RECORDS.{kind.lower()}: a {kind} file of "
                    f"{fmt.protocol} records, - or a FIFO")
    return f"--link {link}=PCAP or --interface {link}=IFACE"


def choose_queries(plan, config: RunConfig) -> list[tuple[QueryPlan, str]]:
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
    return chosen


def output_format(config: RunConfig, out: str) -> str:
    return _format_of(config.format, out)

