"""The reference evaluator against plain-Python loops, and every shipped query on real captures."""

from __future__ import annotations

import collections
import ipaddress
import math
from pathlib import Path

import numpy as np
import pytest

from capture.batch import PacketBatch
from capture.schema import L_IPV4, L_TCP, L_UDP
from lowlevel.hll import estimate, hash64, registers_of
from queries.parser import parse
from queries.planner import plan_file
from tests.oracles.reference import evaluate_file
from tests.oracles.samples import NS, random_batch

LIBRARY = Path(__file__).resolve().parents[2] / "queries" / "library"


def run(text, batches, params=None):
    fp = plan_file(parse(text), list(batches), params, source=text)
    return evaluate_file(fp, batches)


def rows(batch: PacketBatch, need: int = 0):
    """Packets as dicts of plain Python values (the oracle's own view of the batch)."""
    c = batch.columns
    out = []
    for i in range(batch.n):
        if need and not int(c["layers"][i]) & need:
            continue
        out.append({
            "time": int(c["timestamp"][i]) // NS, "ts": int(c["timestamp"][i]),
            "src": (int(c["srcIP_hi"][i]) << 64) | int(c["srcIP_lo"][i]),
            "dst": (int(c["destIP_hi"][i]) << 64) | int(c["destIP_lo"][i]),
            "len": int(c["len"][i]), "ttl": int(c["ttl"][i]), "flags": int(c["flags"][i]),
            "srcPort": int(c["srcPort"][i]), "destPort": int(c["destPort"][i]),
            "layers": int(c["layers"][i]),
        })
    return out


@pytest.fixture(scope="module")
def batch():
    return random_batch(20_000, seed=11, span_s=900)


def test_tumbling_count_per_pair(batch):
    res = run("SELECT tb, srcIP, destIP, count(*) FROM main.IPV4 GROUP BY time/60 AS tb, srcIP, destIP",
              {"main": batch})["q" if False else "query"]
    want = collections.Counter((r["time"] // 60, r["src"] & 0xFFFFFFFF, r["dst"] & 0xFFFFFFFF)
                               for r in rows(batch, L_IPV4))
    got = {(int(a), int(b), int(c)): int(n) for a, b, c, n in res.itertuples(index=False)}
    assert got == dict(want)
    assert list(res.columns) == ["tb", "srcIP", "destIP", "Cnt"]


def test_aggregates_having_and_avg(batch):
    text = ("SELECT tb, srcPort, count(*), SUM(len), MIN(ttl), MAX(len), AVG(len), OR_AGGR(flags), "
            "FIRST(len), LAST(len) FROM main.TCP WHERE ttl > 1 GROUP BY time/120 AS tb, srcPort "
            "HAVING count(*) > 30")
    res = run(text, {"main": batch})["query"]
    groups = collections.defaultdict(list)
    for r in rows(batch, L_TCP):
        if r["ttl"] > 1:
            groups[(r["time"] // 120, r["srcPort"])].append(r)
    want = {}
    for k, g in groups.items():
        if len(g) > 30:
            first = min(g, key=lambda r: (r["ts"], r["len"]))["len"]
            last = max(g, key=lambda r: (r["ts"], r["len"]))["len"]
            ors = 0
            for r in g:
                ors |= r["flags"]
            want[k] = (len(g), sum(r["len"] for r in g), min(r["ttl"] for r in g),
                       max(r["len"] for r in g), sum(r["len"] for r in g) / len(g), ors, first, last)
    got = {}
    for row in res.itertuples(index=False):
        got[(int(row[0]), int(row[1]))] = tuple(row[2:])
    assert set(got) == set(want)
    for k in want:
        g, w = got[k], want[k]
        assert tuple(int(x) for x in g[:4]) == w[:4]
        assert math.isclose(g[4], w[4], rel_tol=1e-12)
        assert (int(g[5]), int(g[6]), int(g[7])) == w[5:]


@pytest.mark.parametrize("r,s", [(300, 60), (300, 120), (60, 60), (200, 70)])
def test_sliding_windows_follow_the_definition(batch, r, s):
    text = (f"SELECT srcIP, count(*) [RANGE {r} seconds, SLIDE {s} seconds, WA time] AS n, "
            f"MAX(len) [RANGE {r} seconds, SLIDE {s} seconds, WA time] AS big "
            f"FROM main.IP GROUP BY srcIP")
    res = run(text, {"main": batch})["query"]
    data = rows(batch, L_IPV4 | 8)
    times = [d["time"] for d in data]
    want = {}
    for w in range(min(times) // s - 1, (max(times) + r) // s + 1):
        lo, hi = (w + 1) * s - r, (w + 1) * s        # the extent of window w, half-open
        for d in data:
            if lo <= d["time"] < hi:
                key = ((w + 1) * s, d["src"])
                n, big = want.get(key, (0, 0))
                want[key] = (n + 1, max(big, d["len"]))
    got = {(int(e), int(ip)): (int(n), int(b)) for e, ip, n, b in res.itertuples(index=False)}
    assert got == want


def test_union_of_links_is_the_sum(batch):
    other = random_batch(5_000, seed=12, link="b")
    text = "SELECT tb, protocol, count(*) FROM [a, b].IP GROUP BY time/60 AS tb, protocol"
    res = run(text, {"a": batch, "b": other})["query"]
    want = collections.Counter()
    for b in (batch, other):
        ip = (b["layers"] & (L_IPV4 | 8)) != 0
        for t, p in zip((b["timestamp"][ip] // NS // 60).tolist(), b["protocol"][ip].tolist()):
            want[(t, p)] += 1
    assert {(int(t), int(p)): int(n) for t, p, n in res.itertuples(index=False)} == dict(want)


def test_query_on_query_rollup_equals_direct_aggregation(batch):
    text = ("DEFINE { query_name m1; } SELECT tb, srcIP, count(*) AS Cnt, MAX(len) AS big "
            "FROM main.IP GROUP BY time/60 AS tb, srcIP;"
            "DEFINE { query_name m5; } SELECT t5, srcIP, SUM(Cnt) AS n, MAX(big) AS big FROM m1 "
            "GROUP BY tb/5 AS t5, srcIP;"
            "DEFINE { query_name direct; } SELECT t5, srcIP, count(*) AS n, MAX(len) AS big "
            "FROM main.IP GROUP BY time/300 AS t5, srcIP")
    res = run(text, {"main": batch})
    a = res["m5"].sort_values(["t5", "srcIP"]).reset_index(drop=True)
    b = res["direct"].sort_values(["t5", "srcIP"]).reset_index(drop=True)
    assert len(a) > 10
    assert a.astype(str).equals(b.astype(str))


def test_tumbling_join_matches_nested_loops(batch):
    text = ("DEFINE { query_name up; } SELECT tb, srcIP, destIP, count(*) AS c FROM main.TCP "
            "GROUP BY time/300 AS tb, srcIP, destIP;"
            "DEFINE { query_name dn; } SELECT tb, srcIP, destIP, count(*) AS c FROM main.UDP "
            "GROUP BY time/300 AS tb, srcIP, destIP;"
            "DEFINE { query_name j; } SELECT a.tb, a.srcIP, a.destIP, a.c, b.c LEFT_OUTER_JOIN "
            "FROM up a, dn b WHERE a.tb = b.tb AND a.srcIP = b.destIP AND a.destIP = b.srcIP "
            "AND a.c >= b.c")
    res = run(text, {"main": batch})
    up = list(res["up"].itertuples(index=False))
    dn = list(res["dn"].itertuples(index=False))
    want = []
    for a in up:
        matches = [b for b in dn if a[0] == b[0] and a[1] == b[2] and a[2] == b[1] and a[3] >= b[3]]
        want += [(a[0], a[1], a[2], a[3], b[3]) for b in matches] or [(a[0], a[1], a[2], a[3], None)]
    got = [tuple(None if v is None else int(v) for v in row) for row in res["j"].itertuples(index=False)]
    norm = [tuple(None if v is None else int(v) for v in row) for row in want]
    assert sorted(got, key=str) == sorted(norm, key=str)
    assert any(row[4] is None for row in got) and any(row[4] is not None for row in got)


def test_band_join_boundaries_match_nested_loops():
    a = random_batch(300, seed=5, link="l1", span_s=1200, hosts=4)
    b = random_batch(300, seed=6, link="l2", span_s=1200, hosts=4)
    text = ("SELECT x.time, y.time, x.srcIP INNER_JOIN FROM l1.IP [RANGE 3 minutes] x, "
            "l2.IP [RANGE 2 minutes] y WHERE x.srcIP = y.destIP")
    res = run(text, {"l1": a, "l2": b})["query"]
    want = collections.Counter()
    for l in rows(a, L_IPV4 | 8):
        for r in rows(b, L_IPV4 | 8):
            # docs/semantics.md "Joins": l joins r iff l.ts - R_R <= r.ts < l.ts + R_L
            if l["src"] == r["dst"] and l["time"] - 120 <= r["time"] < l["time"] + 180:
                want[(l["time"], r["time"], l["src"])] += 1
    got = collections.Counter((int(x), int(y), int(s)) for x, y, s in res.itertuples(index=False))
    assert got == want and sum(want.values()) > 0


def test_merge_is_time_ordered_union():
    a = random_batch(500, seed=7, link="l1", sort=False)
    b = random_batch(400, seed=8, link="l2")
    res = run("MERGE x.timestamp : y.timestamp FROM l1.UDP x, l2.UDP y", {"l1": a, "l2": b})["query"]
    n_udp = sum(int(((bb["layers"] & L_UDP) != 0).sum()) for bb in (a, b))
    assert len(res) == n_udp
    ts = res["timestamp"].to_numpy()
    assert np.all(ts[1:] >= ts[:-1])
    assert set(res["link"]) == {"l1", "l2"}


def test_selection_with_ip_str_and_prefix(batch):
    text = ("SELECT time, ip_str(prefix(srcIP, 24)) AS net, len FROM main.IPV4 "
            "WHERE len > 1400 AND prefix(srcIP, 24) = IP_VAL '10.0.0.0'")
    res = run(text, {"main": batch})["query"]
    want = [(r["time"], str(ipaddress.IPv4Address(r["src"] & 0xFFFFFF00)), r["len"])
            for r in rows(batch, L_IPV4)
            if r["len"] > 1400 and (r["src"] & 0xFFFFFF00) == 0x0A000000]
    got = [(int(t), n, int(l)) for t, n, l in res.itertuples(index=False)]
    assert sorted(got) == sorted(want) and want


def test_count_distinct_is_mergeable_and_close(batch):
    res = run("SELECT tb, COUNT_DISTINCT(seq) AS d, count(*) AS n FROM main.TCP GROUP BY time/300 AS tb",
              {"main": batch})["query"]
    tcp = (batch["layers"] & L_TCP) != 0
    for tb, d, _n in res.itertuples(index=False):
        sel = tcp & (batch["timestamp"] // NS // 300 == tb)
        exact = len(np.unique(batch["seq"][sel]))
        # HLL with 64 registers: standard error ~13%; 4 sigma
        assert abs(int(d) - exact) <= 0.52 * exact + 3
    # registers of two halves, merged register-wise, equal the registers of the whole
    values = batch["seq"][tcp].astype(np.uint64)
    groups = np.zeros(len(values), np.int64)
    whole = registers_of(values, groups, 1)
    half = len(values) // 2
    merged = np.maximum(registers_of(values[:half], groups[:half], 1),
                        registers_of(values[half:], groups[half:], 1))
    assert np.array_equal(whole, merged)
    assert int(estimate(whole)[0]) == int(estimate(merged)[0])
    assert hash64(np.array([1, 2], np.uint64)).dtype == np.uint64


# --- the shipped queries on real captures ---------------------------------------------------------

SHIPPED = sorted(LIBRARY.glob("*.gsql"))


@pytest.fixture(scope="module")
def capture(pcaps_dir):
    from capture.reader import read_all

    path = pcaps_dir / "skype.pcap"
    return path, read_all(path, link="main")


def _params_for(path: Path) -> dict:
    return {"port_scan": {"min_ports": "2"}, "top_talkers": {"min_bytes": "20000"}}.get(path.stem, {})


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_query_runs_on_a_real_capture(path, capture):
    _, b = capture
    text = path.read_text()
    tree = parse(text, path=str(path))
    from queries.explain import mentioned_links

    links = mentioned_links(tree) or ["main"]
    half = b.n // 2
    batches = {link: (b if i == 0 else b.slice(0, half)) for i, link in enumerate(links)}
    fp = plan_file(tree, links, _params_for(path), source=text)
    res = evaluate_file(fp, batches)
    assert set(res) == set(fp.names)
    for q in fp.queries:
        assert list(res[q.name].columns) == q.output_names
    assert any(len(df) for df in res.values()), "a shipped query found nothing on skype.pcap"


def _dpkt_ipv4(path):
    """(minute, src, dst) -> packets, decoded by dpkt (independent of capture/)."""
    import dpkt

    counts = collections.Counter()
    with open(path, "rb") as f:
        for ts, buf in dpkt.pcap.Reader(f):
            eth = dpkt.ethernet.Ethernet(buf)
            ip = eth.data
            if isinstance(ip, dpkt.ip.IP):
                counts[(int(ts) // 60, int.from_bytes(ip.src, "big"), int.from_bytes(ip.dst, "big"))] += 1
    return counts


def test_q8_1_counts_match_dpkt(capture):
    path, b = capture
    text = (LIBRARY / "q8_1.gsql").read_text()
    res = evaluate_file(plan_file(parse(text), ["main"], source=text), {"main": b})["q8_1"]
    got = {(int(t), int(s), int(d)): int(n) for t, s, d, n in res.itertuples(index=False)}
    want = dict(_dpkt_ipv4(path))
    assert got == want and len(want) > 10


def test_netflow_tcp_packets_match_dpkt(capture):
    """TCP packets per source address in the netflow flow records equal dpkt's count."""
    import dpkt

    path, b = capture
    per_src = collections.Counter()
    with open(path, "rb") as f:
        for _ts, buf in dpkt.pcap.Reader(f):
            ip = dpkt.ethernet.Ethernet(buf).data
            if isinstance(ip, (dpkt.ip.IP, dpkt.ip6.IP6)) and isinstance(ip.data, dpkt.tcp.TCP):
                src = ipaddress.ip_address(ip.src)
                key = int(src) | (0xFFFF_0000_0000 if src.version == 4 else 0)
                per_src[key] += 1
    text = (LIBRARY / "netflow.gsql").read_text()
    res = evaluate_file(plan_file(parse(text), ["main"], source=text), {"main": b})["netflow"]
    got = collections.Counter()
    for src, n, proto in zip(res["srcIP"], res["packets"], res["protocol"]):
        if int(proto) == 6:
            got[int(src)] += int(n)
    assert got == per_src and sum(per_src.values()) > 100


def test_dns_volume_matches_dpkt(pcaps_dir):
    import dpkt

    from capture.reader import read_all

    path = pcaps_dir / "dns_exfiltration.pcap"
    want = collections.Counter()
    with open(path, "rb") as f:
        for ts, buf in dpkt.pcap.Reader(f):
            ip = dpkt.ethernet.Ethernet(buf).data
            if isinstance(ip, (dpkt.ip.IP, dpkt.ip6.IP6)) and isinstance(ip.data, dpkt.udp.UDP):
                u = ip.data
                if u.dport == 53:
                    want[(int(ts) // 60, "q")] += 1
                if u.sport == 53:
                    want[(int(ts) // 60, "r")] += 1
    text = (LIBRARY / "dns_volume.gsql").read_text()
    res = evaluate_file(plan_file(parse(text), ["main"], source=text),
                        {"main": read_all(path, link="main")})["dns_volume"]
    got = collections.Counter()
    for tb, q, r in zip(res["tb"], res["queries"], res["responses"]):
        got[(int(tb), "q")] += int(q)
        got[(int(tb), "r")] += int(r)
    assert +got == +want and sum(want.values()) > 10


def test_a_query_reading_an_outer_join_sees_nulls_as_zero(batch):
    text = ("DEFINE { query_name a1; } SELECT tb, srcIP, count(*) AS c FROM main.TCP "
            "GROUP BY time/300 AS tb, srcIP;"
            "DEFINE { query_name b1; } SELECT tb, srcIP, count(*) AS c FROM main.UDP "
            "WHERE srcPort = 53 GROUP BY time/300 AS tb, srcIP;"
            "DEFINE { query_name j; } SELECT x.tb, x.srcIP, x.c AS tcp, y.c AS dns LEFT_OUTER_JOIN "
            "FROM a1 x, b1 y WHERE x.tb = y.tb AND x.srcIP = y.srcIP;"
            "DEFINE { query_name r; } SELECT tb, SUM(tcp) AS tcp, SUM(dns) AS dns FROM j "
            "GROUP BY tb/1 AS tb")
    res = run(text, {"main": batch})
    assert res["j"]["dns"].isna().any()
    direct = res["a1"].groupby("tb")["c"].sum()
    matched = res["b1"].merge(res["a1"][["tb", "srcIP"]], on=["tb", "srcIP"])
    dns = matched.groupby("tb")["c"].sum()
    for tb, tcp, d in res["r"].itertuples(index=False):
        assert int(tcp) == int(direct[tb])
        assert int(d) == int(dns.get(tb, 0))
