"""GSQL expressions and window specs: the token cursor and precedence-climbing expression rules.

Precedence, loosest first: OR, AND, NOT, comparisons and IN (not chainable), `|`, `^`, `&`,
`<< >>`, `+ -`, `* / %`, unary `- ~` and GS-lite's `!` (NOT, binding as tightly) and `+` (the
identity). GS-lite's own primaries (`HEX'..'`, `#name`, `@name`, `count$(*)`, `name[...]`)
are parsed into nodes; `queries.gslite` says which of them run. Unlike C, the bitwise operators bind tighter than the
comparisons, so `flags & 2 = 2` means `(flags & 2) = 2` as a network query means it.
`queries.parser.Parser` builds on this class for files, queries and FROM sources.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import ClassVar

from queries.errors import QueryError
from queries.expressions import (
    CHAIN_OPS,
    Aggregate,
    Binary,
    Column,
    DefineRef,
    Duration,
    Expr,
    Func,
    IfaceParam,
    In,
    Literal,
    Node,
    Param,
    Pos,
    PredicateCall,
    Star,
    SuperAggregate,
    Unary,
    WindowSpec,
    chain,
)
from queries.gslite import LITERAL_KEYWORDS, TOKEN_NAMES, gslite_literal
from queries.hints import did_you_mean, keyword_typo, sql_only
from queries.tokens import RESERVED, Kind, Token

#: aggregate functions (upper case as stored in `Aggregate.name`)
AGGREGATES = frozenset({"COUNT", "SUM", "MIN", "MAX", "AVG", "AND_AGGR", "OR_AGGR", "XOR_AGGR",
                        "FIRST", "LAST", "COUNT_DISTINCT", "END_REASON"})

#: binary operators -> precedence (higher binds tighter); NOT sits at 3, unary minus above all
BINARY_PRECEDENCE: dict[str, int] = {
    "OR": 1, "AND": 2,
    "=": 4, "<>": 4, "!=": 4, "<": 4, ">": 4, "<=": 4, ">=": 4, "IN": 4,
    "|": 5, "^": 6, "&": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10,
}
COMPARISON = 4
NOT_PRECEDENCE = 3
UNARY_OPS = frozenset({"-", "~"})
#: GS-lite's unary operators that bind as tightly as `-`: `!` (logical negation, built as NOT)
#: and `+` (the identity: the operand itself)
GSLITE_UNARY_OPS = frozenset({"!", "+"})

#: deepest nesting of parentheses / unary operators / calls before the parser gives up cleanly
#: (each level costs a handful of Python frames; this keeps far below the recursion limit)
MAX_NESTING = 64
#: deepest expression tree (levels of nodes, a leaf is one): the analyser, the printer, the
#: evaluators and pickling walk trees recursively, a few Python frames per level, so a tree
#: must stay far below Python's recursion limit. Chains of AND / OR are balanced and never
#: come near it; a chain of another operator (a + b + c ...) adds one level per term.
MAX_DEPTH = 100

WINDOW_UNITS_HINT = "ms, seconds, minutes or hours (sec, min, h also work)"


class TokenCursor:
    """Walks the token list: lookahead, keyword/operator tests, expectations and errors."""

    def __init__(self, tokens: list[Token], source: str, path: str | None):
        self.tokens = tokens
        self.source = source
        self.path = path
        self.i = 0
        self.nesting = 0
        #: the DEFINE entries of the query being parsed (key, lower case -> Literal): what a
        #: GS-lite `#name` stands for
        self.defines: dict[str, Literal] = {}

    # --- looking ------------------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        """The current token; a lexing problem surfaces here as its QueryError."""
        t = self.tokens[self.i]
        if t.kind is Kind.ERROR:
            raise self.error(str(t.value), t)
        return t

    def peek(self, k: int = 1) -> Token:
        return self.tokens[min(self.i + k, len(self.tokens) - 1)]

    def at_op(self, *ops: str) -> bool:
        t = self.tok
        return t.kind is Kind.OP and t.value in ops

    def at_kw(self, *words: str) -> bool:
        return self.tok.upper in words

    # --- consuming ----------------------------------------------------------------------------
    def advance(self) -> Token:
        t = self.tok
        if t.kind is not Kind.EOF:
            self.i += 1
        return t

    def match_op(self, op: str) -> Token | None:
        return self.advance() if self.at_op(op) else None

    def match_kw(self, word: str) -> Token | None:
        return self.advance() if self.at_kw(word) else None

    def expect_op(self, op: str, context: str = "") -> Token:
        if not self.at_op(op):
            raise self.unexpected(f"'{op}'" + (f" {context}" if context else ""))
        return self.advance()

    def expect_kw(self, word: str, context: str = "") -> Token:
        if not self.at_kw(word):
            raise self.unexpected(word + (f" {context}" if context else ""))
        return self.advance()

    def expect_name(self, what: str) -> Token:
        """An identifier that is not a reserved word (a column, link, alias, key ... name)."""
        t = self.tok
        if t.kind is not Kind.IDENT:
            raise self.unexpected(what)
        if t.upper in RESERVED:
            raise self.error(f"expected {what}, found keyword {t.value.upper()}"
                             f" (reserved words cannot be used as names)", t)
        return self.advance()

    # --- errors -------------------------------------------------------------------------------
    def error(self, message: str, token: Token | None = None) -> QueryError:
        t = self.tokens[self.i] if token is None else token
        return QueryError(message, path=self.path, line=t.line, column=t.col,
                          source=self.source, length=t.length)

    def unexpected(self, expected: str) -> QueryError:
        found = f"expected {expected}, found {self.tok.describe()}"
        return self._hinted(found) or self.error(found)

    def _hinted(self, found: str) -> QueryError | None:
        """`found` with what the query probably meant, at the word it is about: an SQL word
        GSQL lacks (ORDER BY, LIMIT, JOIN ... ON), or a keyword typo (GRUOP), at the current
        token or at the word just before it, which was taken as a name (an alias)."""
        t = self.tok
        prev = self.tokens[self.i - 1] if self.i > 0 else None
        after = "" if prev is None else prev.upper or str(prev.value)
        if t.kind is Kind.OP and t.value == "*" and after in ("SELECT", ",") and \
                self.nesting == 0:
            return self.error(f"{found}: GSQL has no SELECT *: name the columns (e.g. SELECT "
                              f"time, srcIP, destIP, len)", t)
        if t.kind is Kind.OP and t.value == "=" and after == "=":
            return self.error(f"{found}: GSQL compares with a single = (x = 1, not x == 1)", t)
        if t.kind is Kind.IDENT and t.upper not in RESERVED:
            instead = sql_only(t.value)
            if instead:
                return self.error(f"{found}: {instead}", t)
            meant = keyword_typo(t.value)
            if meant:
                return self.error(f"{found}: did you mean {meant}?", t)
        if prev is not None and prev.kind is Kind.IDENT and prev.upper not in RESERVED:
            instead = sql_only(prev.value)
            if instead:
                return self.error(f"{instead} ('{prev.value}' was read as a name)", prev)
            meant = keyword_typo(prev.value)
            if meant:
                return self.error(f"did you mean {meant}? '{prev.value}' was read as a name, "
                                  f"then {found}", prev)
        return None

    @staticmethod
    def pos(token: Token) -> Pos:
        return Pos(token.line, token.col)

    def _enter(self, token: Token) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(f"expression nested too deeply (more than {MAX_NESTING} levels)",
                             token)

    def _leave(self) -> None:
        self.nesting -= 1


class ExpressionParser(TokenCursor):
    """`_parse_<rule>` methods for expressions, aggregates and window specs."""

    # primary expressions introduced by a keyword
    PRIMARY_KEYWORDS: ClassVar[dict[str, Callable[[ExpressionParser], Expr]]] = {}
    # window spec items: `[RANGE ..., SLIDE ..., WA ..., ROWS ..., PARTITION BY ...]`
    WINDOW_ITEMS: ClassVar[dict[str, Callable[[ExpressionParser, dict], None]]] = {}

    # --- expressions --------------------------------------------------------------------------
    def _parse_expression(self) -> Expr:
        expr = self._parse_binary(1)
        if self.nesting == 0:     # a whole expression (inner ones are part of it)
            self._check_depth(expr)
        return expr

    def _check_depth(self, expr: Expr) -> None:
        """A QueryError at the node where the tree grows deeper than MAX_DEPTH levels."""
        height: dict[int, int] = {}
        stack: list[tuple[Node, bool]] = [(expr, False)]
        while stack:      # post-order without recursion: the tree may be deep
            node, done = stack.pop()
            kids = list(node.children())
            if not done:
                stack.append((node, True))
                stack.extend((k, False) for k in kids)
                continue
            h = 1 + max((height[id(k)] for k in kids), default=0)
            height[id(node)] = h
            if h > MAX_DEPTH:
                where = node.pos or expr.pos
                raise QueryError(
                    f"expression too deep: more than {MAX_DEPTH} levels of operators and calls "
                    f"(each term of a chain like a + b + c ... adds a level): split it into "
                    f"several columns or queries, or use x IN [a, b, ...] for a list of "
                    f"alternatives", path=self.path, line=where.line if where else None,
                    column=where.col if where else None, source=self.source)

    def _parse_binary(self, min_prec: int) -> Expr:
        """Precedence climbing: operators binding at least as tight as `min_prec`."""
        if self.at_kw("NOT") and min_prec <= NOT_PRECEDENCE:
            not_tok = self.advance()
            self._enter(not_tok)
            left: Expr = Unary(pos=self.pos(not_tok), op="NOT",
                               this=self._parse_binary(NOT_PRECEDENCE))
            self._leave()
        else:
            left = self._parse_unary()
        compared = False
        # a run of one associative operator (a OR b OR c ...) is collected and built balanced
        # (`expressions.chain`): its depth grows with log2 of the terms, not with the terms
        run_op: str | None = None
        terms: list[Expr] = []
        places: list[Pos | None] = []
        while True:
            op_tok, op = self._binary_operator()
            prec = BINARY_PRECEDENCE[op] if op is not None else -1
            if run_op is not None and op != run_op:
                left = chain(run_op, terms, places)
                run_op = None
            if op is None or prec < min_prec:
                return left
            if prec == COMPARISON:
                if compared:
                    raise self.error("comparisons cannot be chained: combine them with AND "
                                     "or use parentheses", op_tok)
                compared = True
            if op == "IN":
                left = self._parse_in(left)
                continue
            self.advance()
            right = self._parse_binary(prec + 1)
            if op in CHAIN_OPS:
                if run_op is None:
                    run_op, terms, places = op, [left], []
                terms.append(right)
                places.append(self.pos(op_tok))
                continue
            left = Binary(pos=self.pos(op_tok), op="<>" if op == "!=" else op,
                          left=left, right=right)

    def _binary_operator(self) -> tuple[Token, str | None]:
        t = self.tok
        if t.kind is Kind.OP and t.value in BINARY_PRECEDENCE:
            return t, t.value
        if t.upper in ("AND", "OR", "IN"):
            return t, t.upper
        if t.upper == "NOT" and self.peek().upper == "IN":
            return t, "IN"
        return t, None

    def _parse_in(self, left: Expr) -> Expr:
        """`x IN [a, b, c]` and `x NOT IN [...]` (the latter as NOT (x IN [...]))."""
        negate = self.match_kw("NOT")
        in_tok = self.expect_kw("IN")
        self.expect_op("[", "to open the IN list, e.g. x IN [1, 2, 3]")
        items = [self._parse_expression()]
        while self.match_op(","):
            items.append(self._parse_expression())
        self.expect_op("]", "to close the IN list")
        node: Expr = In(pos=self.pos(in_tok), this=left, items=items)
        if negate is not None:
            node = Unary(pos=self.pos(negate), op="NOT", this=node)
        return node

    def _parse_unary(self) -> Expr:
        t = self.tok
        if t.kind is Kind.OP and t.value in UNARY_OPS | GSLITE_UNARY_OPS:
            self.advance()
            self._enter(t)
            this = self._parse_unary()
            self._leave()
            if t.value == "+":
                return this
            return Unary(pos=self.pos(t), op="NOT" if t.value == "!" else t.value, this=this)
        return self._parse_primary()

    def _parse_primary(self) -> Expr:
        t = self.tok
        if t.kind is Kind.INT:
            self.advance()
            return Literal(pos=self.pos(t), value=t.value, kind="int", type=t.declared)
        if t.kind is Kind.FLOAT:
            self.advance()
            return Literal(pos=self.pos(t), value=t.value, kind="float")
        if t.kind is Kind.STRING:
            self.advance()
            return Literal(pos=self.pos(t), value=t.value, kind="string")
        if t.kind is Kind.PARAM:
            self.advance()
            return Param(pos=self.pos(t), name=t.value)
        if t.kind is Kind.OP and t.value == "(":
            return self._parse_paren()
        if t.kind is Kind.OP and t.value in self.PRIMARY_OPERATORS:
            return self.PRIMARY_OPERATORS[t.value](self)
        if t.kind is Kind.IDENT:
            rule = self.PRIMARY_KEYWORDS.get(t.upper)
            if rule is not None:
                return rule(self)
            if t.upper in RESERVED:
                instead = sql_only(t.value) if t.upper == "DISTINCT" else None
                raise self.error(f"expected an expression, found keyword {t.upper}"
                                 + (f": {instead}" if instead else ""), t)
            nxt = self.peek()
            if self._typed_literal_follows(t, LITERAL_KEYWORDS | TOKEN_NAMES.keys()):
                return self._parse_gslite_literal()
            if t.upper == "IPV4_VAL" and (nxt.kind is Kind.STRING or
                                          (nxt.kind is Kind.OP and nxt.value == ":")):
                return self._parse_ip_literal()   # the manual's spelling of IP_VAL
            if nxt.kind is Kind.OP and nxt.value == "(":
                return self._parse_call()
            if nxt.kind is Kind.OP and nxt.value == "$" and self.peek(2).kind is Kind.OP \
                    and self.peek(2).value == "(":
                return self._parse_super_aggregate()
            if nxt.kind is Kind.OP and nxt.value == "[":
                return self._parse_predicate()
            if nxt.kind is Kind.OP and nxt.value == "." and self.peek(2).kind is Kind.OP \
                    and self.peek(2).value == "@" and t.upper not in RESERVED:
                self.advance()
                self.advance()   # `t` and `.`: `t.@name`
                return self._parse_iface_param(table=t)
            return self._parse_column()
        raise self.unexpected("an expression")

    # --- GS-lite's primaries ------------------------------------------------------------------
    def _typed_literal_follows(self, t: Token, keywords: frozenset[str] | set[str]) -> bool:
        """Whether `t` starts a typed literal `KEYWORD'text'` or, as the Tigon SQL manual
        prints them, `KEYWORD:'text'` (`IPV4_VAL:'1.2.3.4'`)."""
        if t.upper not in keywords:
            return False
        nxt = self.peek()
        if nxt.kind is Kind.OP and nxt.value == ":":
            nxt = self.peek(2)
        return nxt.kind is Kind.STRING

    def _skip_literal_colon(self) -> None:
        """The `:` between a literal's keyword and its string (`IP_VAL:'10.0.0.1'`)."""
        if self.at_op(":") and self.peek().kind is Kind.STRING:
            self.advance()

    def _parse_gslite_literal(self) -> Expr:
        """`HEX'7fff'`, `LHEX'7abcdef012'`, `TIMEVAL '1.5'` (or `HEX:'7fff'`): folded to an
        integer Literal."""
        kw = self.advance()
        self._skip_literal_colon()
        text = self.advance().value
        try:
            value, declared = gslite_literal(kw.upper, text)
        except ValueError as e:
            raise self.error(str(e), kw) from None
        return Literal(pos=self.pos(kw), value=value, kind="int", type=declared)

    def _parse_define_ref(self) -> Expr:
        """`#name`: the value of the query's DEFINE entry `name` (GS-lite's defined literal)."""
        hash_tok = self.advance()
        name = self.expect_name("a DEFINE key after '#', e.g. #port")
        value = self.defines.get(name.value.lower())
        if value is None:
            known = ", ".join(sorted(self.defines)) or "none"
            raise self.error(f"#{name.value}: the query's DEFINE block has no key "
                             f"'{name.value}' (its keys: {known})", hash_tok)
        return DefineRef(pos=self.pos(hash_tok), name=name.value.lower(), value=value)

    def _parse_iface_param(self, table: Token | None = None) -> Expr:
        """`@name` / `t.@name`: a GS-lite interface property (refused by the analyser)."""
        at = self.advance()
        name = self.expect_name("an interface property name after '@', e.g. @Name")
        start = table or at
        return IfaceParam(pos=self.pos(start), name=name.value,
                          table=None if table is None else table.value)

    def _parse_stray_dollar(self) -> Expr:
        raise self.error("'$' must start a parameter name, e.g. $window (or follow an "
                         "aggregate in a GS-lite super-aggregate, count$(*))")

    def _parse_super_aggregate(self) -> Expr:
        """`count$(*)`, `sum$(len)`, `name$(args)`: GS-lite's super-aggregates."""
        name_tok = self.advance()
        self.advance()   # $
        open_tok = self.expect_op("(")
        self._enter(open_tok)
        args: list[Expr] = []
        if self.at_op("*"):
            args.append(Star(pos=self.pos(self.advance())))
        elif not self.at_op(")"):
            args.append(self._parse_expression())
            while self.match_op(","):
                args.append(self._parse_expression())
        self._leave()
        self.expect_op(")", f"to close {name_tok.value}$(...)")
        upper = name_tok.upper
        name = upper if upper in AGGREGATES else name_tok.value.lower()
        return SuperAggregate(pos=self.pos(name_tok), name=name, args=args)

    def _parse_predicate(self) -> Expr:
        """`name[args]`: a GS-lite predicate function (`str_match_offset[0, 'HTTP', data]`)."""
        name_tok = self.advance()
        open_tok = self.expect_op("[")
        self._enter(open_tok)
        args: list[Expr] = []
        if not self.at_op("]"):
            args.append(self._parse_expression())
            while self.match_op(","):
                args.append(self._parse_expression())
        self._leave()
        self.expect_op("]", f"to close the predicate {name_tok.value}[...]")
        return PredicateCall(pos=self.pos(name_tok), name=name_tok.value.lower(), args=args)

    def _parse_paren(self) -> Expr:
        open_tok = self.expect_op("(")
        self._enter(open_tok)
        inner = self._parse_expression()
        self._leave()
        self.expect_op(")", f"to close the '(' at line {open_tok.line}, column {open_tok.col}")
        return inner

    def _parse_column(self) -> Column:
        first = self.expect_name("a column name")
        if self.at_op(".") and self.peek().kind is Kind.IDENT:
            self.advance()
            name = self.expect_name("a column name after '.'")
            return Column(pos=self.pos(first), name=name.value, table=first.value)
        return Column(pos=self.pos(first), name=first.value)

    def _parse_call(self) -> Expr:
        name_tok = self.advance()
        if name_tok.upper in AGGREGATES:
            return self._parse_aggregate(name_tok)
        open_tok = self.expect_op("(")
        if self.at_op("*") and self.peek().kind is Kind.OP and self.peek().value == ")":
            # `name(*)` is an aggregate's call (GS-lite: AGGR '(' '*' ')'), and not one we know
            raise self.error(f"unknown aggregate '{name_tok.value}' (aggregates: "
                             f"{', '.join(sorted(AGGREGATES - {'END_REASON'}))}; only COUNT "
                             f"takes *){did_you_mean(name_tok.value, AGGREGATES)}", name_tok)
        self._enter(open_tok)
        args: list[Expr] = []
        if not self.at_op(")"):
            args.append(self._parse_expression())
            while self.match_op(","):
                args.append(self._parse_expression())
        self._leave()
        self.expect_op(")", f"to close the call to {name_tok.value.lower()}(...)")
        return Func(pos=self.pos(name_tok), name=name_tok.value.lower(), args=args)

    def _parse_aggregate(self, name_tok: Token) -> Expr:
        name = name_tok.upper
        open_tok = self.expect_op("(")
        self._enter(open_tok)
        if name == "END_REASON":
            # flow queries: the flow's end reason, no argument (stored as Star like count(*))
            self._leave()
            self.expect_op(")", "after END_REASON( (it takes no argument)")
            return Aggregate(pos=self.pos(name_tok), name=name, arg=Star(pos=self.pos(open_tok)))
        if self.at_op("*"):
            star = self.advance()
            if name != "COUNT":
                raise self.error(f"only COUNT takes '*'; {name} needs a column or expression",
                                 star)
            arg: Expr = Star(pos=self.pos(star))
        elif self.at_op(")"):
            raise self.error(f"{name} takes one argument"
                             + (" (write COUNT(*) to count rows)" if name == "COUNT" else ""))
        else:
            distinct = self.match_kw("DISTINCT")
            if distinct is not None:
                if name != "COUNT":
                    raise self.error("DISTINCT is only allowed in COUNT(DISTINCT x)", distinct)
                name = "COUNT_DISTINCT"
            arg = self._parse_expression()
        self._leave()
        if self.at_op(","):
            raise self.error(f"{name} takes one argument")
        self.expect_op(")", f"to close {name}(...)")
        window = self._parse_window_spec() if self.at_op("[") else None
        return Aggregate(pos=self.pos(name_tok), name=name, arg=arg, window=window)

    def _parse_boolean(self) -> Expr:
        t = self.advance()
        return Literal(pos=self.pos(t), value=t.upper == "TRUE", kind="bool")

    def _parse_ip_literal(self) -> Expr:
        kw = self.advance()
        version = 6 if kw.upper == "IPV6_VAL" else 4
        self._skip_literal_colon()
        text = self.tok
        if text.kind is not Kind.STRING:
            example = "'2001:db8::1'" if version == 6 else "'10.1.2.3'"
            raise self.unexpected(f"a quoted address after {kw.upper}, e.g. {kw.upper} {example}")
        self.advance()
        address = text.value
        if version == 6 and ":" not in address and address.count(".") == 7:
            # the manual's own IPv6 literals separate the eight groups with dots
            # (IPV6_VAL'0000.2222.4444.6666.8888.aaaa.cccc.eeee')
            address = address.replace(".", ":")
        try:
            value = int(ipaddress.IPv6Address(address) if version == 6
                        else ipaddress.IPv4Address(address))
        except ValueError:
            raise self.error(f"bad IPv{version} address {text.value!r} in {kw.upper}", text) \
                from None
        return Literal(pos=self.pos(kw), value=value, kind="ipv6" if version == 6 else "ip")

    PRIMARY_KEYWORDS.update({
        "TRUE": _parse_boolean, "FALSE": _parse_boolean,
        "IP_VAL": _parse_ip_literal, "IPV6_VAL": _parse_ip_literal,
    })
    PRIMARY_OPERATORS: ClassVar[dict[str, Callable[[ExpressionParser], Expr]]] = {
        "#": _parse_define_ref, "@": _parse_iface_param, "$": _parse_stray_dollar,
    }

    # --- window specs -------------------------------------------------------------------------
    def _parse_window_spec(self) -> WindowSpec:
        """`[item, item ...]`: RANGE d | RANGE ALL, SLIDE d, WA attr, ROWS n, PARTITION BY a, ..."""
        open_tok = self.expect_op("[")
        found: dict = {}
        if self.at_op("]"):
            raise self.error("empty window spec: write e.g. [RANGE 5 minutes, SLIDE 1 minute, "
                             "WA time]")
        while True:
            t = self.tok
            rule = self.WINDOW_ITEMS.get(t.upper)
            if rule is None:
                raise self.unexpected("RANGE, SLIDE, WA, ROWS or PARTITION BY in the window spec")
            rule(self, found)
            if self.match_op(","):
                continue
            if self.at_op("]"):
                break
            if self.tok.upper in self.WINDOW_ITEMS:   # `[PARTITION BY a ROWS 10]`: no comma
                continue
            raise self.unexpected("',' or ']' in the window spec")
        self.advance()
        return WindowSpec(pos=self.pos(open_tok), **found)

    def _window_item(self, found: dict, key: str, value: object, token: Token) -> None:
        if key in found or (key == "range" and "all" in found) or (key == "all" and "range" in found):
            raise self.error(f"{token.upper} given twice in one window spec", token)
        found[key] = value

    def _parse_window_range(self, found: dict) -> None:
        kw = self.advance()
        if self.at_kw("ALL"):
            self.advance()
            self._window_item(found, "all", True, kw)
        else:
            self._window_item(found, "range", self._parse_duration(kw.upper), kw)

    def _parse_window_slide(self, found: dict) -> None:
        kw = self.advance()
        self._window_item(found, "slide", self._parse_duration(kw.upper), kw)

    def _parse_window_attribute(self, found: dict) -> None:
        kw = self.advance()
        name = self.expect_name("the windowing attribute after WA, e.g. WA time")
        text = name.value
        if self.at_op(".") and self.peek().kind is Kind.IDENT:
            self.advance()
            text = f"{text}.{self.expect_name('an attribute name after .').value}"
        self._window_item(found, "wa", text, kw)

    def _parse_window_rows(self, found: dict) -> None:
        kw = self.advance()
        t = self.tok
        if t.kind is not Kind.INT:
            raise self.unexpected("a row count after ROWS, e.g. ROWS 1000")
        self.advance()
        self._window_item(found, "rows", t.value, kw)

    def _parse_window_partition(self, found: dict) -> None:
        kw = self.advance()
        self.expect_kw("BY", "after PARTITION")
        columns = [self._parse_column()]
        while self.at_op(",") and self.peek().upper not in self.WINDOW_ITEMS:
            self.advance()
            columns.append(self._parse_column())
        self._window_item(found, "partition_by", columns, kw)

    def _parse_duration(self, what: str) -> Duration:
        t = self.tok
        if t.kind not in (Kind.INT, Kind.FLOAT):
            raise self.unexpected(f"a length after {what}, e.g. {what} 5 minutes")
        self.advance()
        unit = self.tok
        if unit.kind is not Kind.IDENT:
            raise self.unexpected(f"a time unit after {t.value} ({WINDOW_UNITS_HINT})")
        if unit.value.lower() not in Duration.UNIT_NS:
            hint = " (for a count-based window write [ROWS n])" if unit.upper == "ROWS" else ""
            raise self.error(f"unknown time unit '{unit.value}': use {WINDOW_UNITS_HINT}{hint}",
                             unit)
        self.advance()
        return Duration(pos=self.pos(t), value=t.value, unit=unit.value.lower())

    WINDOW_ITEMS.update({
        "RANGE": _parse_window_range, "SLIDE": _parse_window_slide,
        "WA": _parse_window_attribute, "WATTR": _parse_window_attribute,
        "ROWS": _parse_window_rows, "PARTITION": _parse_window_partition,
    })
