"""Where generated kernels are written and imported from (issue 25, item 1): importing a module
runs it, so `lowlevel.kerneldir` uses a kernel directory only while nobody but its owner can
write to it, under the cache directory's rule (`common.cachedir`: created 0700, refused when
others can write it, with a message saying why), and writes through names nobody can predict
(`tempfile.mkstemp`)."""

from __future__ import annotations

import inspect
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from common import cachedir
from lowlevel import kerneldir, specialize
from lowlevel.flowtable import flow_append


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A package directory and a cache home of the test's own; nothing remembered."""
    package = tmp_path / "pkg"
    package.mkdir()
    monkeypatch.setattr(kerneldir, "__file__", str(package / "kerneldir.py"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(specialize, "_KERNELS", {})
    monkeypatch.setattr(kerneldir, "_REFUSED", set())
    monkeypatch.setattr(cachedir, "_WARNED", set())
    return package / "__pycache__" / "kernels", tmp_path / "home" / "oopscope"


def _ops(seed: int) -> np.ndarray:
    return np.array([[0, 0, seed, 0]], np.int64)      # an ops table of its own per test


def _where(kernel) -> Path:
    return Path(inspect.getfile(kernel.py_func)).parent


def test_the_package_directory_is_made_private_and_used(fresh):
    kernels, _ = fresh
    kernel = specialize.specialized(flow_append, _ops(11))
    assert kernel is not flow_append and _where(kernel) == kernels
    assert kernels.stat().st_mode & 0o022 == 0 and kernels.stat().st_uid == os.getuid()


def test_a_kernel_directory_others_can_write_is_not_imported(fresh, caplog):
    kernels, cache = fresh
    kernels.mkdir(parents=True)
    kernels.chmod(0o777)
    planted = sorted(kernels.iterdir())
    with caplog.at_level(logging.WARNING):
        kernel = specialize.specialized(flow_append, _ops(12))
    assert f"kernel directory {kernels} is writable by others or not ours (mode 0777" \
        in caplog.text
    # written to, and imported from, the private cache instead
    assert _where(kernel) == cache / "kernels"
    assert (cache / "kernels").stat().st_mode & 0o777 == 0o700
    assert sorted(kernels.iterdir()) == planted


def test_a_cache_directory_others_can_write_is_refused_with_a_clear_message(fresh, caplog):
    kernels, cache = fresh
    kernels.mkdir(parents=True)
    kernels.chmod(0o777)
    cache.mkdir(parents=True)
    cache.chmod(0o770)
    with caplog.at_level(logging.WARNING):
        kernel = specialize.specialized(flow_append, _ops(13))
    assert kernel is flow_append                   # the generic kernel: the same results
    assert f"cache directory {cache} is writable by others than its owner (mode 0770): " \
           f"not used" in caplog.text
    assert not (cache / "kernels").exists()


def test_a_kernels_directory_in_the_cache_others_can_write_is_refused(fresh, caplog):
    kernels, cache = fresh
    kernels.mkdir(parents=True)
    kernels.chmod(0o757)
    (cache / "kernels").mkdir(parents=True, mode=0o700)
    (cache / "kernels").chmod(0o707)
    with caplog.at_level(logging.WARNING):
        kernel = specialize.specialized(flow_append, _ops(14))
    assert kernel is flow_append
    assert f"cache directory {cache / 'kernels'} is writable by others than its owner " \
           f"(mode 0707)" in caplog.text


def test_kernel_modules_are_written_through_unpredictable_names(fresh, monkeypatch):
    kernels, _ = fresh
    made = []
    real = tempfile.mkstemp

    def spy(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        made.append(name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", spy)
    kernel = specialize.specialized(flow_append, _ops(15))
    assert _where(kernel) == kernels
    (name,) = made
    assert Path(name).parent == kernels and not Path(name).exists()    # renamed into place
    assert str(os.getpid()) not in Path(name).name.split(".")[-2]      # a random part
    assert [p.suffix for p in kernels.iterdir() if p.is_file()] == [".py"]
