"""Name and type resolution: parsed expressions in, `Field`-resolved and type-checked expressions out.

`Scope` resolves against the FROM sources (packet fields of a protocol, or the output columns of
an earlier query; qualified `a.x` names in joins); `GroupedScope` resolves SELECT and HAVING of an
aggregation, where a column must be a group item or sit inside an aggregate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from capture.schema import UNSUPPORTED_FIELDS
from queries import expressions as E
from queries import types as T
from queries.constants import fold
from queries.errors import QueryError
from queries.function_library import HANDLE_ARGUMENTS
from queries.hints import clock_example, did_you_mean, likely_column, operand_hint
from queries.printer import to_gsql
from queries.stateful import STATEFUL_FUNCTIONS, SUPER_AGGREGATES, stateful_type
from queries.string_functions import STRING_FUNCTIONS, check_call
from queries.typekinds import NUMERIC
from queries.udf import resolve_aggregate, resolve_call

if TYPE_CHECKING:
    from queries.analysed import GroupInfo, QueryAnalyser, SourceInfo

Hook = Callable[[E.Node], "E.Expr | None"]


class Scope:
    def __init__(self, analyser: QueryAnalyser, sources: list[SourceInfo]):
        self.a = analyser
        self.sources = sources

    def error(self, node, message: str) -> QueryError:
        return self.a.error(node, message)

    # --- columns -----------------------------------------------------------------------------
    def column(self, node: E.Column) -> E.Field:
        name, table = node.name, node.table
        candidates = self.sources
        if table is not None:
            candidates = [s for s in self.sources if s.alias == table] or \
                [s for s in self.sources if s.alias.lower() == table.lower()]
            if not candidates:
                known = ", ".join(s.alias for s in self.sources)
                raise self.error(node, f"unknown source {table!r} (sources: {known})")
        hits = []
        for s in candidates:
            col = s.columns.get(name)
            if col is None:
                lowered = [c for c in s.columns.values() if c.name.lower() == name.lower()]
                col = lowered[0] if len(lowered) == 1 else None
            if col is not None:
                hits.append((s, col))
        if not hits:
            self._unsupported(node, candidates)
            where = " or ".join(
                f"protocol {s.protocol}" if s.kind == "link" else f"query {s.query!r}"
                for s in candidates)
            # Gigascope's aliases stay out of the list: it names each column once
            known_cols = sorted({c for s in candidates for c in s.columns
                                 if s.kind != "link" or s.fields[c].alias_of is None})
            close = likely_column(name, known_cols)
            hint = f"; did you mean {close!r}?" if close else self._alias_hint(node)
            raise self.error(self.a.first_use(node), f"unknown column {name!r} in {where}"
                             f"{hint} (known: {', '.join(known_cols)})")
        if len(hits) > 1:
            raise self.error(node, f"column {name!r} is ambiguous: qualify it "
                             f"({' or '.join(s.alias + '.' + name for s, _ in hits)})")
        s, col = hits[0]
        columns = None
        alias_of = s.fields[col.name].alias_of if s.kind == "link" else None
        if alias_of is not None:
            # Gigascope's name (sourceIP) is our field (srcIP): the same plans either way
            col = s.columns[alias_of]
        if s.kind == "link":
            assert s.protocol is not None   # packet sources always name their protocol
            columns = tuple(s.fields[col.name].columns)
        joined = len(self.sources) > 1
        return E.Field(pos=node.pos, name=col.name, type=col.type,
                       table=s.alias if joined else None, columns=columns, form=col.form)

    def _alias_hint(self, node: E.Column) -> str:
        """Why a name the query itself gives is unknown here: a SELECT alias read in WHERE
        (SQL's mistake too), or a window bucket named in GROUP BY but never defined."""
        stmt = self.a.cur_statement
        if not isinstance(stmt, E.Select):
            return ""
        for item in stmt.items:
            if item.alias == node.name:
                return (f"; {node.name} is a SELECT name, which WHERE and GROUP BY cannot read:"
                        f" write its expression ({to_gsql(item.this)})")
        bare = [g for g in stmt.group_by or () if isinstance(g, E.GroupItem)
                and isinstance(g.this, E.Column) and g.this.name == node.name]
        if bare and not any(isinstance(g, E.GroupItem) and g.alias for g in stmt.group_by):
            return (f"; to group by a time bucket, define it in GROUP BY: "
                    f"{clock_example(self.sources).replace(' AS tb', f' AS {node.name}')}")
        return ""

    def _unsupported(self, node: E.Column, candidates: list[SourceInfo]) -> None:
        """A Gigascope packet field we have no data for (TCP_data): say so, not "unknown"."""
        if not any(s.kind == "link" and s.record is None for s in candidates):
            return
        for name, what in UNSUPPORTED_FIELDS.items():
            if node.name.lower() == name.lower():
                raise self.error(node, f"{name} is not supported yet: {what}")

    # --- expressions -------------------------------------------------------------------------
    def resolve(self, expr: E.Node, clause: str, hook: Hook | None = None) -> E.Expr:
        """`expr` with every column resolved and every operator type-checked."""

        def r(node: E.Node) -> E.Expr:
            if hook is not None:
                done = hook(node)
                if done is not None:
                    return done
            if isinstance(node, E.Column):
                return self.column(node)
            if isinstance(node, E.Field):
                return node
            if isinstance(node, E.Literal):
                if node.kind == "int" and not -2**63 <= node.value < 2**64:
                    raise self.error(node, f"integer {node.value} does not fit in 64 bits "
                                     f"(GSQL's integers: ullong up to {2**64 - 1}, llong "
                                     f"from {-2**63})")
                return node
            if isinstance(node, E.Param):
                if node.name not in self.a.cur_params:
                    guess = did_you_mean(node.name, self.a.cur_params, lambda p: f"${p}")
                    raise self.error(node, f"undeclared parameter ${node.name} (declare it: "
                                     f"PARAM {{ {node.name} uint; }}){guess}")
                return node
            if isinstance(node, E.Star):
                raise self.error(node, "* is only allowed in count(*)")
            if isinstance(node, E.Aggregate):
                raise self.error(node, f"aggregate {node.name} is not allowed in {clause}")
            if isinstance(node, E.SuperAggregate):
                raise self.error(node, f"super-aggregate {node.name}$ is not allowed in {clause} "
                                 f"(it aggregates a supergroup: SELECT, HAVING, CLEANING_WHEN "
                                 f"and CLEANING_BY may read it)")
            if isinstance(node, E.Unary):
                this = r(node.this)
                t = self.a.type_of(this)
                if T.unary_type(node.op, t) is None:
                    raise self.error(node, f"{node.op} does not apply to a {t} value")
                if node.op == "-" and isinstance(this, E.Literal) and this.kind == "int" \
                        and this.value > 2**63:
                    # a negative literal is `-` on a positive one: the llong range decides
                    raise self.error(node, f"integer -{this.value} does not fit in 64 bits "
                                     f"(the smallest llong is {-2**63})")
                return node.replace(this=this)
            if isinstance(node, E.Binary):
                left, right = r(node.left), r(node.right)
                lt, rt = self.a.type_of(left), self.a.type_of(right)
                if T.binary_type(node.op, lt, rt) is None:
                    raise self.error(node, f"{node.op} does not apply to {lt} and {rt}"
                                     f"{self._operand_hint(left, right)}")
                self._check_constant_operand(node, right)
                return node.replace(left=left, right=right)
            if isinstance(node, E.In):
                this = r(node.this)
                t = self.a.type_of(this)
                items = [r(i) for i in node.items]
                for node_i, item in zip(node.items, items):
                    it = self.a.type_of(item)
                    if T.binary_type("=", t, it) is None:
                        raise self.error(node_i, f"IN compares a {t} with a {it}")
                return node.replace(this=this, items=items)
            if isinstance(node, E.Func):
                return self._func(node, [r(x) for x in node.args["args"]])
            if isinstance(node, E.PredicateCall) and node.name in STRING_FUNCTIONS:
                # GS-lite's predicate `name[args]` is its function returning 1 or 0
                call = E.Func(pos=node.pos, name=node.name, args=node.args["args"])
                return self._func(call, [r(x) for x in node.args["args"]])
            raise self.error(node, f"unexpected {type(node).__name__} in {clause}")

        return r(expr)

    def _operand_hint(self, left: E.Expr, right: E.Expr) -> str:
        """What a comparison with a string literal probably meant (`srcIP = '10.0.0.1'`)."""
        for a, b in ((left, right), (right, left)):
            if isinstance(b, E.Literal) and b.kind == "string" and \
                    not (isinstance(a, E.Literal) and a.kind == "string"):
                name = a.name if isinstance(a, E.Field) else None
                return operand_hint(self.a.type_of(a), b.value, name)
        return ""

    def _check_constant_operand(self, node: E.Binary, right: E.Expr) -> None:
        """Refuse a divisor that is always 0 and a constant shift count outside 0..63: the
        query cannot mean them (at run time they would give 0 on every row, docs/gsql.md
        "Expressions")."""
        if node.op not in ("/", "%", "<<", ">>"):
            return
        value = fold(right, self.a.constant_param)
        if value is None:
            return
        text = to_gsql(right)
        shown = text if text == str(value[1]) else f"{text} (= {value[1]})"
        if node.op in ("/", "%") and value[1] == 0:
            what = "division" if node.op == "/" else "modulo"
            raise self.error(node, f"{what} by zero" + ("" if text == "0" else
                             f": the divisor {text} is 0"))
        if node.op in ("<<", ">>") and not 0 <= value[1] < 64:
            raise self.error(node, f"shift count {shown} is outside 0..63 (values have 64 "
                             f"bits)")

    def _func(self, node: E.Func, args: list[E.Expr]) -> E.Expr:
        name = node.name.lower()
        if name in STATEFUL_FUNCTIONS:
            arity, _ = STATEFUL_FUNCTIONS[name]
            types = [self.a.type_of(x) for x in args]
            if len(args) != arity:
                raise self.error(node, f"stateful function {name} takes {arity} argument(s) "
                                 f"(the sampling state and the group count are implicit)")
            if stateful_type(name, types) is None:
                raise self.error(node, f"stateful function {name} takes numbers, not "
                                 f"({', '.join(types)})")
            return node.replace(name=name, args=args)
        library = self.a.functions
        if name not in T.FUNCTIONS and library is not None and library.declared(name):
            return resolve_call(library, node, args, [self.a.type_of(x) for x in args],
                                self.error)
        if name not in T.FUNCTIONS:
            raise self.error(node, f"unknown function {node.name!r} (known: "
                             f"{', '.join(sorted(T.FUNCTIONS))})")
        arity, doc = T.FUNCTIONS[name]
        if len(args) != arity:
            raise self.error(node, f"{name} takes {arity} argument(s): {doc}")
        types = [self.a.type_of(x) for x in args]
        if T.function_type(name, types) is None:
            raise self.error(node, f"{name} does not take ({', '.join(types)}): {doc}")
        if name in STRING_FUNCTIONS:
            args = check_call(name, node.args["args"], args, self.error, self.a.files)
        if name in HANDLE_ARGUMENTS:
            args = self._prefix_file(node, args, HANDLE_ARGUMENTS[name])
        if name == "prefix":
            n = args[1]
            if not isinstance(n, (E.Literal, E.Param)):
                raise self.error(node.args["args"][1], "the prefix length must be a constant")
            limit = 32 if types[0] == "ipv4" else 128
            if isinstance(n, E.Literal) and not 0 <= n.value <= limit:
                raise self.error(node.args["args"][1], f"prefix length {n.value} is outside 0..{limit}")
        return node.replace(name=name, args=args)

    def _prefix_file(self, node: E.Func, args: list[E.Expr], index: int) -> list[E.Expr]:
        """The prefix file of getlpmid, read now as the run's `DataFiles` allows (a missing,
        refused or broken file is an error at the call, naming the file's line) and named by
        its resolved path for every evaluator."""
        from common.datafiles import DataFileError
        from queries.prefixfile import PrefixFileError, load_table

        written = node.args["args"][index]
        arg = args[index]
        if not (isinstance(arg, E.Literal) and isinstance(arg.value, str)):
            raise self.error(written, f"the prefix file of {node.name} must be a string "
                             f"literal (a GS-lite HANDLE: the file is read once per query)")
        files = self.a.files
        try:
            load_table(arg.value, files)
            path = files.resolve(arg.value)
        except (PrefixFileError, DataFileError) as exc:
            raise self.error(written, str(exc)) from None
        return [*args[:index], arg.replace(value=path), *args[index + 1:]]

    def super_aggregate(self, node: E.SuperAggregate) -> E.SuperAggregate:
        """`name$(arg)`: an aggregate of the supergroup over the rows that passed WHERE."""
        name = node.name.upper()
        if name not in SUPER_AGGREGATES:
            raise self.error(node, f"super-aggregate {node.name}$ is not supported (super-"
                             f"aggregates: {', '.join(a + '$' for a in SUPER_AGGREGATES)})")
        args = node.arguments
        if name == "COUNT_DISTINCT":
            if args and not (len(args) == 1 and isinstance(args[0], E.Star)):
                raise self.error(node, "count_distinct$() counts the supergroup's groups: it "
                                 "takes no argument (or *)")
            return node.replace(name=name, args=[])
        if len(args) != 1:
            raise self.error(node, f"{name}$ takes one argument")
        if isinstance(args[0], E.Star):
            if name != "COUNT":
                raise self.error(node, f"{name}$(*) is not a super-aggregate: only count$(*)")
            return node.replace(name=name)
        arg = self.resolve(args[0], f"the argument of {name}$")
        t = self.a.type_of(arg)
        if T.aggregate_type(name, t) is None or t not in NUMERIC:
            raise self.error(node, f"{name}$ does not apply to a {t} value")
        return node.replace(name=name, args=[arg])

    def aggregate(self, node: E.Aggregate) -> E.Aggregate:
        if node.udaf is not None:
            return self._udaf(node)
        name = node.name.upper()
        if name not in T.AGGREGATES:
            raise self.error(node, f"unknown aggregate {node.name!r}")
        if name == "END_REASON":
            if not self.a.flow_mode:
                raise self.error(node, "END_REASON() is only for flow queries: switch the flow "
                                 "table on with DEFINE { idle_timeout 15s; } and/or "
                                 "DEFINE { flow_end fin_rst; }")
            if node.window is not None:
                raise self.error(node.window, "END_REASON() takes no window spec")
            return node.replace(name=name)
        if isinstance(node.arg, E.Star):
            if name != "COUNT":
                raise self.error(node, f"{name}(*) is not an aggregate: only count(*)")
            return node.replace(name=name)
        if name in ("FIRST", "LAST") and any(s.kind == "query" for s in self.sources):
            raise self.error(node, f"{name} orders by packet time, which the rows of a query do "
                             f"not carry: use MIN or MAX of a time column instead")
        arg = self.resolve(node.arg, f"the argument of {name}")   # nested aggregates fail here
        t = self.a.type_of(arg)
        if T.aggregate_type(name, t) is None:
            raise self.error(node, f"{name} does not apply to a {t} value")
        for bad in arg.find_all(E.Func):
            why = T.high_level_only(bad)
            if why:
                raise self.error(bad, f"{bad.name} {why}: not inside an aggregate")
        return node.replace(name=name, arg=arg)


    def _udaf(self, node: E.Aggregate) -> E.Aggregate:
        """A user-defined aggregate's call (`queries.udf.resolve_aggregate`)."""
        library = self.a.functions
        assert library is not None          # only a declared UDAF is marked
        if node.window is not None:
            raise self.error(node.window, f"{node.name} is a user-defined aggregate: it takes "
                             f"no window spec")
        arg = node.arg
        if not isinstance(arg, E.Star):
            arg = self.resolve(arg, f"the argument of {node.name}")
            for bad in arg.find_all(E.Func):
                why = T.high_level_only(bad)
                if why:
                    raise self.error(bad, f"{bad.name} {why}: not inside an aggregate")
        t = "" if isinstance(arg, E.Star) else self.a.type_of(arg)
        resolved = resolve_aggregate(library, node, arg, t, self.error)
        if not resolved.udaf.lfta:
            # docs/gsql.md "User-defined aggregates": the plan then projects the argument in
            # the low level and folds the rows in the high level; not written yet
            raise self.error(node, f"user-defined aggregate {node.name}: Numba cannot compile "
                             f"its update (the log says why), and running it in the high "
                             f"level only is not supported yet")
        return resolved


class GroupedScope:
    """Resolution in SELECT/HAVING of an aggregation: group items become key Fields."""

    def __init__(self, analyser: QueryAnalyser, base: Scope, group: list[GroupInfo]):
        self.a = analyser
        self.base = base
        self.group = group

    def _key(self, g: GroupInfo, pos) -> E.Field:
        return E.Field(pos=pos, name=g.name, type=g.type, form=g.form)

    def resolve(self, expr: E.Node, clause: str, aliases: dict[str, E.Expr] | None = None) -> E.Expr:
        aliases = aliases or {}
        by_name = {g.name: g for g in self.group}

        def hook(node: E.Node):
            if isinstance(node, E.Aggregate):
                return self.base.aggregate(node)
            if isinstance(node, E.SuperAggregate):
                return self.base.super_aggregate(node)
            if isinstance(node, (E.Literal, E.Param, E.Field)):
                return None
            if isinstance(node, E.Column) and node.table is None and node.name in by_name:
                return self._key(by_name[node.name], node.pos)
            if isinstance(node, E.Column) and node.table is None:
                # names are case-insensitive, as columns are (the manual's 9.1.3 names its
                # group `Hostheader` and selects `hostheader`)
                folded = [g for g in self.group if g.name.lower() == node.name.lower()]
                if len(folded) == 1:
                    return self._key(folded[0], node.pos)
            if not any(True for _ in node.find_all(E.Aggregate)):
                try:
                    plain = self.base.resolve(node, clause)
                except QueryError:
                    plain = None
                if plain is not None:
                    for g in self.group:
                        if plain == g.expr:
                            return self._key(g, node.pos)
            if isinstance(node, E.Column):
                if node.table is None and node.name in aliases:
                    return aliases[node.name]
                self.base.column(node)   # unknown columns fail with the schema's message
                raise self.a.error(node, f"{node.name!r} must be a GROUP BY item or inside an "
                                   f"aggregate in {clause}")
            return None

        return self.base.resolve(expr, clause, hook)
