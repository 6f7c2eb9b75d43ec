"""The analysed query: what the analyser makes of one query (its sources, groups, items, window,
sampling clauses and output columns), and the analyser as its clause checkers see it.

`queries.analysis.Analyser` fills an `AnalysedQuery` per query; the checkers of parts of a
query (`queries.scope`, `queries.sampling`, `queries.filter_join`) are handed the analyser as
a `QueryAnalyser` and fill their part of the `AnalysedQuery`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from capture.schema import Field, RecordFormat
from common.datafiles import DataFiles
from queries import expressions as E
from queries import types as T
from queries.errors import QueryError
from queries.udf import FunctionLibrary


class QueryAnalyser(Protocol):
    """What the clause checkers use of the analyser (`queries.analysis.Analyser`): its errors
    at a node of the query, the types and time forms of expressions, the query's parameters."""

    @property
    def functions(self) -> FunctionLibrary | None:
        """User-defined functions: declarations and their Python module (`queries.udf`)."""

    @property
    def files(self) -> DataFiles:
        """Which files the query may read (prefix and regular expression files)."""

    @property
    def flow_mode(self) -> bool:
        """Whether the query being analysed runs the low level's flow table."""

    @property
    def cur_params(self) -> Mapping[str, str]:
        """The parameters the query declares: name -> type."""

    def error(self, node, message: str) -> QueryError: ...

    @property
    def cur_statement(self) -> E.Node:
        """The statement being analysed."""

    def first_use(self, node: E.Column) -> E.Node:
        """The first place in the query's text that names `node`'s column (an error about
        the column points there, not where the analysis met it)."""

    def type_of(self, expr: E.Expr) -> str: ...

    def form_of(self, expr: E.Expr) -> T.TimeForm | None: ...

    def condition(self, expr: E.Expr, node, where: str) -> E.Expr: ...

    def constant_param(self, name: str): ...


@dataclass
class SamplingInfo:
    """The sampling clauses of an analysed query (resolved expressions)."""

    supergroup: tuple[str, ...]          # names of GROUP BY items; () = one per window
    where_stateful: tuple[E.Expr, ...]   # WHERE's conjuncts that call stateful functions
    cleaning_when: E.Expr | None
    cleaning_by: E.Expr | None


@dataclass(frozen=True)
class ColumnInfo:
    """An output column of a query: name, type and, when increasing, its time form."""

    name: str
    type: str
    form: T.TimeForm | None = None


@dataclass
class SourceInfo:
    """A resolved FROM item."""

    node: E.Source
    kind: str                         # 'link' (packets) or 'query'
    alias: str
    links: tuple[str, ...] = ()       # packet sources: the links read
    protocol: str | None = None
    query: str | None = None          # query sources: the query read
    union: str | None = None          # 'meld' | 'merge' when several links
    columns: dict[str, ColumnInfo] = field(default_factory=dict)
    window_ns: int | None = None      # band joins: the per-source RANGE
    wa: E.Field | None = None         # band joins: the windowing attribute of this side
    #: link sources: the protocol's schema fields (physical columns, access functions)
    fields: dict[str, Field] = field(default_factory=dict)
    #: link sources of a schema file's record protocol: how its records are read
    record: RecordFormat | None = None

    def plain_columns(self) -> list[ColumnInfo]:
        """The columns, each once: without Gigascope's names of packet fields (`sourceIP`
        for `srcIP`, capture.schema.GIGASCOPE_ALIASES), and without the payloads
        (`TCP_data`: captured only for a query that names it, never as part of a whole row)."""
        return [c for c in self.columns.values()
                if self.kind != "link" or (self.fields[c.name].alias_of is None
                                           and self.fields[c.name].columns != ("payload",))]


@dataclass
class GroupInfo:
    name: str
    expr: E.Expr                      # over input rows
    type: str
    form: T.TimeForm | None


@dataclass
class ItemInfo:
    name: str
    expr: E.Expr                      # group keys as key Fields, aggregates with resolved args
    type: str
    form: T.TimeForm | None
    node: E.Node


@dataclass
class WindowInfo:
    """A window from an aggregate's spec (lengths in ns).

    kind "time": `[RANGE r, SLIDE s, WA a]`; "landmark": `[RANGE ALL, SLIDE s, WA a]` (range_ns
    = 0: every window starts at the origin; a result every s) or `[RANGE ALL]` (slide_ns = 0:
    one window, closed at end of input); "rows": `[PARTITION BY a, b ROWS n]` (tumbling count
    windows of n packets in time order per partition; no time attribute).
    """

    range_ns: int
    slide_ns: int
    wa: str | None
    form: T.TimeForm | None
    node: E.Node
    unit_ns: int = 1                  # nanoseconds per unit of the window attribute
    field: E.Field | None = None      # the window attribute, resolved
    kind: str = "time"                # time | landmark | rows
    rows: int | None = None           # ROWS n
    partition: tuple = ()             # PARTITION BY: resolved Fields


@dataclass
class AnalysedQuery:
    node: E.Query
    name: str
    kind: str                         # 'aggregate' | 'select' | 'join' | 'merge'
    defines: dict[str, Any]           # checked values (queries.definitions): str, or int
    params: dict[str, str]            # declared: name -> type
    sources: list[SourceInfo]
    param_values: dict[str, object] = field(default_factory=dict)   # run-time or default
    where: E.Expr | None = None
    group: list[GroupInfo] = field(default_factory=list)
    temporal: GroupInfo | None = None
    temporal2: GroupInfo | None = None  # a reader of an inner join: the other side's time
    window: WindowInfo | None = None
    items: list[ItemInfo] = field(default_factory=list)
    having: E.Expr | None = None
    #: GS-lite's CLOSING_WHEN (running aggregation): a group stays open from window to window
    #: until this holds at a window's end (docs/semantics.md "Running aggregation")
    closing: E.Expr | None = None
    #: GS-lite's sampling query (SUPERGROUP, CLEANING_WHEN/BY, super-aggregates, stateful
    #: functions; `queries.sampling`)
    sampling: SamplingInfo | None = None
    join: str | None = None
    merge_fields: tuple[E.Field, ...] = ()
    outputs: list[ColumnInfo] = field(default_factory=list)
    window_end: str | None = None
    join_keys: list[tuple[E.Expr, E.Expr]] = field(default_factory=list)
    join_temporal: tuple[E.Expr, E.Expr] | None = None
    join_residual: E.Expr | None = None
    #: CUBE / ROLLUP / GROUPING_SETS: per grouping pattern the group names present (the
    #: others hold their type's default); None for a plain GROUP BY (queries.grouping_sets)
    patterns: tuple[tuple[str, ...], ...] | None = None
    #: warnings about the query (located like errors), logged when they were found
    warnings: list[str] = field(default_factory=list)
