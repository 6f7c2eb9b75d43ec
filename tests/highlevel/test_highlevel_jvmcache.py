"""The cache directory of the driver JVM's start-up (highlevel.jvmcache) and `oopscope warmup` /
`oopscope cache`: the directory is private or not used, the class-data archive is written by one
process at a time (the lock) and renamed into place by it, nothing temporary stays behind, the
archives are bounded, and `cache clear` empties it. Every test has its own XDG_CACHE_HOME under
tmp_path; the decisions that last for a process (the archive's options) are made in processes of
their own, the JVM ones with real JVMs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from highlevel import jvmcache
from tools.cli import main

REPO = Path(__file__).resolve().parents[2]


def _env(cache_home: Path, **extra) -> dict[str, str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home), PYTHONPATH=str(REPO), **extra)
    # the launches as users have them (the suite makes every JVM quick: one launch for all)
    for name in ("OOPSCOPE_SPARK_CDS", "OOPSCOPE_SPARK_LAUNCH_CACHE", "OOPSCOPE_SPARK_QUICK_JVM"):
        env.pop(name, None)
    return env


def _python(code: str, cache_home: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=_env(cache_home), cwd=REPO, timeout=timeout,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob("*.tmp"))


def test_the_cache_dir_is_created_private_and_tightened(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    cache = jvmcache.cache_dir()
    assert cache == tmp_path / "home" / "oopscope"
    assert cache.stat().st_mode & 0o777 == 0o700
    cache.chmod(0o755)                     # ours but readable by others: made private
    assert jvmcache.cache_dir() == cache and cache.stat().st_mode & 0o777 == 0o700


def test_a_cache_dir_others_can_write_is_refused(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "oopscope"
    cache.mkdir()
    cache.chmod(0o770)
    assert jvmcache.cache_dir() is None
    assert f"cache directory {cache} is writable by others than its owner (mode 0770)" \
        in caplog.text
    # its launch entries are neither read nor written; the JVM's log profile goes elsewhere,
    # under a name nobody could have planted
    from highlevel import jvm

    (cache / "jvm-launch-kkkk.json").write_text(json.dumps({"argv": ["/bin/evil"], "env": {}}))
    assert jvm.remembered("kkkk") is None
    profile = jvmcache.config_file("log4j2", ".properties", "rootLogger.level = warn\n")
    assert profile.parent != cache and profile.name.startswith("oopscope-log4j2-")
    assert profile.stat().st_mode & 0o777 == 0o600 and profile.stat().st_uid == os.getuid()
    profile.unlink()
    # a process in which the Spark settings are made uses none of the caches
    out = _python("""
        from highlevel import session
        print(repr(session.class_data_options()), session.log4j2_config())
    """, tmp_path)
    options, profile = out.stdout.split()
    assert options == "''" and not profile.startswith(str(cache))
    assert not Path(profile).exists()               # removed at the process's exit
    assert sorted(p.name for p in cache.iterdir()) == ["jvm-launch-kkkk.json"]


@pytest.mark.skipif(os.getuid() != 0, reason="giving the directory to another user needs root")
def test_a_cache_dir_of_another_user_is_refused(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "oopscope"
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)
    assert jvmcache.cache_dir() is None
    assert "is owned by uid 65534" in caplog.text
    proc = subprocess.run([sys.executable, "-m", "tools.cli", "cache", "clear"],
                          capture_output=True, text=True, env=_env(tmp_path), cwd=REPO,
                          timeout=60, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"oopscope: error: cache directory {cache} is owned by uid "
                                   f"65534, not by this user (uid 0): not removed")
    assert cache.is_dir()


def test_cache_info_and_clear(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    main(["cache", "info"])
    assert "does not exist yet" in capsys.readouterr().out
    cache = jvmcache.cache_dir()
    (cache / "spark-0123456789ab.jsa").write_bytes(b"\0" * 4096)
    (cache / "jvm-launch-k.json").write_text("{}")
    (cache / "kernels").mkdir()
    (cache / "kernels" / "append_x.py").write_text("x = 1\n")
    (cache / jvmcache.LOCK_NAME).touch()
    main(["cache", "info"])
    out = capsys.readouterr().out
    assert f"{cache}: mode 0700, in use" in out
    for name in ("spark-0123456789ab.jsa", "jvm-launch-k.json", "kernels", "cds.lock"):
        assert name in out
    assert "4 entries, 4.1 kB" in out
    main(["cache", "clear"])
    out = capsys.readouterr().out
    assert f"removed {cache / 'spark-0123456789ab.jsa'}" in out
    assert "4 entries removed, 4.1 kB; the directory too" in out
    assert not cache.exists()
    main(["cache", "clear"])
    assert "nothing to remove" in capsys.readouterr().out


def test_the_lock_is_respected_and_nothing_temporary_stays(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = jvmcache.cache_dir()
    probe = """
        import json
        from highlevel import jvmcache
        print(jvmcache.class_data_options())
        print(json.dumps(sorted(p.name for p in jvmcache.cache_dir().glob("*.tmp"))))
    """
    held = jvmcache.try_lock(cache)
    assert held is not None
    try:
        options, _ = _python(probe, tmp_path).stdout.splitlines()
        assert options == ""                         # another process writes the archive
        assert jvmcache.try_lock(cache) is None      # the lock is one
    finally:
        os.close(held)
    # the lock free: this process would write the archive, to a private temporary name; no
    # JVM was started, so at exit the name is removed and the lock released
    options, tmps = _python(probe, tmp_path).stdout.splitlines()
    assert options.startswith(f"-XX:ArchiveClassesAtExit={cache}/spark-")
    assert options.split()[0].endswith(".jsa.tmp")
    assert len(json.loads(tmps)) == 1
    assert _leftovers(cache) == [] and not list(cache.glob("spark-*.jsa"))
    fd = jvmcache.try_lock(cache)
    assert fd is not None
    os.close(fd)


def test_stale_temporary_files_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = jvmcache.cache_dir()
    dead = _dead_pid()
    stale = [f"spark-0123456789ab.{dead}.jsa.tmp",             # the former code's dump
             f"spark-0123456789ab.{os.getpid()}.x1y2.jsa.tmp",  # a JVM killed while dumping
             f".jvm-launch-k.{dead}.abcd.tmp"]
    for name in stale:
        (cache / name).write_bytes(b"x")
    (cache / f".jvm-launch-k.{os.getpid()}.efgh.tmp").write_bytes(b"x")   # a live writer's
    fd = jvmcache.try_lock(cache)
    removed = jvmcache.tidy(cache, locked=fd is not None)
    os.close(fd)
    assert sorted(p.name for p in removed) == sorted(stale)
    assert _leftovers(cache) == [f".jvm-launch-k.{os.getpid()}.efgh.tmp"]
    # without the lock an archive's temporary file may be a live JVM's: kept
    (cache / stale[1]).write_bytes(b"x")
    assert jvmcache.tidy(cache, locked=False) == []


def test_archives_are_bounded(tmp_path, monkeypatch):
    cache = tmp_path
    now = time.time()
    for age, key in enumerate(("aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc", "dddddddddddd")):
        path = cache / f"spark-{key}.jsa"
        path.write_bytes(b"\0" * 1000)
        os.utime(path, (now - age * 60, now - age * 60))
    # this installation's (the oldest here) and the newest other one
    removed = jvmcache.prune(cache, keep="dddddddddddd")
    assert sorted(p.name for p in cache.glob("*.jsa")) == ["spark-aaaaaaaaaaaa.jsa",
                                                           "spark-dddddddddddd.jsa"]
    assert len(removed) == 2
    monkeypatch.setattr(jvmcache, "MAX_BYTES", 1500)       # the bytes bound as well
    jvmcache.prune(cache, keep="dddddddddddd")
    assert [p.name for p in cache.glob("*.jsa")] == ["spark-dddddddddddd.jsa"]


#: a process with a session, as a run has: what its JVM was given and maps (a Python function
#: run by Spark connects pyspark's accumulator server, which must not see the JVM go away)
_SESSION_PROBE = """
    import json
    from highlevel import jvmcache
    from highlevel.session import get_session
    spark = get_session()
    count = spark.sparkContext.parallelize(range(5), 1).map(lambda x: x + 1).count()
    from pyspark import SparkContext
    pid = SparkContext._gateway.proc.pid
    print(json.dumps({"options": jvmcache.class_data_options(), "count": count,
                      "mapped": jvmcache.mapped_archive(pid)}))
"""


@pytest.mark.slow
def test_concurrent_first_runs_write_one_archive(tmp_path):
    cache = tmp_path / "oopscope"
    env = _env(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SESSION_PROBE)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=REPO) for _ in range(2)]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        # the JVM's exit, waited for while it writes the archive, says nothing
        assert "Exception" not in stderr and "ERROR" not in stderr, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert all(o["count"] == 5 for o in outs)
    # one wrote the archive (it held the lock), the other went without
    dumps = sorted(o["options"].startswith("-XX:ArchiveClassesAtExit") for o in outs)
    assert dumps == [False, True], outs
    assert [o["options"] for o in outs if "ArchiveClassesAtExit" not in o["options"]] == [""]
    archives = list(cache.glob("spark-*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 10**6
    assert _leftovers(cache) == []
    # it is complete at once: the next process maps it
    out = json.loads(_python(_SESSION_PROBE, tmp_path, timeout=300).stdout.splitlines()[-1])
    assert out["options"].startswith(f"-XX:SharedArchiveFile={archives[0]}")
    assert out["mapped"] == str(archives[0])


@pytest.mark.slow
def test_warmup_writes_the_archive_and_remembers_the_launch(tmp_path):
    cache = tmp_path / "oopscope"
    proc = subprocess.run([sys.executable, "-m", "tools.cli", "warmup", "--query", "q8_1"],
                          capture_output=True, text=True, env=_env(tmp_path), cwd=REPO,
                          timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Exception" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr[-3000:]
    archives = list(cache.glob("spark-*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 10**6
    assert "q8_1 compiled and run" in proc.stdout
    # progress on stderr: each step as it starts, then its time, in order
    steps = [line for line in proc.stderr.splitlines() if line.startswith("oopscope warmup: step")]
    assert [line.split(": ")[1] for line in steps] == \
        [f"step {n}/4" for n in (1, 1, 2, 2, 3, 3, 4, 4)], steps
    assert all(a.endswith(" ...") and b.startswith(a[:-4] + ": done in ")
               for a, b in zip(steps[::2], steps[1::2])), steps
    assert "a tiny capture" in steps[0] and "q8_1 over it" in steps[2] \
        and "q8_1 again" in steps[4] and "q8_1 paced" in steps[6], steps
    # the paced run's JVM (paced and live runs, `serve`) is launched and remembered too
    assert "oopscope warmup: paced run in " in proc.stdout
    assert proc.stdout.count("its java command is remembered for the next runs") == 2
    assert "the driver JVM wrote the class-data archive" in proc.stdout
    # the check run's JVM, launched as runs launch it, mapped the archive and was remembered
    assert f"the driver JVM maps {archives[0]}" in proc.stdout, proc.stdout
    assert "its java command is remembered for the next runs" in proc.stdout
    assert len(list(cache.glob("jvm-launch-*.json"))) == 2
    assert _leftovers(cache) == [] and not list(Path(tmp_path).glob("oopscope-*"))
    assert cache.stat().st_mode & 0o777 == 0o700
