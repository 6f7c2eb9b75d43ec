"""GS-lite's FILTER_JOIN: a semi-join of a result stream R with a match stream S on keys and time.

Tigon SQL manual 6.2.10: `SELECT ... FILTER_JOIN(t, n) FROM P1 R, P2 S WHERE ...` passes the
rows of R (the first source, the *result* stream) that match a row of S (the second, the
*match* stream) on the equality predicates within `S.t <= R.t <= S.t + n` (n ticks of the
temporal field t, which both sources have). Its rules, each an error here at its place:

1. the SELECT list reads R only;
2. at least one join predicate `(expression of R) = (expression of S)`;
3. no join predicate on the temporal fields (the window is FILTER_JOIN's);
4. every other predicate reads one source (GS-lite: "join predicates in a filter join should
   have the form (scalar expression in R) = (scalar expression in S)").

GS-lite evaluates it approximately, with Bloom filters (false positives) or a limited hash
table (`DEFINE algorithm hash`: false negatives); here it is exact: each row of R that has
a match passes once, whatever the number of its matches. It runs as a band join of the
OA-Join (`highlevel.join`, JoinPlan type "semi") with RANGE 1 tick on R and n on S: l joins
r iff `l.t - n <= r.t < l.t + 1`, that is `S.t <= R.t <= S.t + n`.
"""

from __future__ import annotations

from queries import expressions as E
from queries.analysed import AnalysedQuery, ItemInfo, QueryAnalyser
from queries.inference import conjoin, conjuncts, sides_of, unit_ns
from queries.naming import generated_name, unique_names
from queries.scope import Scope


def analyse_filter_join(an: QueryAnalyser, aq: AnalysedQuery, stmt: E.Select,
                        scope: Scope) -> None:
    """Fill `aq` (an AnalysedQuery of kind "join", join "FILTER_JOIN") for `stmt`; `an` is
    the analyser (its `error`, `form_of`, `type_of`)."""
    fj = stmt.filter_join
    assert fj is not None
    if stmt.group_by or stmt.having is not None or \
            any(True for it in stmt.items for _ in it.find_all(E.Aggregate)):
        raise an.error(stmt, "a FILTER_JOIN cannot aggregate: aggregate its result in a "
                       "further query that reads it")
    for s in aq.sources:
        if s.node.window is not None:
            raise an.error(s.node.window, "a FILTER_JOIN source takes no window: "
                           "FILTER_JOIN(field, n) gives the time range")
    result, match = aq.sources
    units = []
    for s in (result, match):
        field = scope.resolve(E.Column(pos=fj.column.pos, name=fj.column.name, table=s.alias),
                              "FILTER_JOIN")
        assert isinstance(field, E.Field)   # a column resolves to a Field
        form = an.form_of(field)
        unit = None if form is None else unit_ns(form)
        if form is None or unit is None:
            raise an.error(fj.column, f"FILTER_JOIN's field {fj.column.name!r} must be an "
                           f"increasing (temporal) field of both sources; of {s.alias} it is not")
        s.wa = field
        units.append(unit)
    if units[0] != units[1]:
        raise an.error(fj.column, f"FILTER_JOIN's field {fj.column.name!r} counts different "
                       f"units in {result.alias} and {match.alias}")
    if fj.range <= 0:
        raise an.error(fj, "FILTER_JOIN's duration must be a positive integer")
    # one tick on R and n on S: l joins r iff l.t - n <= r.t < l.t + 1 (JoinPlan's band)
    result.window_ns = units[0]
    match.window_ns = units[1] * fj.range
    if stmt.where is None:
        raise an.error(stmt.sources[1], "a FILTER_JOIN needs a WHERE with at least one "
                       "predicate (expression of R) = (expression of S)")
    left, right = result.alias, match.alias
    single = []
    for c in conjuncts(aq.where):
        sides = sides_of(c)
        if len(sides) <= 1:
            single.append(c)
            continue
        pair = None
        if isinstance(c, E.Binary) and c.op == "=":
            ls, rs = sides_of(c.left), sides_of(c.right)
            pair = (c.left, c.right) if (ls, rs) == ({left}, {right}) else \
                (c.right, c.left) if (ls, rs) == ({right}, {left}) else None
        if pair is None:
            raise an.error(c, f"a FILTER_JOIN's join predicates have the form (expression of "
                           f"{left}) = (expression of {right}); other conditions read one source")
        if an.form_of(pair[0]) is not None and an.form_of(pair[1]) is not None:
            raise an.error(c, f"a FILTER_JOIN takes no join predicate on temporal fields: "
                           f"FILTER_JOIN({fj.column.name}, {fj.range}) gives the time range")
        aq.join_keys.append(pair)
    if not aq.join_keys:
        raise an.error(stmt.where, f"a FILTER_JOIN needs at least one predicate (expression "
                       f"of {left}) = (expression of {right}) (the match key)")
    aq.join_residual = conjoin(single)
    names = unique_names([(it.alias, generated_name(it.this, i))
                          for i, it in enumerate(stmt.items)])
    for it, nm in zip(stmt.items, names):
        expr = scope.resolve(it.this, "SELECT")
        if any(f.table == right for f in expr.find_all(E.Field)):
            raise an.error(it, f"a FILTER_JOIN's SELECT list reads the result stream "
                           f"{left} only ({right} is the match stream)")
        aq.items.append(ItemInfo(nm, expr, an.type_of(expr), an.form_of(expr), it))
