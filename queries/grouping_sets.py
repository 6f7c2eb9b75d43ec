"""GS-lite's extended group-by patterns: CUBE, ROLLUP and GROUPING_SETS in GROUP BY.

Tigon SQL manual 6.2.11.2: a GROUP BY clause is a list of *entries*, each a plain group
item (one pattern: the item present) or a CUBE (every subset of its items), a ROLLUP (the
n + 1 prefixes of its items) or a GROUPING_SETS (exactly the listed sets). The query's
patterns are the product of its entries' patterns; a record updates one group per pattern,
the variables absent from the pattern holding their type's default value (manual Table 6:
0, 0.0, FALSE, '', 0.0.0.0). Groups of different patterns stay distinct even when their
values coincide: the plan keeps a hidden pattern-id key (`queries.planner`).

`expand(group_by, error)` flattens the clause into its group items (each name once, in
order) and the patterns (tuples of the names present); `default_literal(type)` is the
absent value of a type.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from queries import expressions as E
from queries.errors import QueryError

#: patterns a query may have (a CUBE of n items has 2^n): each costs one pass of the
#: low-level kernel per packet batch
MAX_PATTERNS = 4096


@dataclass(frozen=True)
class Expansion:
    """The group items of a GROUP BY (each variable once, in clause order), and its patterns:
    per pattern the names present, in item order. `patterns` is None for a plain clause."""

    items: tuple[E.GroupItem, ...]
    patterns: tuple[tuple[str, ...], ...] | None


def item_name(g: E.GroupItem) -> str | None:
    """The variable a group item defines: its alias, or the column's own name."""
    if g.alias:
        return g.alias
    return g.this.name if isinstance(g.this, E.Column) else None


def _entry_patterns(node: E.Node) -> list[list[E.GroupItem]]:
    if isinstance(node, E.GroupItem):
        return [[node]]
    assert isinstance(node, E.GroupingPattern)
    if node.kind == "CUBE":
        items = node.sets[0]
        # largest subsets first, as the manual lists them: (a, b), (a, -), (-, b), (-, -)
        return [[g for g, keep in zip(items, mask) if keep]
                for mask in itertools.product((True, False), repeat=len(items))]
    if node.kind == "ROLLUP":
        items = node.sets[0]
        return [items[:k] for k in range(len(items), -1, -1)]
    return [list(s) for s in node.sets]


def expand(group_by: list[E.Node], error: Callable[[E.Node, str], QueryError]) -> Expansion:
    """Flatten a GROUP BY clause; errors (made by `error(node, message)`): a variable in two
    entries (manual 6.2.11.2), a variable twice in one CUBE / ROLLUP / grouping set, a name
    given two different expressions, more than MAX_PATTERNS patterns."""
    if not any(isinstance(g, E.GroupingPattern) for g in group_by):
        return Expansion(tuple(g for g in group_by if isinstance(g, E.GroupItem)), None)
    items: dict[str, E.GroupItem] = {}
    entry_of: dict[str, int] = {}
    per_entry: list[list[tuple[str, ...]]] = []
    for index, entry in enumerate(group_by):
        patterns = _entry_patterns(entry)
        sets = [[entry]] if isinstance(entry, E.GroupItem) else \
            (entry.sets if entry.kind == "GROUPING_SETS" else [entry.sets[0]])
        for s in sets:
            seen: set[str] = set()
            for g in s:
                name = item_name(g)
                if name is None:
                    raise error(g, "a GROUP BY expression needs a name: write `expr AS name`")
                if name in seen:
                    what = "grouping set" if isinstance(entry, E.GroupingPattern) and \
                        entry.kind == "GROUPING_SETS" else entry.kind
                    raise error(g, f"group-by variable {name!r} appears twice in one {what}")
                seen.add(name)
                if name in entry_of and entry_of[name] != index:
                    raise error(g, f"group-by variable {name!r} is referenced in two entries "
                                f"of GROUP BY: a variable may stand in one entry only (a plain "
                                f"item, or one CUBE, ROLLUP or GROUPING_SETS)")
                entry_of[name] = index
                known = items.get(name)
                if known is None:
                    items[name] = g
                elif g.alias is not None and known.alias is not None and g.this != known.this:
                    raise error(g, f"group-by variable {name!r} is defined twice with different "
                                f"expressions")
                elif known.alias is None and g.alias is not None:
                    items[name] = g
        per_entry.append([tuple(item_name(g) or "" for g in p) for p in patterns])
    count = 1
    for p in per_entry:
        count *= len(p)
    if count > MAX_PATTERNS:
        raise error(next(g for g in group_by if isinstance(g, E.GroupingPattern)),
                    f"GROUP BY makes {count} grouping patterns; at most {MAX_PATTERNS}")
    order = list(items)
    result: list[tuple[str, ...]] = []
    for combo in itertools.product(*per_entry):
        present = {n for part in combo for n in part}
        pattern = tuple(n for n in order if n in present)
        if pattern not in result:
            result.append(pattern)
    return Expansion(tuple(items.values()), tuple(result))


def default_literal(type_: str) -> E.Expr:
    """The value a variable absent from a pattern takes (manual Table 6's defaults)."""
    if type_ == "ip":
        return E.Literal(value=0, kind="ipv6")
    if type_ == "ipv4":
        return E.Literal(value=0, kind="ip")
    if type_ == "bool":
        return E.Literal(value=False, kind="bool")
    if type_ == "float":
        return E.Literal(value=0.0, kind="float")
    if type_ == "string":
        return E.Literal(value="", kind="string")
    if type_ in ("int", "llong"):
        return E.Literal(value=0, kind="int", type=type_)
    return E.Literal(value=0, kind="int", type=type_ if type_ in ("uint", "ullong", "mac") else None)


def format_pattern(pattern: tuple[str, ...], names: list[str]) -> str:
    """`(srcIP, -)`: a pattern over the grouping variables `names`, '-' for absent ones."""
    return "(" + ", ".join(n if n in pattern else "-" for n in names) + ")"
