"""Conformance of `netflow.gsql` with nfpcapd and softflowd on every capture of ../shared/pcaps:
per-5-tuple packet and byte totals over the whole capture, from the reference evaluator and
from the low level's flow table, equal those of the two reference meters (flow counts differ
by design: timeouts and FIN handling; totals must not).

Where a tool differs by design the test says so and compares the rest exactly:
- non-IP frames (ARP, LLDP, EAPOL ...) and link types a tool does not read (HDLC, ...) are
  in no tool's flows, nor ours (IP only);
- nfpcapd decodes the inner packet of IP-in-IP / 6in4 tunnels (protocols 4 and 41) and keys
  IPv6 packets with a hop-by-hop header on next header 0 (no ports), where we and softflowd
  key the outer header and walk to the transport: those address pairs compare on packet
  totals of the capture only;
- nfpcapd reassembles IP fragments (one packet, the datagram's bytes) and drops packets whose
  IP total length exceeds the frame; we (like softflowd) count every fragment, non-first
  fragments with ports 0: those address pairs are left out of the nfpcapd comparison;
- nfpcapd counts 0 bytes for frames longer than its 1522-byte buffer (TSO/GRO captures):
  those 5-tuples compare on packets only;
- softflowd counts bytes from the frame after the link header, so the Ethernet padding of
  short frames is in (and a truncated datagram counts what the frame holds): its bytes lie
  between min(our layer-3 bytes, frame bytes) and our frame bytes;
- softflowd writes ICMPv6 flows with ports 0 where we (and nfpcapd) use type * 256 + code:
  ICMPv6 ports are zeroed for the softflowd comparison.
nfpcapd's and our bytes are layer 3 (IP total length).
"""

from __future__ import annotations

import ipaddress
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capture.reader import read_all
from capture.schema import L_IP
from lowlevel.operator import LowLevelOperator
from lowlevel.partials import combine_partials
from lowlevel.testing import finalize
from queries.parser import parse
from queries.planner import plan_file
from tests.conftest import free_udp_port, require_tool, shared_pcaps, udp_port_bound
from tests.oracles.reference import evaluate_file

NETFLOW = Path(__file__).resolve().parents[2] / "queries" / "library" / "netflow.gsql"
KEY = ["sa", "da", "sp", "dp", "pr"]
TUNNELS = (4, 41)
NFPCAPD_FRAME = 1522


def _ip128(text: str) -> int:
    a = ipaddress.ip_address(text.strip())
    return int(a) | (0xFFFF_0000_0000 if a.version == 4 else 0)


def read_nfdump(d: Path) -> pd.DataFrame:
    """Every flow record of an nfcapd directory: addresses, ports, protocol, packets, bytes."""
    out = subprocess.run(["nfdump", "-R", str(d), "-q", "-o", "csv", "-N"], capture_output=True,
                         text=True, timeout=60).stdout
    rows = []
    for line in out.splitlines():
        f = line.split(",")
        if len(f) < 13 or f[0] == "ts" or not f[3]:
            continue
        pr = int(f[7]) if f[7].strip().isdigit() else _PROTO.get(f[7].strip(), -1)
        rows.append((_ip128(f[3]), _ip128(f[4]), int(f[5]), int(float(f[6])), pr, int(f[11]),
                     int(f[12])))
    return pd.DataFrame(rows, columns=KEY + ["packets", "bytes"])


_PROTO = {"ICMP": 1, "IGMP": 2, "TCP": 6, "UDP": 17, "ICMP6": 58, "GRE": 47, "ESP": 50,
          "IPIP": 4, "IPv6": 41, "HOPOPT": 0}


def totals(df: pd.DataFrame) -> pd.DataFrame:
    if not len(df):
        return pd.DataFrame(columns=["packets", "bytes"])
    return df.groupby(KEY)[["packets", "bytes"]].sum()


def ours_frame(res: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"sa": [int(x) for x in res["srcIP"]],
                         "da": [int(x) for x in res["destIP"]],
                         "sp": res["srcPort"].astype(int), "dp": res["destPort"].astype(int),
                         "pr": res["protocol"].astype(int),
                         "packets": res["packets"].astype(int), "bytes": res["bytes"].astype(int)})


def run_nfpcapd(pcap: Path, tmp: Path) -> pd.DataFrame:
    d = tmp / "nfpcapd"
    d.mkdir()
    subprocess.run(["nfpcapd", "-r", str(pcap), "-w", str(d)], capture_output=True, timeout=60)
    return read_nfdump(d)


def run_softflowd(pcap: Path, tmp: Path, port: int) -> pd.DataFrame:
    """softflowd -r exporting NetFlow v9 to an nfcapd we start and stop by pid."""
    d = tmp / "softflowd"
    d.mkdir()
    nfcapd = subprocess.Popen(["nfcapd", "-b", "127.0.0.1", "-p", str(port), "-w", str(d)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while nfcapd.poll() is None and not udp_port_bound(port) and time.monotonic() < deadline:
            time.sleep(0.02)          # until nfcapd has bound its port
        # no -c/-p: with a control socket path of its own softflowd -r stays up after EOF
        sf = subprocess.Popen(["softflowd", "-r", str(pcap), "-n", f"127.0.0.1:{port}", "-v",
                               "9", "-a", "-d"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            sf.wait(timeout=20)       # should it hang after EOF all the same
        except subprocess.TimeoutExpired:
            sf.kill()
            sf.wait()
        time.sleep(0.3)
    finally:
        nfcapd.send_signal(signal.SIGTERM)
        nfcapd.wait(timeout=30)
    return read_nfdump(d)


@pytest.fixture(scope="module")
def plan():
    text = NETFLOW.read_text()
    fp = plan_file(parse(text), ["main"], source=text)
    return fp, fp.queries[0]


def low_level(qp, batch) -> pd.DataFrame:
    op = LowLevelOperator(qp.low[0])
    out = op.process(batch) + op.finish()[0]
    return finalize(qp, combine_partials(out, op.schema))


def meter(pcap: Path):
    # a port of its own per capture: with ports shared by turns, a slow capture's collector
    # could still be listening when the next one on that port began (their flows mixed)
    with tempfile.TemporaryDirectory() as t:
        t = Path(t)
        return run_nfpcapd(pcap, t), run_softflowd(pcap, t, free_udp_port())


@pytest.fixture(scope="module")
def meters(pcaps_dir):
    """(nfpcapd flows, softflowd flows) of every capture, four captures at a time."""
    require_tool("nfpcapd")
    require_tool("nfcapd")
    require_tool("softflowd")
    require_tool("nfdump")
    pcaps = shared_pcaps()
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(meter, pcaps))
    return dict(zip([p.name for p in pcaps], got))


@pytest.mark.slow
def test_netflow_totals_agree_with_nfpcapd_and_softflowd(plan, meters):
    fp, qp = plan
    text = NETFLOW.read_text().replace("SUM(ip_len) AS bytes", "SUM(len) AS bytes")
    ffp = plan_file(parse(text), ["main"], source=text)   # the same flows, frame bytes
    checked = {"nfpcapd": 0, "softflowd": 0}
    mism = []
    for pcap in shared_pcaps():
        batch = read_all(pcap, link="main")
        ref = evaluate_file(fp, {"main": batch})["netflow"]
        low = low_level(qp, batch)
        ours = ours_frame(ref)
        # the reference evaluator and the low level: the same records
        cols = list(ref.columns)
        pd.testing.assert_frame_equal(
            ours_frame(low).sort_values(KEY + ["packets", "bytes"]).reset_index(drop=True),
            ours.sort_values(KEY + ["packets", "bytes"]).reset_index(drop=True),
            obj=pcap.name)
        assert list(low.columns) == cols
        nfp, sfd = meters[pcap.name]
        ip = (batch["layers"] & L_IP) != 0
        assert int(ours["packets"].sum()) == int(np.count_nonzero(ip)), pcap.name

        # --- nfpcapd -------------------------------------------------------------------------
        pair = lambda df: set(zip(df["sa"], df["da"]))  # noqa: E731
        frag = ip & ((batch["is_fragment"] != 0) | (batch["reason"] != 0))
        odd = set(zip((batch["srcIP_hi"][frag].astype(object) << 64) | batch["srcIP_lo"][frag],
                      (batch["destIP_hi"][frag].astype(object) << 64) | batch["destIP_lo"][frag]))
        odd |= pair(nfp[nfp["pr"] == 0])
        if len(nfp) and ours["pr"].isin(TUNNELS).any():
            # nfpcapd keys the inner packets of a tunnel: the capture's totals only
            assert int(ours["packets"].sum()) == int(nfp["packets"].sum()), pcap.name
            checked["nfpcapd"] += 1
        elif len(nfp):
            keep_o = ours[[(x, y) not in odd for x, y in zip(ours["sa"], ours["da"])]]
            keep_n = nfp[[(x, y) not in odd for x, y in zip(nfp["sa"], nfp["da"])]]
            big = ip & (batch["len"].astype(np.int64) > NFPCAPD_FRAME)
            big_t = set(zip((batch["srcIP_hi"][big].astype(object) << 64)
                            | batch["srcIP_lo"][big], batch["srcPort"][big].astype(int)))
            a, b = totals(keep_o), totals(keep_n)
            assert set(a.index) == set(b.index), pcap.name
            b = b.loc[a.index]
            jumbo = np.array([(k[0], k[2]) in big_t for k in a.index], bool)
            assert (a["packets"].to_numpy() == b["packets"].to_numpy()).all(), pcap.name
            assert (a["bytes"].to_numpy()[~jumbo] == b["bytes"].to_numpy()[~jumbo]).all(), \
                pcap.name
            checked["nfpcapd"] += 1

        # --- softflowd -----------------------------------------------------------------------
        if len(sfd):
            o = ours.copy()
            o.loc[o["pr"] == 58, ["sp", "dp"]] = 0
            frame = ours_frame(evaluate_file(ffp, {"main": batch})["netflow"])
            frame.loc[frame["pr"] == 58, ["sp", "dp"]] = 0
            j = totals(o).join(totals(sfd), how="outer", rsuffix="_sf").join(
                totals(frame)["bytes"].rename("frame"))
            # softflowd counts the frame after the link header: Ethernet padding of short
            # frames included, so its bytes lie between ours and our frame bytes (the frame
            # bounds it also where the IP length claims more than the frame holds)
            low = np.minimum(j["bytes"], j["frame"] - 18 * j["packets"])   # 18: Ethernet + VLAN
            bad = j[(j["packets"] != j["packets_sf"]) | (j["bytes_sf"] < low)
                    | (j["bytes_sf"] > j["frame"])]
            if len(bad):
                mism.append((pcap.name, bad.head(3).to_string()))
            checked["softflowd"] += 1
    assert not mism, mism
    assert checked["nfpcapd"] > 100 and checked["softflowd"] > 100
