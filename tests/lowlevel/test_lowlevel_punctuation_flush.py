"""`punctuation_flush` (the appliance's low level): a pane's groups leave the table as soon as
punctuation closes it, so the operator's punctuation follows its input's, with the same
combined partial rows as the lazy policy's smoothed flush."""

from __future__ import annotations

from collections import Counter

import pytest

from common.spool import FINAL
from lowlevel.operator import HOLD_ROWS, LowLevelOperator
from queries.planner import plan_text
from tests.oracles.samples import random_batch

NS = 10**9
QUERY = """
DEFINE { query_name persec; flush %s; aggregate_slots 256; }
SELECT tb, srcIP, count(*) AS n, sum(len) AS bytes FROM main.IPV4 GROUP BY time AS tb, srcIP;
"""


def _add(sums: Counter, d: dict) -> None:
    """Partial rows summed per (window, keys, state): the combined rows, whatever the flush."""
    keys = [c for c in d if c == "window" or c.startswith("srcIP")]
    # the final flags differ with the flush: which rows leave before their pane closes
    states = [c for c in d if c not in keys and c != FINAL]
    for i in range(len(d["window"])):
        k = tuple(d[c][i] for c in keys)
        for c in states:
            sums[k + (c,)] += d[c][i]


@pytest.mark.parametrize("policy", ["oop_lazy", "oop_slow"])
def test_punctuation_flush_follows_the_input_and_keeps_the_sums(policy):
    batch = random_batch(20_000, seed=3, span_s=20, hosts=200)
    ts = batch["timestamp"]
    lp = plan_text(QUERY % policy, ["main"]).query("persec").low[0]
    results, lags = {}, {}
    for eager in (False, True):
        op = LowLevelOperator(lp, hold_rows=HOLD_ROWS, punctuation_flush=eager)
        sums: Counter = Counter()
        lag = []
        start = int(ts.min()) // NS * NS
        for k in range(1, 22):
            upto = start + k * NS + 7 * NS // 10
            chunk = batch.take((ts >= upto - NS) & (ts < upto))
            rows = list(op.process(chunk))
            more, out = op.punctuate(upto)
            for rb in rows + list(more):
                d = rb.to_pydict()
                _add(sums, d)
            if out is not None:
                lag.append((upto // NS * NS - out) // NS)
        rows, _ = op.finish()
        for rb in rows:
            d = rb.to_pydict()
            _add(sums, d)
        results[eager], lags[eager] = sums, lag
    assert results[True] == results[False] and sum(results[True].values()) > 0
    assert max(lags[True]) <= 0            # up to the pane the punctuation is in
    assert max(lags[False]) >= 1           # the lazy policy lags (by design)
