"""The reads-from graph of a file's queries: the order to analyse and plan them in, and its cycles.

GS-lite lets a query read any query of its query set, defined earlier or later (the manual's
own example, 6.3, reads `tcp_pkts` before defining it); its compiler sorts the queries
topologically and refuses a cyclic reads-from dependency (translate_fta.cc). oopscope does the
same: queries come in dependency order, in file order wherever the graph leaves a choice, and a
cycle is an error at the FROM item that closes it, naming every query of the cycle.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from queries import expressions as E
from queries.errors import QueryError

#: error(query, node, message): a QueryError located at `node` of `query`
ErrorIn = Callable[[E.Query, E.Node, str], QueryError]


def reads(query: E.Query, names: dict[str, int]) -> list[tuple[int, E.Source]]:
    """The queries of the file `query` reads (their index in `names`), with the FROM item."""
    statement = query.statement
    out = []
    for source in getattr(statement, "sources", None) or []:
        if source.query is not None and source.query in names:
            out.append((names[source.query], source))
    return out


def dependency_order(queries: list[E.Query], names: list[str], error: ErrorIn) -> list[int]:
    """Indices of `queries` (named `names`) with every query after the queries it reads.

    A query reading itself is left to the analyser (its own message); a longer cycle is a
    QueryError at the FROM item of the cycle's first query (in file order) that reads the next.
    """
    index = {name: k for k, name in enumerate(names)}
    edges = {k: [(j, s) for j, s in reads(q, index) if j != k] for k, q in enumerate(queries)}
    waiting = {k: len({j for j, _ in deps}) for k, deps in edges.items()}
    readers: dict[int, list[int]] = {k: [] for k in edges}
    for k, deps in edges.items():
        for j in {j for j, _ in deps}:
            readers[j].append(k)
    ready = [k for k, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for r in readers[k]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) < len(queries):
        _raise_cycle({k for k in edges if k not in set(order)}, edges, queries, names, error)
    return order


def _raise_cycle(left: set[int], edges: dict[int, list[tuple[int, E.Source]]],
                 queries: list[E.Query], names: list[str], error: ErrorIn) -> None:
    """Follow reads-from edges among the queries left unordered until one repeats."""
    path = [min(left)]
    while True:
        k = path[-1]
        nxt = min(j for j, _ in edges[k] if j in left)
        if nxt in path:
            cycle = path[path.index(nxt):]
            break
        path.append(nxt)
    first = min(cycle)
    start = cycle.index(first)
    cycle = cycle[start:] + cycle[:start]
    target = cycle[1] if len(cycle) > 1 else cycle[0]
    source = next(s for j, s in edges[first] if j == target)
    shown = " -> ".join(repr(names[k]) for k in cycle + [first])
    raise error(queries[first], source,
                f"queries read each other in a cycle: {shown} (each reads the next; a query "
                f"may read any query of the file, but not one that depends on it)")
