"""The one place that sets Numba jit options, and keeps Numba's on-disk cache fresh."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numba

log = logging.getLogger(__name__)


#: the packages whose modules hold kernels, relative to the folder that holds the packages
KERNEL_PACKAGES = ("capture", "lowlevel", "highlevel", "tools/gen", "tools/results")


def sources_digest(package: Path) -> str:
    """sha1 of a package's sources (names and bytes)."""
    digest = hashlib.sha1()
    for src in sorted(package.glob("*.py")):
        digest.update(src.name.encode() + src.read_bytes())
    return digest.hexdigest()


def _drop_stale_cache(package: Path) -> None:
    """Numba's on-disk cache checks only the source file of the cached function, not the
    modules it calls (a kernel in hashtable.py inlines flush.py and aggregates.py). So the
    cache of a package is dropped whenever any of its sources changed."""
    cache = package / "__pycache__"
    try:
        digest = sources_digest(package)
        stamp = cache / "numba-sources.sha1"
        if stamp.is_file() and stamp.read_text() == digest:
            return
        cache.mkdir(exist_ok=True)
        for f in list(cache.glob("*.nbi")) + list(cache.glob("*.nbc")):
            f.unlink(missing_ok=True)
        stamp.write_text(digest)
    except OSError as exc:  # a read-only install: the cache cannot be written either
        log.debug("numba cache check of %s skipped: %s", package, exc)


def _drop_stale_caches() -> None:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return  # a user-chosen cache location: leave it to its owner
    # kernels inline across packages too (lowlevel's inline lowlevel/hll.py and common's
    # helpers), so every kernel package is checked, not only the caller's
    root = Path(__file__).resolve().parents[1]
    for name in KERNEL_PACKAGES:
        package = root / name
        if package.is_dir():
            _drop_stale_cache(package)


_drop_stale_caches()

#: every low-level kernel is compiled with these options (cached on disk, GIL released)
ngjit = numba.njit(cache=True, nogil=True)

#: small helpers called per packet: inlined into the kernel at the Numba IR level, because a
#: real call passes every array argument with atomic reference-count updates, on every
#: packet (a helper with a dozen array arguments pays a dozen of them)
ngjit_inline = numba.njit(cache=True, nogil=True, inline="always")
