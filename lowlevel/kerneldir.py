"""The directory of generated kernels: where a module of kernel source written at run time
(`lowlevel.specialize`'s per-query kernels, a UDAF's loops, a sampling query's kernel) is
written and imported from, so that Numba caches its machine code on disk as it does the
package's own kernels.

`lowlevel/__pycache__/kernels/` (or `~/.cache/oopscope/kernels` when the package is not
writable), each only while it is ours and nobody else can write to it (importing runs the
code: `common.cachedir`). A module's name carries a digest of the lowlevel sources and of its
text: a changed kernel, helper or input makes a new module, never a stale one, and modules of
older sources are removed. With no directory to write, `load_in_memory` compiles the text
without the disk cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from common import cachedir
from common.jit import sources_digest

log = logging.getLogger(__name__)

_SOURCES: str | None = None
_REFUSED: set[Path] = set()


def _kernel_dirs() -> Iterator[Path]:
    """Where generated kernels may be written and imported from, in order. Importing runs
    them, so a directory counts only while nobody but its owner can write to it, and the
    owner is this user (or root, for an installed package): the rule of the cache directory,
    `common.cachedir`. The private cache's `kernels/` is made only when the package's own
    directory did not serve."""
    here = Path(__file__).resolve().parent / "__pycache__" / "kernels"
    try:
        st = os.stat(here)
    except OSError:
        yield here                    # not made yet: `_write` makes it private
    else:
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or st.st_uid not in (os.getuid(), 0):
            if not _REFUSED:
                _REFUSED.add(here)
                log.warning("kernel directory %s is writable by others or not ours (mode "
                            "%04o, uid %d): not used", here, stat.S_IMODE(st.st_mode), st.st_uid)
        else:
            yield here
    cache = cachedir.private_subdir("kernels")
    if cache is not None:
        yield cache


def _write(directory: Path, stem: str, text: str, prefix: str) -> Path:
    assert _SOURCES is not None   # `load_generated` sets it before writing
    if not directory.is_dir():
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(directory, 0o755)
            os.chmod(directory, 0o755)     # whatever the umask: writable by its owner only
        except FileExistsError:
            pass
        why = cachedir.problem(directory)
        if why is not None:    # someone else's, made in between: not ours to import from
            raise PermissionError(f"{directory} {why}")
    path = directory / f"{stem}.py"
    if not path.is_file() or path.read_text() != text:
        cachedir.write_private(path, text)
    for old in directory.glob(f"{prefix}*.py"):       # modules of older sources
        if not old.name.startswith(f"{prefix}{_SOURCES[:10]}"):
            old.unlink(missing_ok=True)
            for cached in (directory / "__pycache__").glob(f"{old.stem}.*"):
                cached.unlink(missing_ok=True)
    return path


def load_generated(prefix: str, text: str, digest: str = ""):
    """The module of generated kernel source `text`, written to the first kernel directory
    that can be written (there Numba's disk cache works) as `<prefix><sources><digest>_<sha>`
    and imported; None when no directory can be written. `digest`: of further sources the
    text depends on (a module it calls), so a change of them makes a new module."""
    global _SOURCES
    if _SOURCES is None:
        _SOURCES = sources_digest(Path(__file__).resolve().parent)
    stem = f"{prefix}{_SOURCES[:10]}{digest}_{hashlib.sha1(text.encode()).hexdigest()[:12]}"
    name = f"oopscope_kernels.{stem}"
    if name in sys.modules:
        return sys.modules[name]
    for directory in _kernel_dirs():
        try:
            path = _write(directory, stem, text, prefix)
        except OSError as exc:
            log.debug("no generated kernel in %s: %s", directory, exc)
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None   # a .py file always has both
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    return None


def load_in_memory(prefix: str, text: str) -> dict:
    """The namespace of generated kernel source `text`, compiled without Numba's disk cache
    (where `load_generated` finds no directory to write)."""
    stem = f"{prefix}{hashlib.sha1(text.encode()).hexdigest()[:12]}"
    namespace: dict = {"__name__": f"oopscope_kernels.{stem}"}
    exec(compile(text.replace("from common.jit import ngjit\n",
                              "import numba\nngjit = numba.njit(nogil=True)\n"),
                 f"<{stem}>", "exec"), namespace)
    return namespace
