"""Combining partial rows on Spark equals a plain pandas/numpy reference (every sub-aggregate
kind, several partial rows per group, IPv4-mapped and IPv6 keys, tumbling and sliding)."""

from __future__ import annotations

import ipaddress

import numpy as np
import pandas as pd
import pyarrow as pa

from common.spool import SpoolWriter, list_spool
from highlevel.aggregate import AggregateStage
from highlevel.testing import ListSink, batch_frame, demo_spec, random_partials
from lowlevel.hll import estimate
from tools.results.parts import ParquetSink

SECOND = 10**9


def _ip_text(hi: int, lo: int) -> str:
    if hi == 0 and lo >> 32 == 0xFFFF:
        return str(ipaddress.IPv4Address(lo & 0xFFFFFFFF))
    return str(ipaddress.IPv6Address((hi << 64) | lo))


def reference(batches: list[pa.RecordBatch], windows_of_pane, registers: int) -> pd.DataFrame:
    """The query result computed directly from the partial rows with pandas and numpy."""
    t = pa.Table.from_batches(batches)
    regs = np.frombuffer(t.column("dests").combine_chunks().buffers()[1], np.uint8)
    regs = regs[: t.num_rows * registers].reshape(t.num_rows, registers)
    df = t.drop(["dests"]).to_pandas()
    df["row"] = np.arange(len(df))
    df["w"] = df["window"].map(lambda p: list(windows_of_pane(p)))
    df = df.explode("w")
    out = []
    for (w, hi, lo, port), g in df.groupby(["w", "srcIP__hi", "srcIP__lo", "port"]):
        first = g.sort_values(["ttl_first__t", "ttl_first"]).iloc[0]["ttl_first"]
        last = g.sort_values(["ttl_last__t", "ttl_last"]).iloc[-1]["ttl_last"]
        merged = regs[g["row"].to_numpy()].max(axis=0)
        out.append({"tb": int(w), "srcIP": _ip_text(int(hi), int(lo)), "port": int(port),
                    "cnt": int(g.cnt.sum()), "bytes": int(g.bytes.sum()),
                    "avg_len": g.bytes.sum() / g.cnt.sum(), "lo": int(g.lo.min()),
                    "hi": int(g.hi.max()), "flags": int(np.bitwise_or.reduce(g["flags"].to_numpy())),
                    "ttl_first": int(first), "ttl_last": int(last),
                    "dests": int(estimate(np.frombuffer(bytes(merged), np.uint8))[0])})
    return pd.DataFrame(out).sort_values(["tb", "srcIP", "port"]).reset_index(drop=True)


def _result(sink: ListSink) -> pd.DataFrame:
    got = sink.table().to_pandas()
    return got.sort_values(["tb", "srcIP", "port"]).reset_index(drop=True)


def _run_all_at_once(spark, spec, tmp_path, batches):
    writer = SpoolWriter(tmp_path / "spool", spec.query, spec.links[0])
    for k, b in enumerate(batches):
        writer.write([b], None if k < len(batches) - 1 else 10**6 * SECOND)
    sink = ListSink()
    stage = AggregateStage(spec, tmp_path / "spool", tmp_path / "ck", [sink], spark=spark)
    files = [p for _, _, p in list_spool(tmp_path / "spool", spec.query)]
    stage.process_batch(batch_frame(spark, spec, files), 0)
    return sink, stage


def test_tumbling_combine_equals_pandas_reference(spark, tmp_path):
    rng = np.random.default_rng(7)
    spec = demo_spec(links=("only",), registers=16)
    # several writes, several partial rows per (window, group): evictions
    batches = [random_partials(rng, [100, 101, 102], 60, groups=9) for _ in range(4)]
    sink, stage = _run_all_at_once(spark, spec, tmp_path, batches)
    got, want = _result(sink), reference(batches, lambda p: [p], 16)
    assert len(got) == len(want) and stage.state.closed_rows == len(want)
    pd.testing.assert_frame_equal(got.drop(columns=["avg_len"]), want.drop(columns=["avg_len"]),
                                  check_dtype=False)
    np.testing.assert_allclose(got.avg_len, want.avg_len, rtol=1e-12)
    assert got.hi.dtype == np.uint64 and (got.hi > 2**63).any()   # unsigned max survived
    assert any(":" in s for s in got.srcIP) and any("." in s for s in got.srcIP)


def test_sliding_windows_combine_panes_like_wid(spark, tmp_path):
    rng = np.random.default_rng(11)
    spec = demo_spec(links=("only",), pane_s=1, range_s=3, registers=16)
    batches = [random_partials(rng, [40, 41, 42, 43, 44, 45], 50, groups=5) for _ in range(3)]
    sink, _ = _run_all_at_once(spark, spec, tmp_path, batches)
    # window w (slide 1 s, range 3 s) covers panes w-2, w-1, w: a pane is in windows p..p+2
    want = reference(batches, lambda p: range(p, p + 3), 16)
    got = _result(sink)
    assert sorted(set(got.tb)) == list(range(40, 48))
    pd.testing.assert_frame_equal(got.drop(columns=["avg_len"]), want.drop(columns=["avg_len"]),
                                  check_dtype=False)


def test_streaming_run_writes_typed_parquet(spark, tmp_path):
    rng = np.random.default_rng(3)
    spec = demo_spec(query="typed", links=("a", "b"), registers=16)
    a = SpoolWriter(tmp_path / "spool", "typed", "a")
    b = SpoolWriter(tmp_path / "spool", "typed", "b")
    batches = [random_partials(rng, [5, 6], 30, query="typed") for _ in range(2)]
    a.write(batches[:1], 7 * SECOND)
    b.write(batches[1:], 6 * SECOND)
    sink = ParquetSink(tmp_path / "out")
    AggregateStage(spec, tmp_path / "spool", tmp_path / "ck", [sink], spark=spark).run_available()
    table = sink.read()
    assert table.schema == spec.output_arrow_schema().remove_metadata() or \
        table.schema.remove_metadata() == spec.output_arrow_schema().remove_metadata()
    # P = min(7 s, 6 s): only window 5 (ending at 6 s) may close
    want = reference(batches, lambda p: [p], 16)
    assert sorted(set(table.column("tb").to_pylist())) == [5]
    assert table.num_rows == int((want.tb == 5).sum())


def test_ip_text_in_spark_matches_ipaddress(spark):
    from pyspark.sql import functions as F

    from highlevel.ipcolumns import IpValue, ip_text

    values = [0x20010DB8000000000000000000000001, 0xFE800000000000000000000000000000,
              0x00000000000000000000FFFFC0A80001, 0x20010DB8000100000000000100000000,
              0x1, 0x0, 0x20010DB8AAAABBBBCCCCDDDDEEEEFFFF, 0x20010000000000010000000000000001]

    def signed(v):
        return v - (1 << 64) if v >= 1 << 63 else v

    rows = [(signed(v >> 64), signed(v & (2**64 - 1))) for v in values]
    df = spark.createDataFrame(rows, "hi long, lo long")
    got = [r[0] for r in df.select(ip_text(IpValue(F.col("hi"), F.col("lo")))).collect()]
    want = [_ip_text(v >> 64, v & (2**64 - 1)) for v in values]
    assert got == want
