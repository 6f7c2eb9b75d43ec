"""OA-Join invariants, batch by batch: equal to a nested-loop join, nothing twice, purges
and punctuation correct, for several interleavings and skews of the two inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.spool import SpoolWriter
from highlevel.join import JoinSpec, JoinStage
from highlevel.stagebuilder import output_columns_of
from highlevel.testing import ListSink, batch_frame, canonical_rows
from queries.planner import plan_text
from tests.oracles.reference import evaluate_file
from tests.oracles.samples import random_batch

MINUTE = 60 * 10**9
END = (1 << 63) - 1
FLOW_JOIN = Path(__file__).parent / "queries" / "flow_join.gsql"


@pytest.fixture(scope="module")
def flows():
    fp = plan_text(FLOW_JOIN.read_text(), ["main", "other"])
    batches = {"main": random_batch(600, seed=11, span_s=360, hosts=4),
               "other": random_batch(600, seed=12, link="other", span_s=360, hosts=7)}
    ref = evaluate_file(fp, batches)
    return fp, ref["up"], ref["down"]


def _side_files(writer, frame, alias):
    """One file per minute of an upstream query's rows, then its punctuation (window end)."""
    files = []
    for tb in sorted(frame.tb.unique()):
        rows = frame[frame.tb == tb]
        table = pa.table({"window": pa.array((rows.tb.to_numpy().astype(np.int64) + 1)
                                              * MINUTE),
                          **{f"{alias}__{c}": pa.array(rows[c].to_numpy().astype(np.uint64)
                                                       .view(np.int64))
                             for c in ("tb", "srcIP", "destIP", "Cnt")}})
        files.append((writer.write(table, (int(tb) + 1) * MINUTE), rows))
    files.append((writer.write(None, END), rows.iloc[:0]))
    return files


def _nested_loop(up, down):
    out = []
    matched_a, matched_b = set(), set()
    for i, a in enumerate(up.itertuples()):
        for j, b in enumerate(down.itertuples()):
            if a.tb == b.tb and a.srcIP == b.destIP and a.destIP == b.srcIP:
                out.append((a.tb, a.srcIP, a.destIP, a.Cnt, b.Cnt))
                matched_a.add(i)
                matched_b.add(j)
    out += [(a.tb, a.srcIP, a.destIP, a.Cnt, None) for i, a in enumerate(up.itertuples())
            if i not in matched_a]
    # GS-lite fills the absent side's columns its equalities equate with the present side's
    out += [(b.tb, b.destIP, b.srcIP, None, b.Cnt) for j, b in enumerate(down.itertuples())
            if j not in matched_b]
    return pd.DataFrame(out, columns=["tb", "srcIP", "destIP", "Cnt", "back"])


@pytest.mark.parametrize("order", ["interleaved", "b_lags"])
@pytest.mark.slow
def test_oa_join_batch_by_batch(spark, tmp_path, flows, order):
    fp, up, down = flows
    h = fp.query("flows").high
    columns = {"a": output_columns_of(fp.query("up")), "b": output_columns_of(fp.query("down"))}
    sink = ListSink()
    spec = JoinSpec("flows", h.join, columns, [(o.name, o.expr, o.type) for o in h.outputs])
    stage = JoinStage(spec, tmp_path / "spool", tmp_path / "ck", [sink], spark=spark)
    a = _side_files(SpoolWriter(tmp_path / "spool", "flows", "a"), up, "a")
    b = _side_files(SpoolWriter(tmp_path / "spool", "flows", "b"), down, "b")
    rng = np.random.default_rng(len(order))
    if order == "a_first":
        seq = [("a", f) for f in a] + [("b", f) for f in b]
    elif order == "b_lags":      # b two minutes behind a
        seq = [("a", f) for f in a[:2]]
        for k in range(2, max(len(a), len(b)) + 2):
            seq += [("a", f) for f in a[k:k + 1]] + [("b", f) for f in b[k - 2:k - 1]]
    else:
        picks = rng.permutation(["a"] * len(a) + ["b"] * len(b))
        it = {"a": iter(a), "b": iter(b)}
        seq = [(s, next(it[s])) for s in picks]
    cuts = np.array_split(np.arange(len(seq)), 4)
    fed_batches = [[seq[i] for i in cut] for cut in cuts]
    puncts = []
    for batch_id, chunk in enumerate(fed_batches):
        stage.process_batch(batch_frame(spark, stage.spec, [f[1][0] for f in chunk]), batch_id)
        puncts.append(stage.state.punctuation)
        # purge rule: a row fed so far but no longer stored never meets a later partner
        later = {s: pd.concat([f[1][1] for f in sum(fed_batches[batch_id + 1:], [])
                               if f[0] == s] or [up.iloc[:0]]) for s in "ab"}
        for side, other in (("a", "b"), ("b", "a")):
            d = stage.state.extra.get(f"{'l' if side == 'a' else 'r'}_dir")
            stored = pq.read_table(stage.state_root / d).to_pandas() if d else pd.DataFrame()
            kept = set(zip(stored.get(f"{side}__tb", []),
                           stored.get(f"{side}__srcIP", []))) if len(stored) else set()
            fed = pd.concat([f[1][1] for f in sum(fed_batches[:batch_id + 1], []) if f[0] == side]
                            or [up.iloc[:0]])
            for r in fed.itertuples():
                if (int(r.tb), int(np.uint64(r.srcIP).view(np.int64))) not in \
                        {(int(t), int(s)) for t, s in kept}:
                    partner = later[other]
                    hit = partner[(partner.tb == r.tb) & (partner.destIP == r.srcIP)
                                  & (partner.srcIP == r.destIP)]
                    assert hit.empty, (side, r)
    # emitted punctuation is never violated by a later result
    for k, table in sink.tables.items():
        tbs = [t for t in table.column("tb").to_pylist() if t is not None]
        if k > 0 and puncts[k - 1] is not None:
            assert all((t + 1) * MINUTE > puncts[k - 1] for t in tbs)
    got = canonical_rows(sink.table().to_pandas(), output_columns_of(fp.query("flows")))
    want = canonical_rows(_nested_loop(up, down), output_columns_of(fp.query("flows")))
    assert got == want          # the same multiset: nothing lost, nothing twice
    matched = [r for r in got if r[0] is not None]
    assert len(set(matched)) == len(matched)
    assert stage.state.punctuation == END
    assert any(r[-1] is None for r in got) and any(r[-1] is not None and r[0] is not None
                                                   for r in got)
