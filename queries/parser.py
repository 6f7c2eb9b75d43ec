"""The GSQL parser: files of `;`-separated queries, DEFINE/PARAM blocks, SELECT/MERGE and FROM sources.

Public API: `parse(text, path=None, name=None) -> QueryFile`, `parse_file(path) -> QueryFile`
and `parse_files(paths) -> QueryFile` (one query set over several files); all raise
`QueryError` only. After an error the parser skips to the next top-level `;` and
carries on, so one `QueryError` reports every broken query of the file together.

Query names: DEFINE `query_name` when given; otherwise the default name (`name`, else the file
name up to its first `.`, else `query`). When several queries of one file have no
`query_name`, each of them is called `<default>_<k>`, k being its 1-based position in the file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar

from capture.schema import PROTOCOLS
from queries.errors import QueryError
from queries.expressions import (
    Column,
    Duration,
    Expr,
    ExtraClause,
    FilterJoin,
    GroupingPattern,
    GroupItem,
    Literal,
    Merge,
    Node,
    Query,
    QueryFile,
    Select,
    SelectItem,
    Source,
    Unary,
)
from queries.parse_expr import ExpressionParser
from queries.tokens import MAX_NAME_LENGTH, RESERVED, Kind, Token, tokenize

JOIN_TYPES = ("INNER_JOIN", "LEFT_OUTER_JOIN", "RIGHT_OUTER_JOIN", "OUTER_JOIN")
DEFAULT_QUERY_NAME = "query"
#: how many errors one file reports before giving up on the rest
MAX_ERRORS = 50
#: units a DEFINE duration value may carry (idle_timeout 15s)
DEFINE_UNITS = frozenset(Duration.UNIT_NS) | {"ns", "us"}

_KNOWN_PROTOCOLS = ", ".join(PROTOCOLS)


def parse(text: str, path: str | None = None, name: str | None = None) -> QueryFile:
    """Parse GSQL `text` (read from `path`, used in messages) into a QueryFile."""
    path = None if path is None else str(path)
    if not isinstance(text, str):
        raise QueryError(f"query text must be a str, not {type(text).__name__}", path=path)
    default = name or _name_from_path(path) or DEFAULT_QUERY_NAME
    return Parser(tokenize(text), text, path).parse_file(default)


def parse_file(path: str | Path) -> QueryFile:
    """Read and parse a GSQL file; its name (up to the first `.`) names unnamed queries."""
    return parse(_read(path), path=str(Path(path)))


def parse_files(paths: Iterable[str | Path]) -> QueryFile:
    """Parse several GSQL files as one query set (GS-lite's translate_fta takes several files).

    One QueryFile holds every query, in file order; each Query keeps its own `path` and the
    QueryFile the text of each file (`sources`), so errors point into the right file. Unnamed
    queries are named after their own file. A query name used twice, in one file or two, is an
    error naming both places; every file's errors are reported together.
    """
    queries: list[Query] = []
    sources: dict[str, str] = {}
    errors: list[QueryError] = []
    for path in paths:
        p = str(Path(path))
        try:
            text = _read(path)
            tree = parse(text, path=p)
        except QueryError as e:
            errors.append(e)
            continue
        sources[p] = text
        queries.extend(q.replace(path=p) for q in tree.queries)
    if not errors and not queries:
        raise QueryError("no query file given")
    errors.extend(_name_clashes(queries, sources))
    if errors:
        raise QueryError.collect(errors)
    return QueryFile(pos=queries[0].pos, queries=queries, sources=sources)


def _name_clashes(queries: list[Query], sources: dict[str, str]) -> list[QueryError]:
    """A located error for every query whose name an earlier query already has."""
    def where(q: Query) -> Node:
        named = (q.defines or {}).get("query_name")
        return named if named is not None and named.pos is not None else q

    first: dict[str, Query] = {}
    errors = []
    for q in queries:
        if q.name not in first:
            first[q.name] = q
            continue
        other = where(first[q.name])
        at = f"{first[q.name].path}:{other.pos.line}:{other.pos.col}" if other.pos \
            else str(first[q.name].path)
        errors.append(QueryError.at(where(q), f"query name '{q.name}' is already used at {at}: "
                                    f"query names must be unique across the files of a run "
                                    f"(give one a DEFINE query_name)", sources.get(q.path),
                                    q.path))
    return errors


def _read(path: str | Path) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QueryError("no such query file", path=str(p)) from None
    except UnicodeDecodeError as e:
        raise QueryError(f"not UTF-8 text (byte {e.start})", path=str(p)) from None
    except OSError as e:
        raise QueryError(f"cannot read the query file: {e.strerror or e}", path=str(p)) from None


def _name_from_path(path: str | None) -> str | None:
    if not path:
        return None
    stem = Path(path).name.split(".", 1)[0]
    return stem or None


class Parser(ExpressionParser):
    """One `_parse_<rule>` method per grammar rule; keywords pick rules via the tables below."""

    STATEMENTS: ClassVar[dict[str, Callable[[Parser], Node]]] = {}
    QUERY_BLOCKS: ClassVar[dict[str, Callable[[Parser, dict], None]]] = {}
    # in GS-lite's order; SUPERGROUP and the CLEANING / CLOSING clauses are GS-lite's, parsed
    # for a located "not supported yet" (queries.gslite)
    CLAUSES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("WHERE", "_parse_where"), ("GROUP", "_parse_group_by"),
        ("SUPERGROUP", "_parse_supergroup"), ("HAVING", "_parse_having"),
        ("CLEANING_WHEN", "_parse_condition_clause"), ("CLEANING_BY", "_parse_condition_clause"),
        ("CLOSING_WHEN", "_parse_condition_clause"))
    #: GS-lite's extended group-by patterns
    GROUPING_PATTERNS = ("CUBE", "ROLLUP", "GROUPING_SETS")

    # --- file ---------------------------------------------------------------------------------
    def parse_file(self, default_name: str) -> QueryFile:
        queries: list[Query] = []
        errors: list[QueryError] = []
        while True:
            while self._raw().kind is Kind.OP and self._raw().value == ";":
                self.i += 1
            if self._raw().kind is Kind.EOF:
                break
            try:
                queries.append(self._parse_query())
                if not self.at_op(";") and self.tok.kind is not Kind.EOF:
                    if self.tok.upper == "CLEANIN":
                        raise self.error("CLEANIN is a typo of the manual's (its flow "
                                         "sampling examples): write CLEANING BY (GS-lite "
                                         "does not accept CLEANIN either)")
                    raise self.unexpected("';' or the end of the query")
            except QueryError as e:
                errors.append(e)
                if len(errors) >= MAX_ERRORS:
                    break
                self._recover()
        if errors:
            raise QueryError.collect(errors)
        if not queries:
            raise QueryError("no query in the file (expected SELECT or MERGE)", path=self.path,
                             line=1, column=1, source=self.source)
        return QueryFile(pos=queries[0].pos, queries=_named(queries, default_name),
                         path=self.path)

    def _raw(self) -> Token:
        return self.tokens[self.i]

    def _recover(self) -> None:
        """Skip to just past the next `;` outside any `{...}` block (or to the end)."""
        while True:
            t = self.tokens[self.i]
            if t.kind is Kind.EOF:
                return
            self.i += 1
            if t.kind is Kind.OP and t.value == ";" and t.depth == 0:
                return

    # --- query --------------------------------------------------------------------------------
    def _parse_query(self) -> Query:
        start = self.tok
        blocks: dict = {"defines": {}, "params": {}, "param_defaults": {}}
        self.defines = blocks["defines"]     # filled by the DEFINE block: `#name` reads it
        seen: set[str] = set()
        while self.tok.upper in self.QUERY_BLOCKS:
            t = self.tok
            if t.upper in seen:
                raise self.error(f"a second {t.upper} block in one query: put every entry in "
                                 f"one block", t)
            seen.add(t.upper)
            self.QUERY_BLOCKS[t.upper](self, blocks)
        rule = self.STATEMENTS.get(self.tok.upper)
        if rule is None:
            raise self.unexpected("SELECT or MERGE" if seen else
                                  "SELECT, MERGE, DEFINE or PARAM to start a query")
        statement = rule(self)
        name = blocks["defines"].get("query_name")
        return Query(pos=self.pos(start), name=None if name is None else name.value,
                     statement=statement, **blocks)

    def _parse_define(self, blocks: dict) -> None:
        """`DEFINE { key value; ... }`; values are identifiers, numbers, strings or TRUE/FALSE."""
        self.advance()
        self.expect_op("{", "after DEFINE")
        defines: dict[str, Literal] = blocks["defines"]
        while not self.at_op("}"):
            key = self.expect_name("a DEFINE key (e.g. query_name, aggregate_slots, flush)")
            if key.value.lower() in defines:
                raise self.error(f"DEFINE key '{key.value}' given twice", key)
            value = self._parse_define_value(key)
            if key.value.lower() == "query_name" and (
                    value.kind != "string" or not _is_name(value.value)):
                raise self.error("query_name must be a name (letters, digits, _), e.g. "
                                 "query_name flows", key)
            if key.value.lower() == "query_name" and len(value.value) > MAX_NAME_LENGTH:
                raise self.error(f"query_name: a name of {len(value.value):,} characters is "
                                 f"too long (at most {MAX_NAME_LENGTH}: it names files and "
                                 f"directories)", key)
            defines[key.value.lower()] = value
            self._end_block_entry("DEFINE")
        self.advance()

    def _parse_define_value(self, key: Token) -> Literal:
        t = self.tok
        if t.kind is Kind.OP and t.value == "-" and self.peek().kind in (Kind.INT, Kind.FLOAT):
            self.advance()
            number = self.advance()
            kind = "int" if number.kind is Kind.INT else "float"
            return Literal(pos=self.pos(t), value=-number.value, kind=kind)
        nxt = self.peek()
        if t.kind in (Kind.INT, Kind.FLOAT) and nxt.kind is Kind.IDENT and \
                nxt.value.lower() in DEFINE_UNITS:
            # a duration (idle_timeout 15s): kept as its text, checked with the DEFINE key
            self.advance()
            self.advance()
            return Literal(pos=self.pos(t), value=f"{t.value}{nxt.value}", kind="string")
        if t.kind in (Kind.INT, Kind.FLOAT, Kind.STRING):
            self.advance()
            kind = {Kind.INT: "int", Kind.FLOAT: "float", Kind.STRING: "string"}[t.kind]
            return Literal(pos=self.pos(t), value=t.value, kind=kind)
        if t.upper in ("TRUE", "FALSE"):
            self.advance()
            return Literal(pos=self.pos(t), value=t.upper == "TRUE", kind="bool")
        if t.kind is Kind.IDENT and t.upper not in RESERVED:
            self.advance()
            return Literal(pos=self.pos(t), value=t.value, kind="string")
        raise self.unexpected(f"a value for '{key.value}' (a name, number or 'string')")

    def _parse_param(self, blocks: dict) -> None:
        """`PARAM { name type [= default]; ... }` (`$name` also accepted for the name)."""
        self.advance()
        self.expect_op("{", "after PARAM")
        params: dict[str, str] = blocks["params"]
        while not self.at_op("}"):
            t = self.tok
            if t.kind is Kind.PARAM:
                self.advance()
            else:
                t = self.expect_name("a parameter name")
            if t.value in params:
                raise self.error(f"parameter '{t.value}' declared twice", t)
            type_tok = self.expect_name(f"the type of parameter {t.value} (e.g. uint, "
                                        f"float, string, ip)")
            params[t.value] = type_tok.value.lower()
            if self.match_op("="):
                blocks["param_defaults"][t.value] = self._parse_param_default(t)
            self._end_block_entry("PARAM")
        self.advance()

    def _parse_param_default(self, name: Token) -> Literal:
        value = self._parse_unary()
        negative = False
        if isinstance(value, Unary) and value.op == "-" and isinstance(value.this, Literal):
            negative, value = True, value.this
        if not isinstance(value, Literal) or (negative and value.kind not in ("int", "float")):
            raise self.error(f"the default of parameter {name.value} must be a constant", name)
        return value.replace(value=-value.value) if negative else value

    def _end_block_entry(self, block: str) -> None:
        if self.match_op(";"):
            return
        if not self.at_op("}"):
            raise self.unexpected(f"';' after the {block} entry")

    # --- SELECT -------------------------------------------------------------------------------
    def _parse_select(self) -> Select:
        select_tok = self.advance()
        items = [self._parse_select_item()]
        while self.match_op(","):
            items.append(self._parse_select_item())
        join_tok = self.advance() if self.tok.upper in JOIN_TYPES + ("FILTER_JOIN",) else None
        filter_join = self._parse_filter_join(join_tok) \
            if join_tok is not None and join_tok.upper == "FILTER_JOIN" else None
        self.expect_kw("FROM", "after the select list")
        sources = self._parse_sources()
        self._check_join(join_tok, sources)
        clauses: dict = {}
        done = -1
        while True:
            names = [c for c, _ in self.CLAUSES]
            t = self.tok
            word = self._clause_word()
            if word not in names:
                break
            k = names.index(word)
            if k <= done:
                shown = [c.replace("GROUP", "GROUP BY") for c in names]
                what = "given twice" if k == done else f"must come before {shown[done]}"
                raise self.error(f"{shown[k]} {what}", t)
            done = k
            key, value = getattr(self, self.CLAUSES[k][1])()
            if key == "extra":
                clauses.setdefault("extra", []).append(value)
            else:
                clauses[key] = value
        return Select(pos=self.pos(select_tok), items=items, sources=sources,
                      join=None if join_tok is None else join_tok.upper,
                      filter_join=filter_join, **clauses)

    def _clause_word(self) -> str:
        """The clause keyword at the cursor: GS-lite's lexer spells CLEANING_WHEN and
        CLEANING_BY with `_`, the manual's examples as two words (CLEANING WHEN)."""
        t = self.tok
        if t.upper == "CLEANING" and self.peek().upper in ("WHEN", "BY"):
            return f"CLEANING_{self.peek().upper}"
        return t.upper

    def _parse_filter_join(self, join_tok: Token) -> FilterJoin:
        """GS-lite's `FILTER_JOIN(temporal_field, duration)` before FROM."""
        self.expect_op("(", "after FILTER_JOIN, e.g. FILTER_JOIN(time, 15)")
        column = self._parse_column()
        self.expect_op(",", "and the duration in FILTER_JOIN(time, 15)")
        t = self.tok
        if t.kind is not Kind.INT:
            raise self.unexpected("a positive integer duration, e.g. FILTER_JOIN(time, 15)")
        self.advance()
        self.expect_op(")", "to close FILTER_JOIN(...)")
        return FilterJoin(pos=self.pos(join_tok), column=column, range=t.value)

    def _parse_supergroup(self) -> tuple[str, ExtraClause]:
        kw = self.advance()
        items = [self._parse_column()]
        while self.match_op(","):
            items.append(self._parse_column())
        return "extra", ExtraClause(pos=self.pos(kw), keyword="SUPERGROUP", items=items)

    def _parse_condition_clause(self) -> tuple[str, ExtraClause]:
        word = self._clause_word()
        kw = self.advance()
        if word != kw.upper:
            self.advance()     # WHEN / BY of the two-word spelling
        return "extra", ExtraClause(pos=self.pos(kw), keyword=word,
                                    this=self._parse_expression())

    def _check_join(self, join_tok: Token | None, sources: list[Source]) -> None:
        if len(sources) > 2:
            raise QueryError.at(sources[2], "at most two sources (a join); for several links "
                                "write [link1, link2].PROTOCOL or link1.PROTOCOL UNION "
                                "link2.PROTOCOL", self.source, self.path)
        if len(sources) == 2 and join_tok is None:
            raise QueryError.at(sources[1], "two sources make a join: state its type, SELECT "
                                "... INNER_JOIN FROM a, b (or LEFT_OUTER_JOIN, "
                                "RIGHT_OUTER_JOIN, OUTER_JOIN)", self.source, self.path)
        if len(sources) == 1 and join_tok is not None and join_tok.upper != "FILTER_JOIN":
            raise self.error(f"{join_tok.upper} needs two sources: FROM a, b", join_tok)

    def _parse_select_item(self) -> SelectItem:
        start = self.tok
        this = self._parse_expression()
        alias = self._parse_alias(required=False, allow_bare=False)
        return SelectItem(pos=self.pos(start), this=this, alias=alias)

    def _parse_alias(self, required: bool, allow_bare: bool) -> str | None:
        if self.match_kw("AS"):
            return self.expect_name("a name after AS").value
        if allow_bare and self.tok.kind is Kind.IDENT and self.tok.upper not in RESERVED:
            return self.advance().value
        if required:
            raise self.unexpected("AS name")
        return None

    def _parse_where(self) -> tuple[str, Expr]:
        self.advance()
        return "where", self._parse_expression()

    def _parse_having(self) -> tuple[str, Expr]:
        self.advance()
        return "having", self._parse_expression()

    def _parse_group_by(self) -> tuple[str, list[GroupItem | GroupingPattern]]:
        self.advance()
        self.expect_kw("BY", "after GROUP")
        items = [self._parse_group_entry()]
        while self.match_op(","):
            items.append(self._parse_group_entry())
        return "group_by", items

    def _parse_group_entry(self) -> GroupItem | GroupingPattern:
        t = self.tok
        if t.upper in self.GROUPING_PATTERNS and self.peek().kind is Kind.OP and \
                self.peek().value == "(":
            return self._parse_grouping_pattern()
        return self._parse_group_item()

    def _parse_grouping_pattern(self) -> GroupingPattern:
        """GS-lite's `CUBE(a, b)`, `ROLLUP(a, b)`, `GROUPING_SETS((a, b), (a))`."""
        kw = self.advance()
        self.expect_op("(", f"after {kw.upper}")
        sets: list[list[GroupItem]] = []
        while True:
            nested = kw.upper == "GROUPING_SETS"
            if nested:
                self.expect_op("(", "to open a grouping set, e.g. GROUPING_SETS((a, b), (a))")
            items = [self._parse_group_item()]
            while self.match_op(","):
                items.append(self._parse_group_item())
            sets.append(items)
            if not nested:
                break
            self.expect_op(")", "to close the grouping set")
            if not self.match_op(","):
                break
        self.expect_op(")", f"to close {kw.upper}(...)")
        return GroupingPattern(pos=self.pos(kw), kind=kw.upper, sets=sets)

    def _parse_group_item(self) -> GroupItem:
        start = self.tok
        this = self._parse_expression()
        alias = self._parse_alias(required=False, allow_bare=False)
        if alias is None and not isinstance(this, Column):
            raise self.error("a computed group item needs a name: write it as "
                             "expr AS name (e.g. time/60 AS tb)", start)
        return GroupItem(pos=self.pos(start), this=this, alias=alias)

    # --- MERGE --------------------------------------------------------------------------------
    def _parse_merge(self) -> Merge:
        merge_tok = self.advance()
        fields = [self._parse_column()]
        while self.match_op(":"):
            fields.append(self._parse_column())
        if len(fields) < 2:
            raise self.unexpected("':' and the next stream's field (MERGE a.time : b.time "
                                  "FROM ...)")
        slack = None
        if self.at_kw("SLACK"):     # GS-lite's MERGE ... SLACK expr FROM
            kw = self.advance()
            slack = ExtraClause(pos=self.pos(kw), keyword="SLACK", this=self._parse_expression())
        self.expect_kw("FROM", "after the MERGE fields")
        sources = self._parse_sources()
        return Merge(pos=self.pos(merge_tok), fields=fields, sources=sources, slack=slack)

    # --- FROM ---------------------------------------------------------------------------------
    def _parse_sources(self) -> list[Source]:
        sources = [self._parse_source()]
        while self.match_op(","):
            sources.append(self._parse_source())
        return sources

    def _parse_source(self) -> Source:
        start = self.tok
        links, protocol, query = self._parse_source_item()
        union = "list" if len(links or ()) > 1 else None
        if self.at_kw("UNION"):
            if links is None:
                raise self.error("UNION combines link.PROTOCOL sources, e.g. "
                                 "link1.IPV4 UNION link2.IPV4")
            union, links = "union", list(links)
            while self.at_kw("UNION"):
                self.advance()
                more_tok = self.tok
                more, more_protocol, _ = self._parse_source_item()
                if more is None:
                    raise self.error("UNION combines link.PROTOCOL sources, e.g. "
                                     "link1.IPV4 UNION link2.IPV4", more_tok)
                if (more_protocol or "").upper() != (protocol or "").upper():
                    raise self.error(f"every source of a UNION must read the same protocol "
                                     f"({protocol}, not {more_protocol})", more_tok)
                links.extend(more)
        window = self._parse_window_spec() if self.at_op("[") else None
        alias = self._parse_alias(required=False, allow_bare=True)
        pos = self.pos(start)
        if query is not None:
            return Source(pos=pos, query=query, alias=alias, window=window)
        return Source(pos=pos, links=links, protocol=protocol, alias=alias, window=window,
                      union=union)

    def _parse_source_item(self) -> tuple[list[str] | None, str | None, str | None]:
        """`link.PROTO` | `[l1, l2].PROTO` | `PROTO` | a query name: (links, protocol, query)."""
        if self.at_op("["):
            self.advance()
            links = [self.expect_name("a link name").value]
            while self.match_op(","):
                links.append(self.expect_name("a link name").value)
            self.expect_op("]", "to close the list of links")
            self.expect_op(".", "and a protocol after the list of links, e.g. [link1, "
                                "link2].IPV4")
            return links, self._parse_protocol(), None
        self._refuse_gslite_source()
        name = self.expect_name("a source: link.PROTOCOL, [link1, link2].PROTOCOL, a "
                                "PROTOCOL or a query name")
        self._refuse_gslite_source(name)
        if self.at_op("."):
            self.advance()
            return [name.value], self._parse_protocol(), None
        if name.upper in PROTOCOLS:
            return None, name.upper, None
        # a query name or a schema file's protocol: the analysis knows the schema and decides
        return None, None, name.value

    def _refuse_gslite_source(self, name: Token | None = None) -> None:
        """GS-lite's `host.iface.PROTO`, `'host'.iface.PROTO` and library query names
        (`lib/query`): located errors (before `name` is read, or just after)."""
        t, nxt = self.tok, self.peek()
        if name is None:
            if t.kind is Kind.STRING and nxt.kind is Kind.OP and nxt.value == ".":
                raise self.error("GS-lite construct host-qualified source 'host'.iface.PROTOCOL "
                                 "is not supported (name the link: link.PROTOCOL)", t)
            return
        if t.kind is Kind.OP and t.value == "." and nxt.kind is Kind.IDENT and \
                self.peek(2).kind is Kind.OP and self.peek(2).value == ".":
            raise self.error("GS-lite construct host-qualified source host.iface.PROTOCOL is "
                             "not supported (name the link: link.PROTOCOL)", name)
        if t.kind is Kind.OP and t.value == "/":
            raise self.error("GS-lite construct library query name (lib/query) is not "
                             "supported (put the query in a file of the run)", name)

    def _parse_protocol(self) -> str:
        """A protocol name: any name (the analysis checks it against the schema, which may
        hold schema files' protocols); built-in ones are spelled as the schema spells them."""
        t = self.tok
        if t.kind is not Kind.IDENT:
            raise self.unexpected(f"a protocol ({_KNOWN_PROTOCOLS}, or one of a schema file)")
        self.advance()
        return t.upper if t.upper in PROTOCOLS else t.value

    STATEMENTS.update({"SELECT": _parse_select, "MERGE": _parse_merge})
    QUERY_BLOCKS.update({"DEFINE": _parse_define, "PARAM": _parse_param})


def _is_name(value: object) -> bool:
    return (isinstance(value, str) and value != "" and (value[0].isalpha() or value[0] == "_")
            and all(c.isalnum() or c == "_" for c in value) and value.isascii())


def _named(queries: list[Query], default: str) -> list[Query]:
    unnamed = [q for q in queries if q.name is None]
    if len(unnamed) == 1:
        return [q.replace(name=default) if q.name is None else q for q in queries]
    return [q.replace(name=f"{default}_{k}") if q.name is None else q
            for k, q in enumerate(queries, start=1)]
