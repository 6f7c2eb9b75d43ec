"""Semantic analysis of a parsed query file: names, types, windows, aggregates, DEFINEs, links.

`analyse_file` checks every query against the packet schema (`capture.schema`) and the queries
it reads, taking them in dependency order (`queries.query_graph`: a query may read one defined
later, as in GS-lite), after refusing GS-lite constructs it does not run (`queries.gslite`) and
substituting `#name` DEFINE references; it returns one `AnalysedQuery` per query, in that
order, with every column reference
resolved into an `expressions.Field` (name, type, physical columns). Everything wrong is a
`QueryError` at the offending node's line and column.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Set as AbstractSet

from capture.schema import BUILTIN, Schema
from common.datafiles import ANY_FILE, DataFiles
from common.errors import ConfigError
from queries import expressions as E
from queries import types as T
from queries.analysed import (
    AnalysedQuery,
    ColumnInfo,
    GroupInfo,
    ItemInfo,
    SourceInfo,
    WindowInfo,
)
from queries.constants import fold
from queries.definitions import (
    DEFINE_KEYS,
    FLOW_KEYS,
    check_define,
    define_refs,
    is_gslite_key,
    parse_param_value,
    row_order,
    substitute_refs,
)
from queries.errors import QueryError
from queries.filter_join import analyse_filter_join
from queries.grouping_sets import expand as expand_grouping
from queries.grouping_sets import item_name
from queries.gslite import check_constructs
from queries.hints import clock_example, did_you_mean
from queries.inference import conjoin, conjuncts, form_of, sides_of, type_of, unit_ns
from queries.naming import generated_name, unique_names
from queries.partial_functions import guard_partial_calls
from queries.printer import to_gsql
from queries.query_graph import dependency_order
from queries.sampling import analyse as analyse_sampling
from queries.sampling import analyse_selection, sampling_node, selection_sampling
from queries.scope import GroupedScope, Scope
from queries.tokens import MAX_NAME_LENGTH
from queries.typekinds import INTEGER, SIGNED, UNSIGNED
from queries.udf import FunctionLibrary, udaf_calls

log = logging.getLogger(__name__)

#: GS-lite's interface set that a source without interfaces reads
DEFAULT_INTERFACE_SET = "default"


def join_side(columns: dict[str, E.Expr], expr: E.Expr) -> str | None:
    """The join side (alias) whose columns alone `expr` reads; `columns`: the join's output
    columns, name -> expression over `alias.column` Fields. None: no such single side."""
    used = {f.name for f in expr.find_all(E.Field)}
    if not used or not used <= columns.keys():
        return None
    tables = {f.table for n in used for f in columns[n].find_all(E.Field)}
    return next(iter(tables)) if len(tables) == 1 else None


class Analyser:
    """Analyses the queries of a file in dependency order: a query after every query it reads
    (GS-lite's query sets may read queries defined later); file order otherwise."""

    def __init__(self, tree: E.QueryFile, links: list[str] | None = None,
                 params: dict[str, str] | None = None, overrides: dict[str, str] | None = None,
                 source: str | None = None, schema: Schema = BUILTIN,
                 functions: FunctionLibrary | None = None, files: DataFiles = ANY_FILE):
        self.tree = tree
        self.schema = schema
        #: user-defined functions: declarations and their Python module (`queries.udf`)
        self.functions = functions
        #: which files the queries may read (`common.datafiles`: the appliance's --data-dir)
        self.files = files
        self.links = list(links) if links else None
        self.params = dict(params or {})
        self.overrides = dict(overrides or {})
        self.source = source
        self.path = tree.path
        self.file_source = source   # `source` as given; queries of other files have their own
        self.done: dict[str, AnalysedQuery] = {}
        self.flow_mode = False   # the query being analysed runs the low level's flow table
        self.cur_refs: set[str] = set()        # DEFINE keys the query reads as GS-lite `#name`
        self.cur_warnings: list[str] = []      # warnings found before the AnalysedQuery exists
        self.cur_statement: E.Node = tree      # the statement being analysed (`first_use`)

    # --- errors ----------------------------------------------------------------------------
    def error(self, node, message: str) -> QueryError:
        return QueryError.at(node, message, source=self.source, path=self.path)

    def first_use(self, node: E.Column) -> E.Node:
        """The first column of the query being analysed that names `node`'s column (group
        items are analysed before the select list, yet a reader looks at SELECT first)."""
        same = [c for c in self.cur_statement.find_all(E.Column)
                if c.name == node.name and c.table == node.table and c.pos is not None]
        return min(same, key=lambda c: (c.pos.line, c.pos.col), default=node)

    def _error_in(self, q: E.Query, node, message: str) -> QueryError:
        self._locate_in(q)
        return self.error(node, message)

    def _locate_in(self, q: E.Query) -> None:
        """Errors about `q` name its own file and show its text (a tree of several files,
        `parser.parse_files`, keeps each query's path and each file's text)."""
        self.path = q.path or self.tree.path
        self.source = (self.tree.sources or {}).get(self.path, self.file_source)

    # --- file --------------------------------------------------------------------------------
    def run(self) -> list[AnalysedQuery]:
        queries = list(self.tree.queries or [])
        for override in self.overrides:
            if override == "query_name" and len(queries) > 1:
                raise ConfigError("--set query_name applies to a file of one query only")
            if override == "query_name":
                try:
                    check_define(override, self.overrides[override])
                except ConfigError as exc:
                    raise ConfigError(f"--set query_name: {str(exc).partition(': ')[2]}") \
                        from None
        names = [self._query_name(q, i) for i, q in enumerate(queries)]
        seen: dict[str, E.Query] = {}
        for q, name in zip(queries, names):
            self._locate_in(q)
            if len(name) > MAX_NAME_LENGTH:
                # a name from the file's name or --set: query names name directories
                raise self.error(q, f"the query's name has {len(name):,} characters, too many "
                                 f"(at most {MAX_NAME_LENGTH}): give it a shorter DEFINE "
                                 f"query_name")
            if name in seen:
                raise self.error(q, f"two queries are named {name!r}: give each its own "
                                    f"DEFINE query_name")
            seen[name] = q
        out = []
        for k in dependency_order(queries, names, self._error_in):
            aq = self.query(queries[k], names[k], set(names))
            self.done[names[k]] = aq
            out.append(aq)
        declared = {p for aq in out for p in aq.params}
        unknown = sorted(set(self.params) - declared)
        if unknown:
            raise ConfigError(f"unknown parameter(s) {', '.join(unknown)}: the file declares "
                              f"{', '.join(sorted(declared)) or 'none'}")
        return out

    def _query_name(self, q: E.Query, index: int) -> str:
        if "query_name" in self.overrides:
            return self.overrides["query_name"]
        defines = q.defines or {}
        for key, lit in defines.items():
            if key.lower() == "query_name":
                return str(getattr(lit, "value", lit))
        if q.name:
            return q.name
        stem = os.path.basename(self.path).split(".")[0] if self.path else "query"
        return stem or "query"

    # --- one query ---------------------------------------------------------------------------
    def query(self, q: E.Query, name: str, all_names: set[str]) -> AnalysedQuery:
        self._locate_in(q)
        # GS-lite's `#name` first: its value takes the reference's place for every later check
        self.cur_refs = define_refs(q.statement)
        if self.cur_refs:
            q = q.replace(statement=substitute_refs(q.statement))
        q = q.replace(statement=udaf_calls(q.statement, self.functions))
        check_constructs(q.statement, self.error, self.functions)
        self.cur_warnings = []
        aq = self._query(q, name, all_names)
        aq.warnings[:0] = self.cur_warnings
        return aq

    def _query(self, q: E.Query, name: str, all_names: set[str]) -> AnalysedQuery:
        defines = self._defines(q)
        self.flow_mode = any(k in defines for k in FLOW_KEYS)
        params = self._params(q)
        stmt = q.statement
        self.cur_statement = stmt
        self.cur_params = params
        self.cur_values = self._param_values(q, params)
        if isinstance(stmt, E.Merge):
            aq = self._merge(q, name, stmt, defines, params, all_names)
            aq.param_values = self.cur_values
            return aq
        sources = [self._source(s, all_names, name) for s in stmt.sources]
        if len(sources) > 2:
            raise self.error(stmt.sources[2], "at most two sources (a join) may follow FROM")
        if len(sources) == 2 and not stmt.join:
            raise self.error(stmt.sources[1], "two sources need a join type before FROM "
                             "(INNER_JOIN, LEFT_OUTER_JOIN, RIGHT_OUTER_JOIN, OUTER_JOIN)")
        if stmt.join and len(sources) != 2:
            raise self.error(stmt, f"{stmt.join} needs two sources")
        if len(sources) == 2 and sources[0].alias == sources[1].alias:
            raise self.error(stmt.sources[1], f"both sources are called {sources[0].alias!r}: "
                             f"give them different aliases")
        self._check_aliases(stmt)
        aq = AnalysedQuery(q, name, "select", defines, params, sources, join=stmt.join)
        scope = Scope(self, sources)
        if stmt.where is not None:
            aq.where = self.condition(scope.resolve(stmt.where, "WHERE"), stmt.where, "WHERE")
            if not stmt.join:
                self._no_display(aq.where, "WHERE")
        if stmt.join:
            self._join(aq, stmt, scope)
        else:
            for s in sources:
                if s.node.window is not None:
                    raise self.error(s.node.window, "a per-source window is only for band joins")
            self._select(aq, stmt, scope)
            guard_partial_calls(aq)
        aq.outputs = [ColumnInfo(i.name, i.type, i.form) for i in aq.items]
        aq.param_values = self.cur_values
        if self.flow_mode:
            self._check_flow_query(q, aq)
        self._check_row_order(q, aq)
        return aq

    def _check_row_order(self, q: E.Query, aq: AnalysedQuery) -> None:
        """DEFINE order_by names output columns (the rows of each window are written in
        that order: `highlevel.stage.Stage.row_order`)."""
        if "order_by" not in aq.defines:
            return
        names = [o.name for o in aq.outputs]
        for name, _ in row_order(aq.defines["order_by"]):
            if name not in names:
                lit = (q.defines or {}).get("order_by")
                where = lit if isinstance(lit, E.Node) else q
                raise self.error(where, f"DEFINE order_by: {name!r} is not an output column "
                                        f"(the query's are {', '.join(names)})")

    def _check_flow_query(self, q: E.Query, aq: AnalysedQuery) -> None:
        """Flow mode (DEFINE idle_timeout / flow_end) is for a tumbling aggregation of packets."""
        key = next(k for k in FLOW_KEYS if k in aq.defines)
        lit = (q.defines or {}).get(key)
        where = self._key_position(key, lit) if isinstance(lit, E.Node) else q
        if aq.kind != "aggregate" or aq.sources[0].kind != "link" or aq.temporal is None:
            raise self.error(where, f"DEFINE {key} makes a flow query: it needs an aggregation "
                             f"of packets grouped by a temporal bucket (e.g. GROUP BY time/60 "
                             f"AS tb, srcIP, destIP, srcPort, destPort, protocol)")

    def _text_position(self, pattern: str, fallback):
        """A node at the first match of `pattern`'s group 1 in the source (for entries that
        carry no position of their own), else `fallback`."""
        if self.source is None:
            return fallback
        m = re.search(pattern, self.source)
        if m is None:
            return fallback
        start = m.start(1)
        line = self.source.count("\n", 0, start) + 1
        col = start - (self.source.rfind("\n", 0, start) + 1) + 1
        return E.Literal(pos=E.Pos(line, col), value=m.group(1), kind="string")

    def _key_position(self, key: str, value_node):
        """The DEFINE key's own position (keys carry none: found left of the value)."""
        pos = getattr(value_node, "pos", None)
        if pos is None or self.source is None:
            return value_node
        lines = self.source.splitlines()
        if not 1 <= pos.line <= len(lines):
            return value_node
        col = lines[pos.line - 1].rfind(key, 0, pos.col - 1)
        return E.Literal(pos=E.Pos(pos.line, col + 1), value=key, kind="string") if col >= 0 \
            else value_node

    def _param_values(self, q: E.Query, params: dict[str, str]) -> dict[str, object]:
        values = {}
        defaults = q.args.get("param_defaults") or {}
        for pname, ptype in params.items():
            if pname in self.params:
                values[pname] = parse_param_value(pname, ptype, self.params[pname])
            elif pname in defaults:
                values[pname] = self._default_value(pname, ptype, defaults[pname])
        return values

    def _default_value(self, pname: str, ptype: str, lit):
        kind, value = getattr(lit, "kind", None), getattr(lit, "value", lit)
        ok: dict[str | None, AbstractSet[str]] = {"int": INTEGER - {"bool", "ipv4", "mac"} | {"mac"}, "float": {"float"},
              "string": {"string"}, "bool": {"bool"}, "ip": {"ipv4", "ip"}, "ipv6": {"ip"}}
        if ptype not in ok.get(kind, set()) and not (kind == "int" and ptype == "float"):
            raise self.error(lit, f"the default of parameter {pname} is not a {ptype}")
        if kind == "int" and ptype in UNSIGNED and value < 0:
            raise self.error(lit, f"the default of parameter {pname} is negative but its type "
                             f"is {ptype}")
        if kind == "int" and ptype in INTEGER:
            low, high = (-2**63, 2**63 - 1) if ptype in SIGNED else (0, 2**64 - 1)
            if not low <= value <= high:
                raise self.error(lit, f"the default of parameter {pname}, {value}, does not "
                                 f"fit in a {ptype} ({low} .. {high})")
        if kind == "ip" and ptype == "ip":
            return 0xFFFF_0000_0000 | value
        if ptype == "float":
            return float(value)
        return value

    def _defines(self, q: E.Query) -> dict[str, object]:
        defines: dict[str, object] = {}
        for key, lit in (q.defines or {}).items():
            value = getattr(lit, "value", lit)
            if key.lower() in self.cur_refs and key.lower() not in DEFINE_KEYS:
                continue    # a GS-lite defined literal, read as `#key`: no option of ours
            if is_gslite_key(key):
                where = self._key_position(key, lit if isinstance(lit, E.Node) else q)
                text = str(self.error(where, f"DEFINE key '{key}' is GS-lite's and has no "
                                             f"effect here"))
                self.cur_warnings.append(text)
                log.warning("%s", text)
                continue
            try:
                k, v = check_define(key, value)
            except ConfigError as exc:
                where = lit if isinstance(lit, E.Node) else q
                if str(exc).startswith("unknown DEFINE key"):
                    where = self._key_position(key, where)
                raise self.error(where, str(exc)) from None
            defines[k] = v
        for key, value in self.overrides.items():
            try:
                k, v = check_define(key, value)
            except ConfigError as exc:
                raise ConfigError(f"--set {key}={value}: {exc}") from None
            defines[k] = v
        return defines

    def _params(self, q: E.Query) -> dict[str, str]:
        params = {}
        for pname, ptype in (q.params or {}).items():
            tname = str(getattr(ptype, "value", ptype)).lower()
            if tname == "ulong":
                tname = "ullong"
            if tname not in T.ALL_TYPES:
                raise self.error(ptype if isinstance(ptype, E.Node) else
                                 self._text_position(rf"\b{pname}\s+({re.escape(str(ptype))})\b", q),
                                 f"parameter {pname}: unknown type {tname!r} (one of "
                                 f"{', '.join(T.ALL_TYPES)})")
            params[pname] = tname
            if pname in self.params:
                parse_param_value(pname, tname, self.params[pname])
        return params

    def param_value(self, name: str):
        """The run-time (or default) value of a declared parameter, or None when not given."""
        return self.cur_values.get(name)

    def constant_param(self, name: str):
        """A parameter's value as a number for constant folding (None for addresses and
        text, which fold to no number, and when it has no value)."""
        if self.cur_params.get(name) in ("ip", "ipv4", "mac", "string"):
            return None
        return self.cur_values.get(name)

    # --- sources -----------------------------------------------------------------------------
    def _source(self, s: E.Source, all_names: set[str], me: str) -> SourceInfo:
        if s.query is not None:
            qname = s.query
            if qname == me:
                raise self.error(s, f"query {qname!r} reads itself (a cycle)")
            if qname not in self.done:
                # queries are analysed in dependency order (`queries.query_graph`): one read
                # by this query and defined anywhere in the file set is done by now
                if qname in self.schema:
                    return self._packet_source(s, None, self.schema.canonical(qname))
                known = ", ".join(sorted(all_names - {me})) or "none"
                guess = did_you_mean(qname, [*(all_names - {me}), *self.schema.names()],
                                     repr)
                raise self.error(s, f"unknown query or protocol {qname!r}{guess} (queries: "
                                 f"{known}; protocols: {self._known_protocols()})")
            src = self.done[qname]
            if src.window is not None and src.window.kind == "rows":
                raise self.error(s, f"query {qname!r} has a ROWS window: its rows come in no "
                                 f"time order, so no query can read them")
            cols = {c.name: c for c in src.outputs}
            return SourceInfo(s, "query", s.alias or qname, query=qname, columns=cols)
        if s.protocol not in self.schema:
            guess = did_you_mean(s.protocol or "", self.schema.names())
            raise self.error(self._protocol_position(s), f"unknown protocol {s.protocol!r}"
                             f"{guess} (one of {self._known_protocols()})")
        return self._packet_source(s, s.links, self.schema.canonical(s.protocol or ""))

    def _known_protocols(self) -> str:
        names = [p for p in self.schema if self.schema.protocol(p).queryable
                 and self.schema.protocol(p).unreadable is None]
        files = f", from {', '.join(self.schema.files)}" if self.schema.files else \
            "; a schema file (--schema, else packet_schema.txt beside the query) adds more"
        return ", ".join(names) + files

    def _protocol_position(self, s: E.Source):
        """The protocol name of `link.PROTO` / `[a, b].PROTO` (sources carry the position of
        their first token only), else the source."""
        pos = getattr(s, "pos", None)
        if pos is None or self.source is None or not s.protocol:
            return s
        lines = self.source.split("\n")
        if not 1 <= pos.line <= len(lines):
            return s
        m = re.compile(rf"\.\s*({re.escape(s.protocol)})\b").search(lines[pos.line - 1],
                                                                   pos.col - 1)
        if m is None:
            return s
        return E.Literal(pos=E.Pos(pos.line, m.start(1) + 1), value=s.protocol, kind="string")

    def _packet_source(self, s: E.Source, links, proto: str) -> SourceInfo:
        if links is not None and list(links) == [DEFAULT_INTERFACE_SET] and \
                DEFAULT_INTERFACE_SET not in (self.links or ()):
            # GS-lite's `[default].IPV4` is its default interface set, what `FROM IPV4`
            # reads: here every link of the run (unless one is named `default`)
            links = None
        if links is None:
            links = tuple(self.links) if self.links else ("*",)
        else:
            links = tuple(links)
            if self.links is not None:
                for link in links:
                    if link not in self.links:
                        raise self.error(s, f"unknown link {link!r}: this run has "
                                         f"{', '.join(self.links)}")
            if len(set(links)) != len(links):
                raise self.error(s, "a link appears twice in the union")
        p = self.schema.protocol(proto)
        if p.unreadable is not None:
            raise self.error(s, f"protocol {p.name} ({p.where}) cannot be read by oopscope: "
                             f"{p.unreadable}")
        if not p.queryable:
            children = [c for c in self.schema if p.name in self.schema.protocol(c).all_parents]
            raise self.error(s, f"protocol {p.name} ({p.where}) reads nothing from the records "
                             f"(only get_system_time / get_schemaId): it is a base of record "
                             f"protocols; read one of those ({', '.join(children) or 'none'})")
        fields = self.schema.fields(proto)
        record = self.schema.record_format(proto)
        if record is not None and record.clocks:
            record = self._record_clock(record)
        cols = {}
        for f in fields.values():
            if record is None:
                form = T.BASE_TIME_FORMS.get(f.name)
            elif record.clocks:
                form = next((T.TimeForm(unit) for name, clock, unit in record.clocks
                             if name == f.name and clock == record.clock), None)
            else:
                # a record's clock windows like `time` (seconds) or `timestamp` (ns); its
                # other fields, increasing or not, make no windows (RecordFormat)
                form = T.TimeForm(record.clock_unit_ns) if f.name == record.clock else None
            cols[f.name] = ColumnInfo(f.name, f.type, form)
        info = SourceInfo(s, "link", s.alias or proto, links=links, protocol=proto, columns=cols,
                          union="meld" if len(links) > 1 or links == ("*",) else None,
                          fields=fields, record=record)
        return info

    def _record_clock(self, record):
        """A record format of several clocks (NETFLOW: `first`/`time` or `last`) set to the
        one the query's GROUP BY windows on: the clock of the first group item naming one of
        its window fields (`first` when none does). The other clock's fields are then plain
        values, so `GROUP BY first/60 AS tb, last` keeps `last` as a key."""
        from dataclasses import replace

        stmt = getattr(self, "cur_statement", None)
        chosen = {name: clock for name, clock, _ in record.clocks}
        for g in (getattr(stmt, "group_by", None) or []) if isinstance(stmt, E.Select) else []:
            this = getattr(g, "this", None)
            if not isinstance(this, E.Node):
                continue
            names = [c.name for c in this.find_all(E.Column) if c.name in chosen]
            if names:
                clock = chosen[names[0]]
                unit = next(u for n, c, u in record.clocks if n == clock)
                return replace(record, clock=clock, clock_unit_ns=unit)
        return record

    def _join_time_pair(self, aq: AnalysedQuery, first: GroupInfo, second: GroupInfo,
                        node) -> bool:
        """Whether two temporal group items are one on each side's time of the inner join
        the query reads (its groups close on the join's individual and joint punctuation,
        `highlevel.joint`); an outer join's unmatched rows have no time on the other side."""
        if len(aq.sources) != 1 or aq.sources[0].kind != "query":
            return False
        assert aq.sources[0].query is not None   # a query source names its query
        up = self.done[aq.sources[0].query]
        if up.kind != "join":
            return False
        columns = {i.name: i.expr for i in up.items}
        sides = [join_side(columns, gi.expr) for gi in (first, second)]
        if None in sides or sides[0] == sides[1]:
            return False
        if up.join != "INNER_JOIN":
            raise self.error(node, f"two temporal group items need an inner join: "
                             f"{up.join} of query {up.name!r} gives rows without a time on "
                             f"one side")
        return True

    # --- plain and aggregating SELECT --------------------------------------------------------
    def _select(self, aq: AnalysedQuery, stmt: E.Select, scope: Scope) -> None:
        expansion = expand_grouping(list(stmt.group_by or []), self.error)
        group_nodes: list = list(expansion.items)
        aggs = [a for it in stmt.items for a in it.find_all(E.Aggregate)]
        if stmt.having is not None:
            aggs += list(stmt.having.find_all(E.Aggregate))
        closing = [c for c in stmt.extra or [] if c.keyword == "CLOSING_WHEN"]
        aggs += [a for c in closing for a in c.this.find_all(E.Aggregate)]
        marker = sampling_node(stmt)
        sampling = marker is not None
        aggregating = bool(group_nodes or aggs)
        if marker is not None and not group_nodes and not aggs and \
                not selection_sampling(stmt, marker):
            raise self.error(marker, "a sampling query (super-aggregates, SUPERGROUP, "
                             "CLEANING_WHEN/BY) groups its rows: it needs GROUP BY with a "
                             "temporal item (a selection may call stateful functions in WHERE "
                             "only)")
        if not aggregating:
            if stmt.having is not None:
                raise self.error(stmt.having, "HAVING needs GROUP BY or aggregates")
            if closing:
                raise self.error(closing[0], "CLOSING_WHEN closes groups: it needs GROUP BY "
                                 "with a temporal group item (e.g. GROUP BY time/10 AS tb, "
                                 "srcIP)")
            aq.kind = "select"
            if sampling:
                analyse_selection(self, aq)
            names = unique_names([(it.alias, self._default_name(it.this, i))
                                  for i, it in enumerate(stmt.items)])
            for it, nm in zip(stmt.items, names):
                expr = scope.resolve(it.this, "SELECT")
                aq.items.append(ItemInfo(nm, expr, self.type_of(expr), self.form_of(expr), it))
            return
        aq.kind = "aggregate"
        # group items
        gnames = set()
        for g in group_nodes:
            expr = scope.resolve(g.this, "GROUP BY")
            self._no_display(expr, "GROUP BY")
            gname = g.alias or (g.this.name if isinstance(g.this, E.Column) else None)
            if gname is None:
                raise self.error(g, "a GROUP BY expression needs a name: write `expr AS name`")
            if gname in gnames:
                raise self.error(g, f"two group items are named {gname!r}")
            gnames.add(gname)
            gi = GroupInfo(gname, expr, self.type_of(expr), self.form_of(expr))
            aq.group.append(gi)
            if gi.form is not None:
                self._check_window_form(aq, g, gi)
                if aq.temporal is None:
                    aq.temporal = gi
                elif aq.temporal2 is None and self._join_time_pair(aq, aq.temporal, gi, g):
                    aq.temporal2 = gi
                else:
                    raise self.error(g, f"at most one temporal group item ({aq.temporal.name!r} "
                                     f"is one already; two only over an inner join's output, "
                                     f"one on each side's time)")
        if expansion.patterns is not None:
            self._grouping_patterns(aq, stmt, expansion)
        # window spec on aggregates
        specs = [(a, a.window) for a in aggs if a.window is not None]
        if specs:
            aq.window = self._window_spec(specs, scope)
            if aq.window.kind != "time" and aq.defines.get("late") == "correct":
                raise self.error(specs[0][1], f"late 'correct' is for time windows: a "
                                 f"{'landmark' if aq.window.kind == 'landmark' else 'ROWS'} "
                                 f"window drops (and counts) late data")
            if aq.temporal is not None:
                raise self.error(specs[0][1], f"a window spec and a temporal group item "
                                 f"({aq.temporal.name!r}) cannot be combined: use one")
        elif aq.temporal is None:
            for g in aq.group:
                unbound = [p for p in g.expr.find_all(E.Param) if p.name not in self.cur_values]
                if unbound and any(f.form is not None for f in g.expr.find_all(E.Field)):
                    raise self.error(unbound[0], f"parameter ${unbound[0].name} needs a value to "
                                     f"plan the window (give --param {unbound[0].name}=...)")
            for g, gi in zip(group_nodes, aq.group):
                base = _time_attribute(gi.expr)
                if base is not None:
                    raise self.error(g, f"GROUP BY {to_gsql(g.this)} makes no window: it reads "
                                     f"{base.name}, but only {base.name}/N, {base.name}*N and "
                                     f"{base.name}+N (N a positive integer constant) make a "
                                     f"temporal group item, which defines the windows; this "
                                     f"is an ordinary group key and the query has no window "
                                     f"({_window_example(base, gi.name)})")
            raise self.error(stmt, f"an aggregation needs a temporal group item (e.g. "
                             f"{clock_example(aq.sources)}) or a window spec (e.g. count(*) "
                             f"[RANGE 1 minute])")
        group = aq.group
        if aq.temporal2 is not None:
            # the output of the second temporal item is no time column for later readers:
            # its rows leave in the order of the first item's windows only
            group = [GroupInfo(g.name, g.expr, g.type, None) if g is aq.temporal2 else g
                     for g in aq.group]
        grouped = GroupedScope(self, scope, group)
        names = unique_names([(it.alias, self._default_name(it.this, i))
                              for i, it in enumerate(stmt.items)])
        for it, nm in zip(stmt.items, names):
            expr = grouped.resolve(it.this, "SELECT")
            aq.items.append(ItemInfo(nm, expr, self.type_of(expr), self.form_of(expr), it))
        if aq.window is not None and aq.window.kind == "rows":
            # a count window is identified by its index within its partition (0, 1, ...); it
            # has no time form: count windows close in no time order across partitions
            rw_name = unique_names([(None, "row_window")] + [(i.name, i.name) for i in aq.items])[0]
            aq.items.insert(0, ItemInfo(rw_name, E.Field(name=rw_name, type="llong"), "llong",
                                        None, aq.window.node))
            aq.window_end = rw_name
        elif aq.window is not None and aq.temporal is None:
            # the window's end is an output column so every row says which window it is
            # (in the unit of the window attribute, so a reader can window on it like on `time`)
            end_name = unique_names([(None, "window_end")] + [(i.name, i.name) for i in aq.items])[0]
            wf = aq.window.form
            aq.items.insert(0, ItemInfo(end_name, E.Field(name=end_name, type="llong", form=wf),
                                        "llong", wf, aq.window.node))
            aq.window_end = end_name
        if stmt.having is not None:
            aliases = {i.name: i.expr for i in aq.items}
            expr = grouped.resolve(stmt.having, "HAVING", aliases)
            aq.having = self.condition(expr, stmt.having, "HAVING")
        if sampling:
            analyse_sampling(self, aq, stmt, grouped)
        elif closing:
            self._closing(aq, closing, grouped)
        if aq.closing is None:
            for e in [i.expr for i in aq.items] + [aq.having]:
                for a in (e.find_all(E.Aggregate) if e is not None else ()):
                    if a.udaf is not None and getattr(a.udaf, "running", False):
                        raise self.error(a, f"{a.name} is a RUNNING aggregate (declared at "
                                         f"{a.udaf.declared_at}): its state spans windows, "
                                         f"so it needs a running aggregation (CLOSING_WHEN)")

    def _closing(self, aq: AnalysedQuery, clauses: list[E.ExtraClause],
                 grouped: GroupedScope) -> None:
        """GS-lite's running aggregation: `CLOSING_WHEN cond` carries each group (its keys
        without the temporal item) from one window to the next until `cond` holds at the end
        of a window. Windows are those of the temporal group item, so a window spec, a second
        temporal item, grouping patterns and flow queries are refused."""
        clause = clauses[0]
        if len(clauses) > 1:
            raise self.error(clauses[1], "one CLOSING_WHEN per query (join conditions with AND)")
        if aq.temporal is None:
            raise self.error(clause, "CLOSING_WHEN carries groups from one time window to the "
                             "next: it needs a temporal group item (e.g. GROUP BY time/10 AS "
                             "tb, srcIP), not a window spec")
        if aq.temporal2 is not None:
            raise self.error(clause, "CLOSING_WHEN over a join's output with two temporal "
                             "group items is not supported")
        if aq.patterns is not None:
            raise self.error(clause, "CLOSING_WHEN with CUBE, ROLLUP or GROUPING_SETS is not "
                             "supported")
        if self.flow_mode:
            raise self.error(clause, "CLOSING_WHEN is not for flow queries (DEFINE "
                             "idle_timeout / flow_end): a flow ends by its own rules")
        if aq.defines.get("late") == "correct":
            raise self.error(clause, "late 'correct' is not for running aggregation "
                             "(CLOSING_WHEN): a group's later windows depend on the closed "
                             "ones, so late data is dropped and counted")
        aliases = {i.name: i.expr for i in aq.items}
        expr = grouped.resolve(clause.this, "CLOSING_WHEN", aliases)
        aq.closing = self.condition(expr, clause.this, "CLOSING_WHEN")
        for e in [i.expr for i in aq.items] + [aq.having, aq.closing]:
            for a in (e.find_all(E.Aggregate) if e is not None else ()):
                if a.name in ("MIN", "MAX", "FIRST", "LAST") and \
                        self.type_of(a.arg) == "string":
                    raise self.error(a, f"{a.name} over strings in a running aggregation "
                                     f"(CLOSING_WHEN) is not supported: a carried group's "
                                     f"empty window has no value for it (GS-lite has none "
                                     f"either)")

    def _grouping_patterns(self, aq: AnalysedQuery, stmt: E.Select, expansion) -> None:
        """CUBE / ROLLUP / GROUPING_SETS (queries.grouping_sets): the temporal item stands in
        every pattern (it makes the windows), so it must be a plain entry."""
        assert expansion.patterns is not None
        for entry in stmt.group_by:
            if not isinstance(entry, E.GroupingPattern):
                continue
            for s in entry.sets:
                for g in s:
                    gi = next(x for x in aq.group if x.name == item_name(g))
                    if gi.form is not None:
                        raise self.error(g, f"the temporal group item {gi.name!r} cannot stand "
                                         f"in {entry.kind}: every grouping pattern needs the "
                                         f"window, so write it as a plain GROUP BY item")
                    if gi.type == "string":
                        raise self.error(g, f"a string group-by variable ({gi.name!r}) in "
                                         f"{entry.kind} is not supported yet")
        if self.flow_mode:
            first = next(e for e in stmt.group_by if isinstance(e, E.GroupingPattern))
            raise self.error(first, f"{first.kind} is not for flow queries (DEFINE "
                             f"idle_timeout / flow_end): a flow has one key")
        aq.patterns = expansion.patterns

    def _check_window_form(self, aq: AnalysedQuery, g: E.GroupItem, gi: GroupInfo) -> None:
        """A temporal group item's windows must be computable in 64 bits; one written in a
        form docs/gsql.md does not give for windows (a subtraction: `time - 60`) is planned as
        what it is, with a warning saying which windows it makes."""
        assert gi.form is not None
        text = to_gsql(g.this)
        why = gi.form.overflow()
        if why is not None:
            raise self.error(g, f"GROUP BY {text}: {why}")
        base = _time_attribute(gi.expr)
        # `time - 60` for one-minute windows: no division, so the windows stay those of the
        # attribute itself (after a division, `time/60*60 - 5` is a deliberate shift)
        if base is None or base.form is None or base.form.pane_ns != gi.form.pane_ns \
                or not self._subtracts(gi.expr):
            return
        window = T.duration_text(gi.form.pane_ns)
        self.warn(aq, g, f"GROUP BY {text} AS {gi.name} makes windows of {window}, one per "
                  f"value of {base.name}: subtracting a constant shifts the values, it does not "
                  f"lengthen the windows. The window-making forms are {base.name}/N (windows N "
                  f"times as long), {base.name}*N and {base.name}+N "
                  f"({_window_example(base, gi.name)})")

    def _subtracts(self, expr: E.Expr) -> bool:
        """Whether a temporal expression subtracts a constant (`- c`, or `+ c` with c < 0)."""
        for node in expr.find_all(E.Binary):
            if node.op not in ("+", "-"):
                continue
            for const in (node.right, node.left) if node.op == "+" else (node.right,):
                value = fold(const, self.constant_param)
                if value is not None and (value[1] > 0 if node.op == "-" else value[1] < 0):
                    return True
        return False

    def warn(self, aq: AnalysedQuery, node, message: str) -> None:
        """A warning located like an error: logged (stderr of `explain` and `run`) and kept
        in `aq.warnings`."""
        text = str(self.error(node, message))
        aq.warnings.append(text)
        log.warning("%s", text)

    def _no_display(self, expr: E.Expr, clause: str) -> None:
        for bad in expr.find_all(E.Func):
            why = T.high_level_only(bad)
            if why:
                raise self.error(bad, f"{bad.name} {why}: use it in SELECT or HAVING, "
                                      f"not in {clause}")

    def _default_name(self, expr: E.Node, index: int) -> str:
        return generated_name(expr, index)

    def _check_aliases(self, stmt) -> None:
        seen = set()
        for it in stmt.items:
            if it.alias:
                if it.alias in seen:
                    raise self.error(it, f"two output columns are named {it.alias!r}")
                seen.add(it.alias)

    def _window_spec(self, specs, scope: Scope) -> WindowInfo:
        first_agg, w = specs[0]
        for _agg, other in specs[1:]:
            if other != w:
                raise self.error(other, "every aggregate of a query must have the same window")
        if w.rows is not None or w.partition_by:
            return self._rows_spec(w, scope)
        if w.all:
            return self._landmark_spec(w, scope)
        if w.range is None:
            raise self.error(w, "a window spec needs RANGE")
        r = self._duration(w.range)
        s = self._duration(w.slide) if w.slide is not None else r
        if s > r:
            raise self.error(w, f"window SLIDE ({w.slide.value} {w.slide.unit}) can't exceed "
                             f"RANGE ({w.range.value} {w.range.unit})")
        wa = w.wa or _default_wa(scope.sources)
        col, form, unit = self._window_attribute(w, scope)
        if r % unit or s % unit:
            raise self.error(w, f"RANGE and SLIDE must be whole multiples of {wa}'s unit "
                             f"({unit} ns)")
        return WindowInfo(r, s, wa, form, w, unit, col)

    def _window_attribute(self, w: E.WindowSpec, scope: Scope) -> tuple[E.Field, T.TimeForm, int]:
        wa = w.wa or _default_wa(scope.sources)
        col = scope.resolve(E.Column(pos=w.pos, name=wa), "window")
        form = self.form_of(col)
        if form is None:
            raise self.error(w, f"window attribute {wa!r} is not increasing")
        unit = unit_ns(form)
        if unit is None or not isinstance(col, E.Field):
            raise self.error(w, f"window attribute {wa!r} is not a plain count of time units "
                             f"(use time, timestamp, timestamp_ms or a column like time/60)")
        return col, form, unit

    def _landmark_spec(self, w: E.WindowSpec, scope: Scope) -> WindowInfo:
        """`[RANGE ALL, SLIDE s, WA a]`: windows from the origin to every slide end;
        `[RANGE ALL]`: one window over the whole input, closed at its end."""
        col, form, unit = self._window_attribute(w, scope)
        s = 0
        if w.slide is not None:
            s = self._duration(w.slide)
            if s % unit:
                raise self.error(w.slide, f"SLIDE must be a whole multiple of {col.name}'s "
                                 f"unit ({unit} ns)")
        return WindowInfo(0, s, col.name, form, w, unit, col, kind="landmark")

    def _rows_spec(self, w: E.WindowSpec, scope: Scope) -> WindowInfo:
        """`[ROWS n]`, `[PARTITION BY a, b ROWS n]`: tumbling windows of n packets."""
        if w.rows is None:
            raise self.error(w, "PARTITION BY needs a row count: [PARTITION BY a ROWS n]")
        for item, name in ((w.range, "RANGE"), (w.all, "RANGE ALL"), (w.slide, "SLIDE"),
                           (w.wa, "WA")):
            if item:
                raise self.error(w, f"a ROWS window takes no {name}: it counts packets in "
                                 f"timestamp order ([ROWS n] or [PARTITION BY a ROWS n])")
        if w.rows <= 0:
            raise self.error(w, f"ROWS {w.rows}: a count window needs at least one row")
        if w.rows > T.LLONG_MAX:
            raise self.error(w, f"ROWS {w.rows} does not fit in 64 bits (at most "
                             f"{T.LLONG_MAX} rows)")
        if any(s.kind != "link" for s in scope.sources):
            raise self.error(w, "a ROWS window counts packets: FROM must read links, not a "
                             "query (a query's rows carry no packet order)")
        partition = []
        seen = set()
        for c in w.partition_by or []:
            f = scope.resolve(c, "PARTITION BY")
            if f.name in seen:
                raise self.error(c, f"{f.name!r} appears twice in PARTITION BY")
            seen.add(f.name)
            partition.append(f)
        return WindowInfo(0, 0, None, None, w, kind="rows", rows=int(w.rows),
                          partition=tuple(partition))

    def _duration(self, d: E.Duration) -> int:
        if d.unit.lower() not in E.Duration.UNIT_NS:
            raise self.error(d, f"unknown time unit {d.unit!r} (seconds, minutes, hours, ms)")
        if d.value * E.Duration.UNIT_NS[d.unit.lower()] > T.MAX_WINDOW_NS:
            raise self.error(d, f"a window of {d.value} {d.unit} is too long (at most "
                             f"{T.MAX_WINDOW_NS // T.NS_PER_DAY // 365} years: window "
                             f"arithmetic is in 64-bit nanoseconds)")
        ns = d.ns
        if ns <= 0:
            raise self.error(d, "a window length must be positive")
        return ns

    # --- joins -------------------------------------------------------------------------------
    def _join(self, aq: AnalysedQuery, stmt: E.Select, scope: Scope) -> None:
        aq.kind = "join"
        if stmt.filter_join is not None:
            analyse_filter_join(self, aq, stmt, scope)
            return
        aggs = [a for it in stmt.items for a in it.find_all(E.Aggregate)]
        if stmt.group_by or stmt.having is not None or aggs:
            where = aggs[0] if aggs else stmt.group_by[0] if stmt.group_by else stmt.having
            raise self.error(where, "a join cannot aggregate: aggregate its result in a further "
                             "query that reads it")
        if stmt.where is None:
            raise self.error(stmt.sources[1], "a join needs a WHERE with the join condition")
        windows = [s.node.window for s in aq.sources]
        if any(w is not None for w in windows):
            if any(w is None for w in windows):
                raise self.error(stmt, "a band join needs a window on both sources")
            for s in aq.sources:
                w = s.node.window
                if w.range is None or w.slide is not None or w.all or w.rows is not None:
                    raise self.error(w, "a band join source takes [RANGE r, WA attr]")
                wa_name = w.wa or _default_wa([s])
                wa = scope.resolve(E.Column(pos=w.pos, name=wa_name, table=s.alias), "window")
                assert isinstance(wa, E.Field)   # a column resolves to a Field
                form = self.form_of(wa)
                if form is None:
                    raise self.error(w, f"window attribute {wa_name!r} is not increasing")
                s.window_ns = self._duration(w.range)
                s.wa = wa
                unit = unit_ns(form)
                if unit is None or s.window_ns % unit:
                    raise self.error(w, f"RANGE must be a whole multiple of the unit of "
                                     f"{wa_name}")
        self._join_condition(aq, stmt)
        names = unique_names([(it.alias, self._default_name(it.this, i))
                              for i, it in enumerate(stmt.items)])
        for it, nm in zip(stmt.items, names):
            expr = scope.resolve(it.this, "SELECT")
            aq.items.append(ItemInfo(nm, expr, self.type_of(expr), self.form_of(expr), it))

    def _join_condition(self, aq: AnalysedQuery, stmt: E.Select) -> None:
        left, right = aq.sources[0].alias, aq.sources[1].alias
        residual = []
        for c in conjuncts(aq.where):
            if isinstance(c, E.Binary) and c.op == "=":
                sides = (sides_of(c.left), sides_of(c.right))
                pair = None
                if sides == ({left}, {right}):
                    pair = (c.left, c.right)
                elif sides == ({right}, {left}):
                    pair = (c.right, c.left)
                if pair is not None:
                    lf, rf = self.form_of(pair[0]), self.form_of(pair[1])
                    if lf is not None and rf is not None and aq.join_temporal is None:
                        aq.join_temporal = pair
                    else:
                        aq.join_keys.append(pair)
                    continue
            residual.append(c)
        aq.join_residual = conjoin(residual)
        banded = aq.sources[0].window_ns is not None
        if aq.join_temporal is None and not banded:
            raise self.error(stmt.where, "a join needs an equality between the two temporal "
                             "attributes (e.g. a.tb = b.tb) or a window on each source "
                             "(FROM s1 [RANGE 3 minutes] a, s2 [RANGE 2 minutes] b)")
        if aq.join_temporal is not None and banded:
            raise self.error(stmt.where, "a band join (per-source windows) cannot also equate "
                             "the temporal attributes: use one")
        if aq.join_temporal is not None:
            lf, rf = (self.form_of(e) for e in aq.join_temporal)
            assert lf is not None and rf is not None   # join_temporal pairs two temporal values
            if lf.pane_ns != rf.pane_ns:
                raise self.error(stmt.where, "the joined temporal attributes have different "
                                 "window sizes")

    def _merge(self, q, name, stmt: E.Merge, defines, params, all_names) -> AnalysedQuery:
        sources = [self._source(s, all_names, name) for s in stmt.sources]
        if len(sources) < 2:
            raise self.error(stmt, "MERGE needs at least two sources")
        if len(stmt.fields) != len(sources):
            raise self.error(stmt, f"MERGE names {len(stmt.fields)} fields for "
                             f"{len(sources)} sources")
        first = sources[0]
        for s in sources[1:]:
            if [(c.name, c.type) for c in s.plain_columns()] != \
                    [(c.name, c.type) for c in first.plain_columns()]:
                raise self.error(s.node, "MERGE sources must have the same columns")
        scope = Scope(self, sources)
        fields = []
        for f in stmt.fields:
            expr = scope.resolve(f, "MERGE")
            if not isinstance(expr, E.Field) or self.form_of(expr) is None:
                raise self.error(f, "MERGE fields must be increasing (temporal) columns")
            fields.append(expr)
        aq = AnalysedQuery(q, name, "merge", defines, params, sources, merge_fields=tuple(fields))
        if stmt.slack is not None:
            self._slack(aq, stmt.slack)
        for c in first.plain_columns():
            aq.items.append(ItemInfo(c.name, E.Field(name=c.name, type=c.type), c.type, c.form, stmt))
        aq.outputs = [ColumnInfo(i.name, i.type, i.form) for i in aq.items]
        return aq

    def _slack(self, aq: AnalysedQuery, slack: E.Node) -> None:
        """GS-lite's `MERGE ... SLACK n`: n must be a non-negative integer constant. GS-lite
        derives the merge's tolerance of disorder from its inputs and its runtime does not
        apply the declared slack; here the Merge waits for every input's punctuation, so it is
        exact under any disorder and the slack changes nothing: said in a warning."""
        expr = Scope(self, []).resolve(slack.this, "SLACK")
        value = fold(expr, self.constant_param)
        if value is None or self.type_of(expr) not in INTEGER or value[1] < 0:
            raise self.error(slack.this, "MERGE ... SLACK takes a non-negative integer "
                             "constant")
        self.warn(aq, slack, "MERGE ... SLACK has no effect here: the Merge releases a row "
                             "once every input's punctuation has passed it, which is exact "
                             "under any disorder (GS-lite's runtime does not apply the slack "
                             "either)")

    # --- types and forms ---------------------------------------------------------------------
    def condition(self, expr: E.Expr, node, where: str) -> E.Expr:
        t = self.type_of(expr)
        if t not in INTEGER:
            raise self.error(node, f"{where} must be a condition, not a {t} value")
        return expr

    def type_of(self, expr: E.Expr) -> str:
        return type_of(expr, self.cur_params)

    def form_of(self, expr: E.Expr) -> T.TimeForm | None:
        return form_of(expr, self.param_value)




def _default_wa(sources: list[SourceInfo]) -> str:
    """The window attribute a window spec without WA uses: `time` for packets, the clock
    field of a record protocol (RecordFormat.clock)."""
    for s in sources:
        if s.record is not None and s.record.clock is not None:
            return s.record.clock
    return "time"


def _time_attribute(expr: E.Expr) -> E.Field | None:
    """The first increasing (temporal) column `expr` reads, or None."""
    for f in expr.find_all(E.Field):
        if f.form is not None:
            return f
    return None


def _window_example(base: E.Field, name: str) -> str:
    """`e.g. GROUP BY time/60 AS tb for windows of 1 minute` for a temporal column."""
    assert base.form is not None
    return (f"e.g. GROUP BY {base.name}/60 AS {name} for windows of "
            f"{T.duration_text(base.form.pane_ns * 60)}")


def analyse_file(tree: E.QueryFile, links: list[str] | None = None,
                 params: dict[str, str] | None = None, overrides: dict[str, str] | None = None,
                 source: str | None = None, schema: Schema = BUILTIN,
                 functions: FunctionLibrary | None = None,
                 files: DataFiles = ANY_FILE) -> list[AnalysedQuery]:
    """Analyse every query of a parsed file against `schema` (the built-in packet protocols
    and those of schema files, `queries.schemafile`; see the module docstring), with the
    user-defined functions of `functions` (`queries.udf`), reading the files its queries
    name as `files` allows (`common.datafiles`)."""
    return Analyser(tree, links, params, overrides, source, schema, functions, files).run()
