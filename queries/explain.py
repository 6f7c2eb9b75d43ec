"""Readable text of a query plan: what runs in the low level per link and what in the high level.

`explain_file(path_or_text, links, params, overrides)` parses, plans and formats a query file;
`format_plan(file_plan)` formats an existing `FilePlan`. Expressions print with
`queries.printer.to_gsql`, the one GSQL printer, so they read as they would be written.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from capture.schema import BUILTIN, SYSTEM_TIME, RecordFormat, Schema
from common.units import NS_PER_S as _NS
from queries import expressions as E
from queries.plan import (
    ROW_WINDOW_INDEX,
    FilePlan,
    HighLevelPlan,
    LowLevelPlan,
    QueryPlan,
    WindowPlan,
)
from queries.printer import to_gsql


def format_expr(expr: E.Node | None) -> str:
    """An expression as GSQL text, `-` for none: `queries.printer.to_gsql`, the one expression
    printer (resolved Fields print as their (qualified) names)."""
    return "-" if expr is None else to_gsql(expr)


def _seconds(ns: int) -> str:
    if ns % _NS == 0:
        s = ns // _NS
        if s % 3600 == 0:
            return f"{s // 3600}h"
        if s % 60 == 0:
            return f"{s // 60}min"
        return f"{s}s"
    if ns % 1_000_000 == 0:
        return f"{ns // 1_000_000}ms"
    return f"{ns}ns"


def format_window(w: WindowPlan | None) -> list[str]:
    if w is None:
        return ["window: none (no aggregation)"]
    base = "timestamp" if w.expr is None else format_expr(w.expr)
    if w.expr is None:
        pane = f"(timestamp + {w.offset_ns}) // {w.pane_ns}" if w.offset_ns else \
            f"timestamp // {w.pane_ns}"
    else:
        pane = base
    col = f"{w.column} = pane * {w.scale} + {w.shift}" if (w.scale, w.shift) != (1, 0) else \
        f"{w.column} = pane"
    if w.landmark == "slide":
        return [f"window: landmark RANGE ALL SLIDE {_seconds(w.slide_ns)} as tumbling panes of "
                f"{_seconds(w.pane_ns)}; pane id = {pane}",
                f"        window w = every pane <= w (from the origin, time 0), ends at "
                f"(w+1)*{_seconds(w.slide_ns)}; {w.column} = w * {w.scale} + {w.shift} "
                f"(window end)"]
    if w.landmark == "end":
        return [f"window: landmark RANGE ALL (one window, closed at end of input) as tumbling "
                f"panes of {_seconds(w.pane_ns)}; pane id = {pane}",
                f"        {w.column} = last pane + 1 (every row counted has a smaller "
                f"window attribute)"]
    if w.expr is not None and getattr(w.expr, "name", None) == ROW_WINDOW_INDEX:
        return [f"window: the count window numbered by the high level; {w.column} = {pane}"]
    if not w.sliding:
        return [f"window: tumbling {_seconds(w.range_ns)}; pane id = {pane}; {col}"]
    per_win, per_slide = w.range_ns // w.pane_ns, w.slide_ns // w.pane_ns
    return [f"window: sliding RANGE {_seconds(w.range_ns)} SLIDE {_seconds(w.slide_ns)} as "
            f"panes of {_seconds(w.pane_ns)} (gcd); pane id = {pane}",
            f"        window w = panes [(w+1)*{per_slide} - {per_win}, (w+1)*{per_slide}): "
            f"{per_win} panes per window, a window every {per_slide} pane(s); "
            f"{w.column} = w * {w.scale} + {w.shift} (window end)"]


def format_low(p: LowLevelPlan) -> list[str]:
    where = "query " + p.link if p.source_kind == "query" else f"link {p.link}"
    head = f"low level, {where}" + (f", side {p.side}" if p.side else "")
    if p.source_kind == "query":
        head += " (run by the high level over the input query's rows)"
    out = [head + ":"]
    if p.protocol:
        out.append(f"  protocol: {p.protocol}")
    if p.record is not None:
        out += ["  " + line for line in format_record(p.record)]
    out.append(f"  where: {format_expr(p.predicate)}")
    if p.window is not None or p.subaggs:
        out += ["  " + line for line in format_window(p.window)]
        out.append("  keys: " + (", ".join(f"{k.name} {k.type} = {format_expr(k.expr)}"
                                         for k in p.keys) or "-"))
        if p.patterns:
            out += ["  " + line for line in format_patterns(p)]
        out.append("  sub-aggregates: " + ", ".join(
            f"{s.name} = {s.kind}({format_expr(s.arg) if s.arg is not None else '*'}) "
            f"[{s.dtype}{' x ' + str(p.distinct_registers) if s.kind == 'distinct' else ''}]"
            for s in p.subaggs))
        if p.source_kind == "link":
            # an adaptive table's rule: lowlevel.sizing (flow tables stay fixed)
            size = (f"{p.slots} slots at start, adaptive (between windows: a power of two "
                    f">= 2 x the groups per window, up to {p.max_slots})"
                    if p.max_slots and p.flow is None else f"{p.slots} slots")
            out.append(f"  hash table: {size}; flush {p.flush} "
                       f"(i = {p.slow_flush}, m = {p.max_disorder})")
    if p.projections:
        out.append("  project: " + ", ".join(f"{k.name} {k.type} = {format_expr(k.expr)}"
                                             for k in p.projections))
    return out


def format_patterns(p: LowLevelPlan) -> list[str]:
    """CUBE / ROLLUP / GROUPING_SETS: the grouping patterns, one kernel pass each."""
    from queries.grouping_sets import format_pattern

    hidden = p.keys[-1].name
    names = list(dict.fromkeys(n for present in p.pattern_names for n in present))
    out = [f"grouping patterns: {len(p.patterns)} (each packet updates one group per "
           f"pattern; absent variables hold their type's default; {hidden} = the pattern's "
           f"number, a hidden key)"]
    for number, (present, exprs) in enumerate(zip(p.pattern_names, p.patterns)):
        absent = ", ".join(f"{k.name} = {format_expr(e)}" for k, e in zip(p.keys, exprs)
                           if k.name != hidden and k.name not in present)
        out.append(f"  {hidden} {number}: {format_pattern(present, names)}"
                   + (f"; {absent}" if absent else ""))
    return out


def format_record(r: RecordFormat) -> list[str]:
    """How a record protocol's rows are read and timed (capture.schema.RecordFormat)."""
    read = ", ".join(f"{f.name} {f.type} = {f.accessor}" for f in r.fields)
    lines = [f"records: {r.kind} ({read})"]
    if r.clock is None:
        lines.append("clock: none (no increasing field): each record is timed by the wall "
                     "clock when it is read, and no field makes windows")
        return lines
    unit = "seconds" if r.clock_unit_ns == _NS else f"units of {r.clock_unit_ns} ns"
    clock = next(f for f in r.fields if f.name == r.clock)
    if clock.accessor == SYSTEM_TIME:
        lines.append(f"clock: {r.clock} = the wall clock when a record is read "
                     f"({SYSTEM_TIME}), in {unit} (timestamp: the same time in ns); timer "
                     f"punctuation as for a live interface")
    else:
        lines.append(f"clock: {r.clock}, the record's increasing field read by "
                     f"{clock.accessor}, in {unit}; timestamp = {r.clock} * {r.clock_unit_ns}")
    return lines


def format_sampling(h: HighLevelPlan) -> list[str]:
    """A sampling query's high level (`queries.plan.SamplingPlan`)."""
    sp = h.sampling
    assert sp is not None
    w = sp.window

    def agg(prefix, table):
        return ", ".join(f"{prefix}{k} = {kind}({arg or ''})" for k, (kind, arg) in
                         enumerate(table)) or "-"

    keys = ", ".join(f"{k.name} = {format_expr(k.expr)}" for k in sp.keys) or "-"
    over_rows = h.input_kind == "queries"
    order = "the projected values" if over_rows else "(timestamp, link, projected values)"
    project = ["  project (over the input's rows): " + ", ".join(
        f"{k.name} {k.type.lower()} = {format_expr(k.expr)}" for k in sp.columns)] \
        if over_rows else []
    if w is None:
        return project + [
                f"  sampling selection: one sampling state for the whole stream; rows in order "
                f"of {order} once punctuation passes them",
                "  where (stateful conjuncts, every one evaluated per row): "
                + " AND ".join(format_expr(c) for c in sp.where),
                "  output: " + ", ".join(f"{o.name} {o.type.lower()} = {format_expr(o.expr)}"
                                         for o in sp.outputs)]
    out = project + [
           f"  sampling, sequential per window of {_seconds(w.pane_ns)} ({w.column}): the "
           f"window's rows in order of {order} once punctuation >= its end",
           f"  group keys: {keys}; supergroup: " + (", ".join(sp.supergroup) or
                                                     "one per window"),
           "  where (stateful conjuncts, every one evaluated per row): "
           + (" AND ".join(format_expr(c) for c in sp.where) or "-"),
           f"  aggregates: {agg('__a', sp.aggregates)}; super-aggregates: "
           f"{agg('__s', sp.super_aggregates)}, __cd = live groups",
           f"  cleaning when (after each admitted row): {format_expr(sp.cleaning_when)}",
           f"  cleaning by (each group of the supergroup, in creation order): "
           f"{format_expr(sp.cleaning_by)}",
           f"  having (window end, after final_init): {format_expr(sp.having)}",
           "  output: " + ", ".join(f"{o.name} {o.type.lower()} = {format_expr(o.expr)}"
                                    for o in sp.outputs)]
    return out


def format_high(h: HighLevelPlan) -> list[str]:
    out = ["high level:"]
    union = f"; union: {h.union}" if h.union else ""
    out.append(f"  inputs: {h.input_kind} {', '.join(h.inputs)}{union}")
    if h.predicate is not None:
        out.append(f"  where: {format_expr(h.predicate)}")
    if h.sampling is not None:
        return out + format_sampling(h)
    if h.kind == "aggregate":
        out.append("  combine partials: " + ", ".join(
            f"{s.name} = {s.kind}({s.name})" + (" by time" if s.kind in ("first", "last") else "")
            + (" per register" if s.sub_kind == "distinct" else "") for s in h.superaggs))
        w = h.window
        if h.rows is not None:
            r = h.rows
            part = ", ".join(format_expr(k.expr) for k in r.partition) or "none (one partition)"
            out.append(f"  count windows: ROWS {r.rows} (tumbling: n consecutive packets per "
                       f"window), partition by {part}")
            out.append(f"    packet order: timestamp, link position ({', '.join(h.inputs)}), then "
                       f"{', '.join(r.order) or '-'}; {r.column} = packet number in its "
                       f"partition // {r.rows}")
            out.append("    close: a full window once the punctuation passes its last packet "
                       "(the rows before P are a complete prefix); the last, partial window at "
                       "end of input")
            out.append("    runs in the high level: a count window follows the union's time "
                       "order, which no link's low level sees (the low level only selects and "
                       "projects)")
        elif w is not None and w.landmark == "slide":
            out.append("  landmark windows: one running state per group (cumulative panes); "
                       "window w output once punctuation >= its end and a row of pane >= w has "
                       "arrived (rows up to the window of the input's last packet)")
        elif w is not None and w.landmark == "end":
            out.append("  landmark window: closed panes folded into one running state per "
                       "group; the one window output at end of input")
        elif w is not None and w.sliding:
            out.append(f"  assemble windows: {w.range_ns // w.pane_ns} panes per window, every "
                       f"{w.slide_ns // w.pane_ns} pane(s) (Paned-WID); close at punctuation "
                       f">= window end")
        elif w is not None and h.window2 is not None:
            w2 = h.window2
            out.append(f"  close groups: ({w.column}, {w2.column}) ends e1 on the first "
                       f"time, e2 = end of pane ({w2.column} - {w2.shift}) / {w2.scale} of "
                       f"{_seconds(w2.pane_ns)} on the other side's time; closed once the "
                       f"join's individual punctuation i1 >= e1 or i2 >= e2, or its joint "
                       f"punctuation (j1, j2) >= (e1, e2)")
        elif w is not None and h.closing is not None:
            out.append("  running aggregation: a group (its keys without the window) stays open "
                       "from window to window; at each window's end it is output (HAVING) and "
                       "closed if CLOSING_WHEN holds, else carried into the next window with "
                       "empty states (" + ", ".join(f"{c} = {v if v is not None else 'none'}"
                                                   for c, v in h.empty) + "); windows up to the "
                       "last one with a row, closed at punctuation >= window end")
        elif w is not None:
            out.append("  close windows: at punctuation >= window end")
        out.append("  finalise: " + ", ".join(f"{f.name} = {format_expr(f.expr)} [{f.text}]"
                                              for f in h.finals))
        out.append(f"  having: {format_expr(h.having)}")
        if h.closing is not None:
            out.append(f"  closing when: {format_expr(h.closing)}")
    if h.join is not None:
        j = h.join
        def side(s):
            text = f"{s.alias} <- " + (f"query {s.input}" if s.kind == "query"
                                       else f"links {', '.join(s.links)}")
            return text + (f" where {format_expr(s.predicate)}" if s.predicate is not None else "")

        out.append(f"  join: {j.type} (OA-Join) {side(j.left)}, {side(j.right)}")
        if j.type == "semi":
            out.append(f"    FILTER_JOIN: each {j.left.alias} row with a match in "
                       f"{j.right.alias} passes once (exact; GS-lite approximates with Bloom "
                       f"filters or a hash table)")
        if j.temporal is not None:
            out.append(f"    tumbling window: {format_expr(j.temporal[0])} = "
                       f"{format_expr(j.temporal[1])}")
        else:
            lw, rw = format_expr(j.left.wa), format_expr(j.right.wa)
            out.append(f"    band: {lw} - {j.right.range} <= {rw} < {lw} + {j.left.range}")
        out.append("    keys: " + (", ".join(f"{format_expr(a)} = {format_expr(b)}"
                                             for a, b in j.keys) or "-"))
        out.append(f"    residual: {format_expr(j.residual)}")
    if h.kind == "merge":
        out.append("  merge on: " + " : ".join(format_expr(f) for f in h.merge_fields))
    out.append(f"  late tuples: {h.late}" + (
        f" (late partition per link; correction rows: the delta of late data for a closed "
        f"window, marked {h.correction} = 1)" if getattr(h, "correction", None) else ""))
    out.append("  output: " + ", ".join(
        f"{c.name} {c.type}" + (" (temporal)" if c.temporal is not None else "")
        + ("" if isinstance(c.expr, E.Field) and c.expr.name == c.name and not c.expr.table
           else " = 0, 1 on correction rows" if c.name == getattr(h, "correction", None)
           else f" = {format_expr(c.expr)}")
        for c in h.outputs))
    return out


def format_query(q: QueryPlan) -> str:
    lines = [f"query {q.name} ({q.kind})"]
    if q.title:
        lines.append(f"  title: {q.title}")
    if q.comment:
        lines.append(f"  comment: {q.comment}")
    shown = {k: v for k, v in q.defines.items() if k not in ("title", "comment", "query_name")}
    if shown:
        lines.append("  defines: " + ", ".join(f"{k}={v}" for k, v in sorted(shown.items())))
    if q.params:
        lines.append("  params: " + ", ".join(f"{k}={v}" for k, v in sorted(q.params.items())))
    if q.read_by:
        lines.append(f"  read by: {', '.join(q.read_by)}")
    for p in q.low:
        lines += ["  " + line for line in format_low(p)]
    for p in q.high.row_plans:
        lines += ["  " + line for line in format_low(p)]
    lines += ["  " + line for line in format_high(q.high)]
    return "\n".join(lines)


def format_plan(fp: FilePlan, schema: Schema | None = None) -> str:
    head = f"file {fp.path or '<query>'}; links: {', '.join(fp.links)}"
    if schema is not None and schema.files:
        head += f"\nschema files: {', '.join(schema.files)}"
    return "\n\n".join([head] + [format_query(q) for q in fp.queries]) + "\n"


def mentioned_links(tree: E.QueryFile) -> list[str]:
    """Link names a file's FROM clauses name, in order of appearance. GS-lite's `[default]`
    names no link: it is the set of every link of the run, what `FROM IPV4` reads."""
    from queries.analysis import DEFAULT_INTERFACE_SET

    seen: list[str] = []
    for src in tree.find_all(E.Source):
        if list(src.links or ()) == [DEFAULT_INTERFACE_SET]:
            continue
        for link in src.links or ():
            if link not in seen:
                seen.append(link)
    return seen


def rename_links(tree: E.QueryFile, mapping: dict[str, str]) -> E.QueryFile:
    """`tree` reading link `mapping[name]` wherever its FROM clauses name link `name` (a
    shipped query's `main` read from a server's link of another name)."""
    def rename(node: E.Node) -> E.Node:
        if isinstance(node, E.Source) and node.links:
            return node.replace(links=[mapping.get(n, n) for n in node.links])
        return node

    return cast(E.QueryFile, tree.transform(rename))


def mapped_text(text: str, mapping: dict[str, str], path: str | None = None) -> str:
    """Query text reading the links of `mapping` under their new names (`rename_links`),
    printed back as GSQL; `text` itself when there is nothing to rename."""
    if not mapping:
        return text
    from queries.parser import parse

    return to_gsql(rename_links(parse(text, path=path), mapping))


LIBRARY = Path(__file__).resolve().parent / "library"


def find_query_file(name: str) -> Path:
    """A query file path, or a shipped query named without path (`q8_1` -> library/q8_1.gsql)."""
    p = Path(name)
    if p.exists():
        return p
    for candidate in (LIBRARY / name, LIBRARY / f"{name}.gsql"):
        if candidate.is_file():
            return candidate
    return p


def explain_text(text: str, path: str | None = None, links: list[str] | None = None,
                 params: dict[str, str] | None = None,
                 overrides: dict[str, str] | None = None, schema: Schema = BUILTIN) -> str:
    """Parse, plan and format query text against `schema` (QueryError / ConfigError when it
    is wrong)."""
    from queries.parser import parse
    from queries.planner import plan_file

    tree = parse(text, path=path)
    if not links:
        links = mentioned_links(tree) or ["main"]
    return format_plan(plan_file(tree, links, params, overrides, source=text, schema=schema),
                       schema)
