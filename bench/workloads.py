"""What the benchmark scripts share: where their captures go, generated captures kept between
runs, a warm page cache, the `oopscope` command as a fresh process."""

from __future__ import annotations

import atexit
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

#: the repository (bench/ is not installed: the scripts run from a checkout)
REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> list[str]:
    """The `oopscope` command line for a subprocess (this checkout's code, this Python)."""
    return [sys.executable, "-m", "tools.cli", *args]


def work_dir(given: str | Path | None, prefix: str) -> Path:
    """Where a benchmark writes its captures: `given` (--dir: kept, and reused by later runs),
    else a fresh private directory (`tempfile.mkdtemp`, mode 0700) removed when the process
    exits. Never a fixed name in a shared temporary directory: another user could make it
    first, or plant links in it, and have us write through them."""
    if given is not None:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        return path
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, True)
    log.info("captures go to %s (removed at exit; --dir DIR keeps them for later runs)", path)
    return path


def kept_capture(path: Path, params: str, make: Callable[[Path], object]) -> Path:
    """The capture at `path`, made by `make(path)` once and reused while `params` (a text
    naming everything that shapes it) is the one it was made with."""
    stamp = path.with_name(path.name + ".params")
    if path.exists() and stamp.exists() and stamp.read_text() == params:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    log.info("generating %s (%s)", path, params)
    make(path)
    stamp.write_text(params)
    return path


def generated_capture(path: Path, config) -> Path:
    """A `tools.gen.traffic.TrafficConfig` capture at `path` (one link), kept while the
    configuration is the same."""
    from tools.gen.traffic import generate

    def make(target: Path) -> None:
        made = generate(config, target)["l0"]
        if made != target:
            made.rename(target)

    return kept_capture(path, repr(config), make)


def warm_file(path: Path) -> None:
    """Read a file once so its pages are cached: every tool then reads it from memory."""
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass


def flow_split_captures(config, whole: Path, parts: list[Path]) -> list[Path]:
    """One link of a `TrafficConfig` written whole to `whole` and split by flow over `parts`
    (packet i goes to part hash(5-tuple) % len(parts), the same for both directions, as
    PACKET_FANOUT's hash mode gives one socket every packet of a flow); kept while the
    configuration is the same."""
    import numpy as np

    from tools.gen.frames import build_frames
    from tools.gen.pcapwrite import PcapAppender
    from tools.gen.traffic import flow_table, iter_link_packets

    def make(_target: Path) -> None:
        n = np.uint64(len(parts))
        outs = [PcapAppender(whole, snaplen=config.snaplen)] + \
            [PcapAppender(p, snaplen=config.snaplen) for p in parts]
        try:
            for cols in iter_link_packets(config, 0, flow_table(config)):
                frames = build_frames(cols)
                outs[0].append(cols["timestamp"], frames, cols["len"], cols["caplen"])
                # symmetric in the direction: XOR of the addresses and of the ports
                h = ((cols["srcIP_lo"] ^ cols["destIP_lo"]).astype(np.uint64)
                     ^ (cols["srcPort"].astype(np.uint64) ^ cols["destPort"].astype(np.uint64))
                     ^ cols["protocol"].astype(np.uint64))
                h = (h * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
                part = h % n
                for k, out in enumerate(outs[1:]):
                    m = part == k
                    out.append(cols["timestamp"][m], frames[m], cols["len"][m], cols["caplen"][m])
        finally:
            for out in outs:
                out.close()

    stamp = f"{config!r} parts={len(parts)}"
    kept_capture(whole, stamp, make)
    if not all(p.exists() for p in parts):       # a kept whole whose parts were removed
        whole.with_name(whole.name + ".params").unlink()
        kept_capture(whole, stamp, make)
    return parts
