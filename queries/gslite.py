"""GS-lite's GSQL in oopscope: its literal forms, the names it knows, and located errors for what we do not run.

Sources: the Tigon SQL user manual (2014), chapter 6 (literals table, operators, DEFINE) and
chapter 12 (external functions), and GS-lite's own compiler (o-ran-sc/com-gs-lite,
`src/ftacmp/fta.l` and `fta.y` for the syntax, `parse_fta.h` for what a literal means,
`cfg/external_fcns.def` for its functions, predicates and aggregates). The parser builds tree
nodes for GS-lite's constructs (`expressions.SuperAggregate`, `PredicateCall`, `IfaceParam`,
`GroupingPattern`, `ExtraClause`, `FilterJoin`); `check_constructs` refuses them before the
analyser resolves anything, so a GS-lite query gets "GS-lite construct X is not supported yet"
at its line and column instead of a misleading message about its parts.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from queries import expressions as E
from queries import types as T
from queries.errors import QueryError
from queries.stateful import STATEFUL_FUNCTIONS
from queries.string_functions import STRING_FUNCTIONS
from queries.udf import FunctionLibrary

UINT_MAX = 2**32 - 1
ULLONG_MAX = 2**64 - 1
LLONG_MAX = 2**63 - 1

# --- literals ---------------------------------------------------------------------------------

#: GS-lite's literal keywords, each followed by a quoted string (fta.l: `HEX`, `LHEX`, `TIMEVAL`,
#: upper case only there; keywords are case-insensitive here)
LITERAL_KEYWORDS = frozenset({"HEX", "LHEX", "TIMEVAL"})
#: the names of those tokens in GS-lite's grammar, which older oopscope docs gave as spellings
TOKEN_NAMES = {"HEX_L": "HEX", "LHEX_L": "LHEX", "TIMEVAL_L": "TIMEVAL"}

_HEX_DIGITS = re.compile(r"^[0-9A-Fa-f]+$")
_DECIMAL = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")


def gslite_literal(keyword: str, text: str) -> tuple[int, str | None]:
    """(value, declared type or None) of `HEX'..'`, `LHEX'..'` or `TIMEVAL '..'` (ValueError
    with the message when the text is not one).

    - `HEX'7fff'`: a uint from hexadecimal digits (parse_fta.h converts it to an unsigned int);
    - `LHEX'7abcdef012'`: a ullong from hexadecimal digits;
    - `TIMEVAL '12.5'`: GS-lite's timeval, a (seconds, milliseconds) pair built from a decimal
      number of seconds (parse_fta.h: `secs = floor(x)`, `ms = rint(frac * 1000)`). oopscope
      has no timeval type: it is the nearest one, an llong count of nanoseconds like the
      `timestamp` field, rounded to the millisecond as GS-lite rounds it.
    """
    if keyword in TOKEN_NAMES:
        raise ValueError(f"{keyword} is the name of GS-lite's token, not its spelling: write "
                         f"{TOKEN_NAMES[keyword]}'{text}'")
    digits = text.strip()
    if keyword in ("HEX", "LHEX"):
        if not _HEX_DIGITS.match(digits):
            raise ValueError(f"{keyword}'{text}' is not hexadecimal digits (e.g. "
                             f"{keyword}'7fff')")
        value = int(digits, 16)
        if keyword == "HEX" and value > UINT_MAX:
            raise ValueError(f"HEX'{text}' does not fit in a uint (at most HEX'ffffffff'): "
                             f"write LHEX'{text}' for a ullong")
        if value > ULLONG_MAX:
            raise ValueError(f"LHEX'{text}' does not fit in 64 bits")
        return value, ("ullong" if keyword == "LHEX" and value <= UINT_MAX else None)
    if not _DECIMAL.match(digits):
        raise ValueError(f"TIMEVAL '{text}' is not a number of seconds (e.g. TIMEVAL '12.5')")
    try:
        ms = int(round(Decimal(digits) * 1000))   # half to even, as GS-lite's rint
    except InvalidOperation:
        raise ValueError(f"TIMEVAL '{text}' is not a number of seconds") from None
    ns = ms * 10**6
    if not -LLONG_MAX - 1 <= ns <= LLONG_MAX:
        raise ValueError(f"TIMEVAL '{text}' does not fit in 64-bit nanoseconds")
    return ns, "llong"


def timeval_text(ns: int) -> str:
    """The `TIMEVAL '...'` literal for a nanosecond count that is a whole number of ms."""
    ms = abs(ns) // 10**6
    sign = "-" if ns < 0 else ""
    return f"TIMEVAL '{sign}{ms // 1000}.{ms % 1000:03d}'"


# --- names GS-lite knows ----------------------------------------------------------------------

#: GS-lite's predicate functions (`name[args]`): cfg/external_fcns.def (PRED entries) and the
#: manual's chapters 12 and 13
PREDICATES = frozenset({
    "str_exists_substr", "str_compare", "str_match_offset", "byte_match_offset",
    "byte_match_reverse_offset", "net_word_match_offset", "little_endian_word_match_offset",
    "str_regex_match", "str_partial_regex_match", "set_local_trigger", "check_local_trigger",
})

#: GS-lite scalar functions we do not have (external_fcns.def FUN entries, manual chapters 12
#: and 13; its predicates are functions too, returning 1 or 0) -> a hint, or "". Those we have
#: are in `queries.types.FUNCTIONS` (the library: `queries.function_library`), which is
#: consulted first; a declarations file (`queries.udf`) may add any other.
FUNCTIONS = {
    **{name: "" for name in PREDICATES},
    "str_between_substrings": "", "pack": "",
    "timestamptosec": "timestamp is in nanoseconds here: use the time field",
    "timestamptomsec": "use the timestamp_ms field",
    "moving_sum_extract": "", "moving_sum_extract_exp": "", "extr_avg_fcn": "",
    "extr_quant_hfta0_fcn": "", "extr_med_hfta0_fcn": "", "extr_quant_hfta0_space": "",
}

#: GS-lite's stateful functions (SFUN entries: sampling state of a SUPERGROUP)
STATEFUL = frozenset({
    "ssample", "packet_count", "gamma", "do_clean_count", "init_threshold", "delay",
    "newly_closed", "local_count", "current_bucket",
    # the subset-sum and flow sampling of the manual's chapters 14-15
    "ssthreshold", "ssdo_clean", "ssclean_with", "ssfinal_clean", "flow_ssample",
    "flow_ssthreshold", "flow_ssdo_clean", "flow_ssclean_with", "flow_ssfinal_clean",
    "nssample",
})

#: GS-lite's user-defined aggregates and aggregate extraction functions (UDAF and EXTR entries
#: of external_fcns.def; moving_avg from the manual's running-aggregation example)
AGGREGATES = frozenset({
    "moving_avg", "moving_sum", "moving_sum_exp", "moving_sum_udaf", "super_moving_sum_udaf",
    "moving_sum_lfta", "posavg", "avg_udaf", "avg_udaf_hfta", "avg_udaf_lfta", "extr_avg",
    "quantile_of", "median_of", "qspace_of", "quant_udaf_hfta0", "quant_udaf_hfta3",
    "quant_udaf_lfta3", "running_array_aggr", "running_array_aggr_hfta",
    "running_array_aggr_lfta",
})

# --- the check --------------------------------------------------------------------------------

ErrorAt = Callable[[E.Node, str], QueryError]


def check_constructs(statement: E.Node, error: ErrorAt,
                     library: FunctionLibrary | None = None) -> None:
    """Refuse the first GS-lite construct of `statement` (a Select or Merge) that oopscope
    parses but does not run, and any call of an unknown function or aggregate, with a
    located QueryError made by `error(node, message)`. A name `library` declares (user
    functions, `queries.udf`) is its to judge."""
    found: list[tuple[tuple[int, int], E.Node, str]] = []
    aggregating = _aggregating(statement)
    group_names = _group_names(statement)
    clause_nodes = _select_and_having(statement) if aggregating else []
    for node in statement.walk():
        verdict = None if library is None else library.verdict(node)
        message = (verdict or None) if verdict is not None else \
            _message(node, aggregating, group_names, clause_nodes)
        if message is not None:
            where = node.pos or (0, 0)
            found.append(((where[0], where[1]), node, message))
    if found:
        _, node, message = min(found, key=lambda f: f[0])
        raise error(node, message)


def _message(node: E.Node, aggregating: bool, group_names: set[str],
             clause_nodes: list[E.Node]) -> str | None:
    if isinstance(node, E.ExtraClause):
        return None     # run (`Analyser._slack`, `_closing`, `queries.sampling`)
    if isinstance(node, E.SuperAggregate):
        return None     # a sampling query's (`queries.sampling`)
    if isinstance(node, E.IfaceParam):
        return (f"GS-lite construct interface property @{node.name} is not supported (an "
                f"interface's properties come from GS-lite's ifres.xml, which oopscope has "
                f"no counterpart of)")
    if isinstance(node, E.PredicateCall):
        if node.name in STRING_FUNCTIONS and STRING_FUNCTIONS[node.name].predicate:
            return None
        why = ("GS-lite's predicates are not supported yet" if node.name in PREDICATES
               else "oopscope has no predicate functions")
        return (f"GS-lite predicate {node.name}[...] is not known ({why}; write the condition "
                f"with comparisons, AND, OR, NOT)")
    if isinstance(node, E.Func):
        return _function_message(node, aggregating, group_names, clause_nodes)
    return None


def _function_message(node: E.Func, aggregating: bool, group_names: set[str],
                      clause_nodes: list[E.Node]) -> str | None:
    name = node.name.lower()
    if name in T.FUNCTIONS:
        return None
    if name in AGGREGATES:
        return (f"aggregate {name} is not supported yet (a GS-lite user-defined aggregate; "
                f"aggregates: {_aggregate_list()})")
    if name in STATEFUL_FUNCTIONS:
        return None     # a sampling query's (`queries.sampling`)
    if name in STATEFUL:
        return (f"function {name} is not supported yet (a GS-lite stateful function; "
                f"supported: {', '.join(sorted(STATEFUL_FUNCTIONS))})")
    if name in FUNCTIONS:
        hint = FUNCTIONS[name]
        return f"function {name} is not supported yet" + (f": {hint}" if hint else "")
    if aggregating and _reads_input(node, group_names) and \
            any(node is n for top in clause_nodes for n in top.walk()):
        close = difflib.get_close_matches(name.upper(), T.AGGREGATES, n=2)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        return f"unknown aggregate '{node.name}' (aggregates: {_aggregate_list()}){hint}"
    aggregates = {a.lower(): a for a in T.AGGREGATES}
    close = difflib.get_close_matches(name, list(T.FUNCTIONS) + list(aggregates), n=2)
    shown: list[str] = [aggregates[c] if c in aggregates else c for c in close]
    hint = f"; did you mean {' or '.join(shown)}?" if close else ""
    return (f"unknown function '{node.name}' (functions: {', '.join(sorted(T.FUNCTIONS))})"
            f"{hint}")


def _aggregate_list() -> str:
    return ", ".join(a for a in T.AGGREGATES if a != "END_REASON") + ", END_REASON()"


def _aggregating(statement: E.Node) -> bool:
    if not isinstance(statement, E.Select):
        return False
    if statement.group_by:
        return True
    places = [*statement.items, statement.having, *_conditions(statement)]
    return any(True for p in places if p is not None for _ in p.find_all(E.Aggregate))


def _group_names(statement: E.Node) -> set[str]:
    names: set[str] = set()
    if isinstance(statement, E.Select):
        for g in statement.group_by or []:
            items = [g] if isinstance(g, E.GroupItem) else \
                [i for s in g.sets for i in s] if isinstance(g, E.GroupingPattern) else []
            for i in items:
                names.add(i.alias or (i.this.name if isinstance(i.this, E.Column) else ""))
    return names


def _select_and_having(statement: E.Node) -> list[E.Node]:
    """The clauses of an aggregation that read groups (aggregates and group items)."""
    assert isinstance(statement, E.Select)
    return [*statement.items] + ([statement.having] if statement.having is not None else []) \
        + _conditions(statement)


def _conditions(statement: E.Select) -> list[E.Node]:
    """The conditions of GS-lite's further clauses (CLOSING_WHEN, CLEANING_WHEN/BY)."""
    return [c.this for c in statement.extra or [] if c.this is not None]


def _reads_input(node: E.Func, group_names: set[str]) -> bool:
    """Whether a call reads a column of its input that is not a group item (outside any
    aggregate): in SELECT or HAVING of an aggregation, only an aggregate may."""
    def walk(n: E.Node):
        if isinstance(n, (E.Aggregate, E.SuperAggregate)):
            return
        yield n
        for child in n.children():
            yield from walk(child)

    return any(isinstance(n, E.Column) and (n.table is not None or n.name not in group_names)
               for n in walk(node))
