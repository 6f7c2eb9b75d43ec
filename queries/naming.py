"""Names of output columns: generated names for unnamed SELECT items, unique within a query."""

from __future__ import annotations

from queries import expressions as E

_AGG_PREFIX = {"COUNT": "COUNT", "SUM": "SUM", "MIN": "MIN", "MAX": "MAX", "AVG": "AVG",
               "AND_AGGR": "AND", "OR_AGGR": "OR", "XOR_AGGR": "XOR", "FIRST": "FIRST",
               "LAST": "LAST", "COUNT_DISTINCT": "COUNT_DISTINCT"}


def _columns_of(expr: E.Node) -> list[str]:
    names = []
    for n in expr.walk():
        if isinstance(n, (E.Column, E.Field)) and n.name not in names:
            names.append(n.name)
    return names


def generated_name(expr: E.Node, index: int) -> str:
    """`Cnt` for count(*), `SUM_len`, `MAX_ttl`, `AVG_len`; a column's own name; else `col<i>`.

    `index` is the item's 0-based position (the fallback is 1-based: col1, col2 ...).
    """
    if isinstance(expr, (E.Column, E.Field)):
        return expr.name
    if isinstance(expr, E.Aggregate):
        name = expr.name.upper()
        if name == "END_REASON":
            return "end_reason"
        if isinstance(expr.arg, E.Star):
            return "Cnt"
        cols = _columns_of(expr.arg)
        return f"{_AGG_PREFIX.get(name, name)}_{'_'.join(cols[:2])}" if cols else name
    if isinstance(expr, E.Func) and expr.args["args"]:
        inner = generated_name(expr.args["args"][0], index)
        if not inner.startswith("col"):
            return f"{expr.name.lower()}_{inner}"
    return f"col{index + 1}"


def unique_names(wanted: list[tuple[str | None, str]]) -> list[str]:
    """Final names for (alias, generated) pairs: aliases are kept; generated names get `_2`,
    `_3` ... when they collide with an alias or an earlier name."""
    taken = {a for a, _ in wanted if a}
    out = []
    for alias, gen in wanted:
        if alias:
            out.append(alias)
            continue
        name, k = gen, 2
        while name in taken:
            name, k = f"{gen}_{k}", k + 1
        taken.add(name)
        out.append(name)
    return out
