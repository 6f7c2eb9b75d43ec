"""Windows of a NETFLOW link on flow start or on flow end (`first`/`time` or `last`): the
records of softflowd's datagrams replayed from a capture, released as decoded and closed by
the link's punctuation on that clock, summed per 5-minute and per 10-second bin equal to
nfdump's per-flow records over the same datagrams."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.capture.test_capture_flowdecode import nfdump_records, softflowd_datagrams
from tests.tools.resuming import run_here

BINS = {"q300": 300_000, "q10": 10_000}            # ms


def oopscope(*args: str) -> subprocess.CompletedProcess:
    """An `oopscope` command run to its end in this process (`run_here`): none of these
    runs is signalled, each is checked by what it writes."""
    return run_here([sys.executable, "-m", "tools.cli", *args], check=False)


def queries(clock: str) -> str:
    ns = {"first": "first", "last": "last"}[clock]
    return "".join(f"DEFINE {{ query_name {q}; }}\nSELECT tb, srcIP, sum(bytes) AS b, "
                   f"sum(packets) AS p FROM r1.NETFLOW GROUP BY {ns}/{ms * 10**6} AS tb, "
                   f"srcIP;\n" for q, ms in BINS.items())


@pytest.fixture(scope="module", params=[5, 9], ids=lambda v: f"v{v}")
def exported(request, pcaps_dir, tmp_path_factory):
    """softflowd's datagrams of skype.pcap in a capture (a second apart), and nfdump's
    records of them."""
    from tools.netflow.sender import PcapWriter

    tmp = tmp_path_factory.mktemp("nf")
    datagrams = softflowd_datagrams(pcaps_dir / "skype.pcap", request.param)
    pcap = tmp / "dg.pcap"
    writer = PcapWriter(str(pcap))
    writer.send([(d, None, 1_431_969_808_000 + 1000 * i) for i, d in enumerate(datagrams)])
    writer.close()
    return pcap, nfdump_records(datagrams, tmp, with_first=True)


def _sums(theirs: pd.DataFrame, clock: str, ms: int) -> pd.DataFrame:
    t = theirs.assign(tb=theirs[f"{clock}_ms"] // ms)
    t = t.groupby(["tb", "src"]).agg(b=("bytes", "sum"), p=("packets", "sum"))
    t.index.names = ["tb", "srcIP"]
    return t.sort_index()


def _ours(path: Path, merge: bool = False) -> pd.DataFrame:
    ours = pd.read_csv(path).astype({"tb": int, "b": int, "p": int})
    if merge:       # regular and correction rows
        return ours.groupby(["tb", "srcIP"])[["b", "p"]].sum().sort_index()
    assert not ours.duplicated(["tb", "srcIP"]).any()
    return ours.set_index(["tb", "srcIP"]).sort_index()[["b", "p"]]


@pytest.mark.parametrize("clock", ["first", "last"])
def test_windows_on_clock_equal_nfdump(exported, tmp_path, clock):
    pcap, theirs = exported
    (tmp_path / "q.gsql").write_text(queries(clock))
    outs = [a for q in BINS for a in ("--output", f"{q}={tmp_path / q}.csv")]
    proc = oopscope("run", str(tmp_path / "q.gsql"), "--netflow-in", f"r1={pcap}", *outs)
    assert proc.returncode == 0, proc.stderr
    assert " 0 late records" in proc.stderr, proc.stderr
    for q, ms in BINS.items():
        want = _sums(theirs, clock, ms)
        assert len(want) > (30 if ms == 10_000 else 2)
        pd.testing.assert_frame_equal(_ours(tmp_path / f"{q}.csv"), want, check_dtype=False)


def test_flow_end_by_the_idle_timeout_late_corrected(exported, tmp_path):
    """With a 10 s idle timeout the punctuation on `last` runs 10 s behind the export time:
    softflowd's end-of-capture dump (flows ending minutes before) then comes late; counted,
    and with `late 'correct'` regular and correction rows sum to nfdump's."""
    pcap, theirs = exported
    text = queries("last").replace("; }", "; late 'correct'; }")
    (tmp_path / "q.gsql").write_text(text)
    out = tmp_path / "q10.csv"
    proc = oopscope("run", str(tmp_path / "q.gsql"), "--netflow-in", f"r1={pcap}",
                    "--netflow-in-idle-timeout", "10s", "--output", f"q10={out}",
                    "--output", f"q300={tmp_path / 'q300.csv'}")
    assert proc.returncode == 0, proc.stderr
    late = int(re.search(r"(\d+) late records", proc.stderr).group(1))
    assert late > 100, proc.stderr
    pd.testing.assert_frame_equal(_ours(out, merge=True), _sums(theirs, "last", 10_000),
                                  check_dtype=False)


def test_one_link_two_clocks_is_refused(pcaps_dir, tmp_path):
    (tmp_path / "q.gsql").write_text(
        "DEFINE { query_name a; }\nSELECT tb, sum(bytes) AS b FROM r1.NETFLOW "
        "GROUP BY first/60000000000 AS tb;\nDEFINE { query_name b; }\nSELECT tb, "
        "sum(bytes) AS b FROM r1.NETFLOW GROUP BY last/60000000000 AS tb;\n")
    proc = oopscope("run", str(tmp_path / "q.gsql"), "--netflow-in",
                    f"r1={pcaps_dir / 'netflowv9.pcap'}")
    assert proc.returncode != 0
    assert "windowed on first by query a and on last by query b" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
