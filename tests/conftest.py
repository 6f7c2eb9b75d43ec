"""Shared test fixtures: where the real captures are, and skips with a reason when they are not."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("OOPSCOPE_SHARED", REPO.parent / "shared"))
PCAPS = SHARED / "pcaps"


def shared_pcaps() -> list[Path]:
    """Every capture in ../shared/pcaps (empty when the folder is absent)."""
    if not PCAPS.is_dir():
        return []
    return sorted(p for p in PCAPS.iterdir() if p.suffix in {".pcap", ".pcapng", ".cap"})


@pytest.fixture(scope="session")
def pcaps_dir() -> Path:
    if not PCAPS.is_dir():
        pytest.skip(f"real captures not found at {PCAPS} (a checkout without ../shared)")
    return PCAPS


def require_tool(name: str) -> str:
    """Path of an external tool, or skip naming the missing Debian package's tool."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (.ci/run installs it)")
    return path
