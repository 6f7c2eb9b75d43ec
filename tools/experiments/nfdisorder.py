"""The disorder experiment on exported flow records (thesis 6.1.3, Fig 6-8 and 6-9): windows
on flow start closed by the exporters' punctuation against a slack buffer of the same bound.

    oopscope bench disorder --case netflow [--netflow-in DATAGRAMS.pcap] [--quick]

The input is what an exporter sent: the datagrams of a capture (`--netflow-in`), decoded in
arrival order by the NETFLOW link's decoder (`capture.flowdecode.FlowDecoder`). Without one, a
router's export is made: flows of a generated traffic mix (`router_flows`) kept in a cache that
is purged every `purge_s` (60 s) as the Abilene routers of Fig 6-9 did, a flow alive across a
purge exported as two records, the records of a purge in hash order, encoded by oopscope's own
exporter (`tools.netflow.exporter.Exporter`, export time = the latest flow end of a datagram).
So records arrive in order of flow end, block-sorted on flow start.

The query is `SELECT tb, srcIP, sum(bytes), count(*) FROM r1.NETFLOW GROUP BY first/60 s AS
tb, srcIP`. Its batch answer is plain numpy over every record. Each policy is a frontier
over the arrivals, non-decreasing; window w closes at the first arrival whose frontier reaches
its end, and a record counts in its window only if the window was still open when it came
(else it is late and lost):

- `punctuation T`: what `--netflow-in` does: the frontier is the latest export time seen
  minus the exporter's active timeout T (the datagram's own records come first). Run with the
  exporter's true bound (`--netflow-timeout`, the purge interval) and with the default 30 min.
- `slack S`: a sort buffer releasing records once they are S older than the largest flow
  start seen (the IOP way; thesis L996), for slacks up to and past the same bound.

Per policy: rows of the answer equal to the batch answer's, records late, the records a
buffer holds at peak (a record stays from its arrival until the frontier passes its start:
what a reorder buffer holds) and the (window, srcIP) states open at peak (what an aggregation
that folds records as they come holds instead), and the lag of each window's output in the
exporter's clock (the latest export time when it closes, minus the window's end).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.units import NS_PER_S as NS

log = logging.getLogger(__name__)

WINDOW_NS = 60 * NS
#: the exporter's purge interval and so its active timeout (the bound of its disorder)
PURGE_S = 60
DEFAULT_TIMEOUT_S = 30 * 60
#: 2026-01-01T00:00:00Z, the traffic generator's default start
EPOCH_NS = 1_767_225_600 * NS


@dataclass(frozen=True)
class RouterConfig:
    """A router's flows: `flows` flows starting uniformly over `duration_s`, each alive an
    exponential time of mean `life_s`, from `sources` source addresses; the cache is purged
    every `purge_s`, `purge_offset_s` before each minute's boundary."""

    flows: int = 200_000
    duration_s: int = 900
    life_s: float = 20.0
    sources: int = 2000
    purge_s: int = PURGE_S
    #: the purges' phase: a router's cache timer runs from its boot, not from the minute
    purge_offset_s: int = 23
    seed: int = 11


def router_flows(cfg: RouterConfig):
    """The router's flow records in export order, as an Arrow table of the netflow query's
    columns (IPv4 addresses as integers): flows cut at every purge, a purge's records in a
    random (hash) order, purges in time order."""
    import pyarrow as pa

    rng = np.random.default_rng(cfg.seed)
    n = cfg.flows
    start = rng.integers(0, cfg.duration_s * NS, n)
    life = np.minimum(rng.exponential(cfg.life_s * NS, n).astype(np.int64),
                      cfg.duration_s * NS - start - 1)
    end = start + np.maximum(life, 0)
    purge, phase = cfg.purge_s * NS, cfg.purge_offset_s * NS
    # one record per purge interval a flow lives in (interval b: [b purge, (b+1) purge) - phase)
    b0, b1 = (start + phase) // purge, (end + phase) // purge
    parts = (b1 - b0 + 1).astype(np.int64)
    flow = np.repeat(np.arange(n), parts)
    block = np.repeat(b0, parts) + (np.arange(len(flow)) - np.repeat(np.cumsum(parts) - parts,
                                                                      parts))
    first = np.maximum(start[flow], block * purge - phase)
    last = np.minimum(end[flow], (block + 1) * purge - phase - 1)
    share = (last - first + 1) / (end[flow] - start[flow] + 1)
    pkts = 1 + rng.poisson(12, n)
    packets = np.maximum(1, np.round(pkts[flow] * share)).astype(np.int64)
    size = rng.integers(40, 1500, n)
    src = (np.uint32(10 << 24) + rng.integers(0, cfg.sources, n).astype(np.uint32))[flow]
    dst = (np.uint32(172 << 24) + rng.integers(0, 1 << 20, n).astype(np.uint32))[flow]
    proto = np.where(rng.random(n) < 0.7, 6, 17).astype(np.uint8)[flow]
    order = np.lexsort((rng.random(len(flow)), block))
    cols = {"srcIP": src, "destIP": dst,
            "srcPort": rng.integers(1024, 65535, n).astype(np.uint16)[flow],
            "destPort": rng.choice(np.array([53, 80, 443, 8080], np.uint16), n)[flow],
            "protocol": proto, "packets": packets, "bytes": packets * size[flow],
            "first_ns": EPOCH_NS + first, "last_ns": EPOCH_NS + last}
    return pa.table({k: v[order] for k, v in cols.items()})


def write_datagrams(table, pcap: Path, version: int = 9) -> int:
    """`table`'s records exported in its order as NetFlow `version` datagrams to `pcap`;
    returns the datagrams written."""
    from tools.netflow.exporter import Exporter

    ex = Exporter(None, version, pcap=str(pcap))
    try:
        return ex.export(table)
    finally:
        ex.close()


def arrivals(pcap: Path) -> dict[str, np.ndarray]:
    """The flow records of a capture of exported datagrams, in arrival order: first, export
    (ns), datagram (its index), src (a source address key), bytes."""
    from capture.flowdecode import FlowDecoder
    from capture.flowsource import read_datagrams

    dg = read_datagrams(pcap)
    dec = FlowDecoder()
    # each record's datagram (in the arrival column): punctuation advances per datagram
    cols = dec.decode(dg.payloads, dg.exporters, list(range(len(dg))))
    if dec.stats.malformed:
        log.warning("%s: %s", pcap, dec.stats.describe())
    # one key per source address (IPv4 mapped and IPv6 alike)
    pairs = np.stack([cols["srcIP_hi"], cols["srcIP_lo"]], axis=1)
    _, src = np.unique(pairs, axis=0, return_inverse=True)
    return {"first": cols["first"].astype(np.int64), "export": cols["export"].astype(np.int64),
            "datagram": cols["arrival"].astype(np.int64), "src": src.reshape(-1).astype(np.int64), "bytes": cols["bytes"].astype(np.int64)}


def _groups(wid: np.ndarray, src: np.ndarray, values: np.ndarray, keep: np.ndarray):
    """(window, src) -> (sum of values, records) over the kept records, keys sorted."""
    import pandas as pd

    df = pd.DataFrame({"tb": wid[keep], "src": src[keep], "bytes": values[keep]})
    return df.groupby(["tb", "src"]).agg(bytes=("bytes", "sum"), records=("bytes", "size"))


def batch_answer(rec: dict[str, np.ndarray]):
    """The query's rows over every record (the exact answer)."""
    wid = np.floor_divide(rec["first"], WINDOW_NS)
    return _groups(wid, rec["src"], rec["bytes"], np.ones(len(wid), bool))


def punctuation_frontier(export: np.ndarray, datagram: np.ndarray,
                         timeout_ns: int) -> np.ndarray:
    """After each arrival: the latest export time seen minus the active timeout, advanced
    once a datagram's records are all in (at its last record)."""
    n = len(export)
    p = np.maximum.accumulate(export) - np.int64(timeout_ns)
    last = np.ones(n, bool)
    last[:-1] = datagram[1:] != datagram[:-1]
    low = np.iinfo(np.int64).min
    return np.maximum.accumulate(np.where(last, p, low))


def slack_frontier(first: np.ndarray, slack_ns: int) -> np.ndarray:
    """After each arrival: the largest flow start seen minus the slack."""
    return np.maximum.accumulate(first) - np.int64(slack_ns)


def evaluate(rec: dict[str, np.ndarray], frontier: np.ndarray):
    """One policy's rows and measures over the arrivals (module docstring)."""
    first, src, values = rec["first"], rec["src"], rec["bytes"]
    n = len(first)
    clock = np.maximum.accumulate(rec["export"])
    wid = np.floor_divide(first, WINDOW_NS)
    ends = (wid + 1) * WINDOW_NS
    # the arrival after which each record's window closes (n: only at the end of the input)
    closing = np.searchsorted(frontier, ends, side="left")
    keep = closing >= np.arange(n)
    rows = _groups(wid, src, values, keep)
    # records held by a reorder buffer: from arrival i until the frontier passes first_i
    release = np.maximum(np.searchsorted(frontier, first, side="right"), np.arange(n))
    held = _peak(np.arange(n), release, n)
    # (window, src) states open: from the first record of a pair until its window closes
    pair = wid * (int(src.max()) + 1 if n else 1) + src
    _, at = np.unique(pair, return_index=True)
    states = _peak(at, np.maximum(closing[at], at), n)
    windows, where = np.unique(wid, return_index=True)
    closed = closing[where]
    inside = closed < n
    lag = (clock[np.minimum(closed[inside], n - 1)] - (windows[inside] + 1) * WINDOW_NS) / NS
    return rows, {"late": int(n - np.count_nonzero(keep)), "held_peak": held,
                  "states_peak": states, "windows": int(len(windows)),
                  "closed_at_end": int(np.count_nonzero(~inside)),
                  "lag_mean_s": float(lag.mean()) if len(lag) else None,
                  "lag_max_s": float(lag.max()) if len(lag) else None}


def _peak(start: np.ndarray, stop: np.ndarray, n: int) -> int:
    """The most intervals [start, stop) (arrival indexes) open at once."""
    delta = np.bincount(start, minlength=n + 1)[:n + 1] - np.bincount(stop, minlength=n + 1)[:n + 1]
    return int(np.cumsum(delta).max()) if n else 0


def compare(rows, exact) -> dict:
    """Rows of a policy's answer equal to the batch answer's (same sum and count)."""
    joined = exact.join(rows, how="left", rsuffix="_got")
    equal = (joined["bytes"] == joined["bytes_got"]) & (joined["records"] == joined["records_got"])
    return {"rows": int(len(exact)), "rows_equal": int(equal.sum()),
            "rows_missing": int(joined["bytes_got"].isna().sum())}


@dataclass(frozen=True)
class NetflowCase:
    timeout_s: float = PURGE_S
    slacks_s: tuple[float, ...] = (0.0, 15.0, 30.0, 60.0, 90.0)
    default_timeout_s: float = DEFAULT_TIMEOUT_S


def run_case(pcap: Path, case: NetflowCase = NetflowCase(), keep_rows: bool = False) -> dict:
    """Every policy over the records of `pcap`: the report (and each policy's rows, when
    `keep_rows`, under "answers")."""
    rec = arrivals(pcap)
    if not len(rec["first"]):
        from common.errors import ConfigError

        raise ConfigError(f"{pcap}: no flow record decoded (no NetFlow/IPFIX datagrams, or "
                          f"no template for their data sets)")
    exact = batch_answer(rec)
    first = rec["first"]
    late_vs_max = int(np.count_nonzero(first < np.maximum.accumulate(first)))
    policies = [(f"punctuation {case.timeout_s:g} s", "punctuation", case.timeout_s,
                 punctuation_frontier(rec["export"], rec["datagram"], int(case.timeout_s * NS))),
                (f"punctuation {case.default_timeout_s:g} s", "punctuation",
                 case.default_timeout_s,
                 punctuation_frontier(rec["export"], rec["datagram"], int(case.default_timeout_s * NS)))]
    policies += [(f"slack {s:g} s", "slack", s, slack_frontier(first, int(s * NS)))
                 for s in case.slacks_s]
    out, answers = [], {}
    for name, kind, bound, frontier in policies:
        rows, m = evaluate(rec, frontier)
        m.update(compare(rows, exact), policy=name, kind=kind, bound_s=bound)
        out.append(m)
        if keep_rows:
            answers[name] = rows
    report = {"input": str(pcap), "records": int(len(first)),
              "records_behind_max_start": late_vs_max,
              "disorder_max_s": float((np.maximum.accumulate(first) - first).max() / NS),
              "span_s": float((first.max() - first.min()) / NS), "timeout_s": case.timeout_s,
              "policies": out}
    if keep_rows:
        report["answers"] = answers
        report["exact"] = exact
    return report


def make_input(directory: Path, quick: bool, version: int = 9) -> Path:
    """A router's export (module docstring) as a capture of datagrams, made once per size."""
    cfg = RouterConfig(flows=40_000 if quick else 400_000, duration_s=600 if quick else 1800)
    pcap = directory / f"router-{cfg.flows}-{cfg.duration_s}-v{version}.pcap"
    if not pcap.exists():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = pcap.with_suffix(".tmp")
        write_datagrams(router_flows(cfg), tmp, version)
        tmp.replace(pcap)
    return pcap


def format_case(report: dict) -> str:
    lines = [f"netflow: {report['records']:,} records from {report['input']}, flow starts over "
             f"{report['span_s']:.0f} s, {report['records_behind_max_start']:,} behind the "
             f"largest start seen (by up to {report['disorder_max_s']:.0f} s); "
             f"sum(bytes), count(*) per srcIP per minute of `first`",
             f"  {'policy':<20}{'rows equal':>14}{'late':>9}{'held peak':>11}"
             f"{'states peak':>13}{'lag s':>8}{'max s':>8}{'at end':>8}"]
    for p in report["policies"]:
        lag = "-" if p["lag_mean_s"] is None else f"{p['lag_mean_s']:.1f}"
        mx = "-" if p["lag_max_s"] is None else f"{p['lag_max_s']:.1f}"
        lines.append(f"  {p['policy']:<20}{p['rows_equal']:>7}/{p['rows']:<6}{p['late']:>9}"
                     f"{p['held_peak']:>11}{p['states_peak']:>13}{lag:>8}{mx:>8}"
                     f"{p['closed_at_end']:>8}")
    return "\n".join(lines)
