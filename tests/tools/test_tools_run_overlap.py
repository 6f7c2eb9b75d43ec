"""`oopscope run` at full speed with the Spark stage overlapping the low level (large captures)
gives the same rows as the stage run once at the end."""

from __future__ import annotations

import threading
from pathlib import Path

import pandas as pd
import pytest

NS = 1_000_000_000


@pytest.fixture(scope="session")
def overlap_capture(tmp_path_factory) -> Path:
    """Short bursty flows over 6 minutes (several one-minute buckets to close on the way)."""
    from tools.gen.traffic import TrafficConfig, generate

    out = tmp_path_factory.mktemp("overlap") / "main.pcap"
    cfg = TrafficConfig(packets=60_000, duration_ns=360 * NS, groups=1_000, flows=6_000,
                        tcp=0.7, udp=0.28, icmp=0.02, ipv6=0.1, snaplen=96,
                        flow_duration_ns=5 * NS, seed=21)
    return generate(cfg.validate(), out)["l0"]


def _run(capture: Path, out: Path):
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    return run(RunConfig("netflow", links=(("main", str(capture)),),
                         outputs=(("netflow", str(out)),), batch_size=2048))


@pytest.mark.slow
def test_overlapped_stage_gives_the_rows_of_one_final_stage(overlap_capture, tmp_path,
                                                            monkeypatch, caplog):
    import logging

    import tools.pipeline.sources as pipeline
    import tools.pipeline.threads as threads
    from highlevel.session import get_session

    get_session()
    plain = _run(overlap_capture, tmp_path / "plain.csv")
    assert plain.queries["netflow"].rows > 0

    # force the overlap: any input size, and the low level waits until the stages run
    # continuously, then reads slowly enough for micro-batches to close windows meanwhile
    decided = threading.Event()
    original_run = threads.OverlappedStages.run
    seen = {}

    def run_and_tell(self):
        try:
            original_run(self)
        finally:
            seen["started"] = self.started
            decided.set()

    real_drive = pipeline.drive

    def drive_after_start(config, sources, feeds, stop, info):
        assert decided.wait(120)
        for f in feeds.values():
            process = f.process

            def slow(batch, process=process):
                process(batch)
                threading.Event().wait(0.01)
            f.process = slow
        return real_drive(config, sources, feeds, stop, info)

    monkeypatch.setattr(threads.OverlappedStages, "MIN_BYTES", 0)
    monkeypatch.setattr(threads.OverlappedStages, "run", run_and_tell)
    monkeypatch.setattr(pipeline, "drive", drive_after_start)
    caplog.set_level(logging.INFO, logger="highlevel.aggregate")
    overlapped = _run(overlap_capture, tmp_path / "overlap.csv")
    assert seen["started"] is True
    closing = [r for r in caplog.records if "closed windows" in r.getMessage()]
    assert len(closing) >= 2          # windows were closed while the low level still read
    batches = overlapped.results["netflow"]
    a = pd.read_csv(tmp_path / "plain.csv")
    b = pd.read_csv(tmp_path / "overlap.csv")
    assert len(b) == len(a) == overlapped.queries["netflow"].rows == batches.num_rows
    # the same records in the same (window, keys) order: windows close in order
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    link = overlapped.links["main"]
    assert b["packets"].sum() == link.packets
