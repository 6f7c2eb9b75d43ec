"""The driver JVM's launch (highlevel.jvm): spark-submit's command is remembered from the running
JVM and reused (same command line, same session), a remembered command that cannot start falls
back to spark-submit and is replaced, the key follows what the launch reads, the niceness asked
for is the JVM's, and the JVM does not hold our stdout. Real JVMs, each in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from highlevel import jvm

REPO = Path(__file__).resolve().parents[2]

#: one session in a fresh process: prints how the JVM started, its niceness and command line
_PROBE = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")
    from highlevel.session import get_session
    spark = get_session(nice=int(sys.argv[1]))
    from pyspark import SparkContext
    pid = SparkContext._gateway.proc.pid
    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")[:-1]
    import os
    print(json.dumps({"nice": int(stat[16]), "count": spark.range(7).count(),
                      "argv": [a.decode() for a in argv],
                      "stdout": [os.readlink(f"/proc/{p}/fd/1") for p in ("self", pid)]}))
""")


def _share_archive(cache: Path) -> bool:
    """Give the probes' private cache this user's class-data archive (a link), if there is
    one: each of the test's JVMs then maps it, ~3.5 CPU s less to start, as a user's does.
    Without one, the probes go without (writing one would make a launch that is never
    remembered, `jvm.launch_key`)."""
    from highlevel.jvmcache import existing_archive

    archive = existing_archive()
    if archive is None:
        return False
    (cache / "oopscope").mkdir(mode=0o700, exist_ok=True)
    (cache / "oopscope" / archive.name).symlink_to(archive)
    return True


def _probe(cache: Path, nice: int = 0, cds: bool = False) -> tuple[dict, str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONPATH=str(REPO),
               OOPSCOPE_SPARK_CDS="1" if cds else "0")
    env.pop("OOPSCOPE_SPARK_LAUNCH_CACHE", None)
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(nice)], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _how(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if "driver JVM pid" in ln]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0].rsplit("(", 1)[1].rstrip(")")


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "oopscope").glob("jvm-launch-*.json"))


@pytest.mark.slow
def test_launch_is_remembered_reused_and_replaced_when_it_fails(tmp_path):
    cds = _share_archive(tmp_path)
    first, err = _probe(tmp_path, nice=3, cds=cds)
    assert _how(err) == "spark-submit"
    assert first["count"] == 7 and first["nice"] == 3       # the niceness reached the JVM
    assert cds == any(a.startswith("-XX:SharedArchiveFile=") for a in " ".join(
        first["argv"]).split())
    # the JVM does not hold our stdout: a reader of it gets EOF when we exit, not when the
    # JVM has shut down too
    ours, jvms = first["stdout"]
    assert ours != jvms and jvms.startswith("pipe:")
    (entry,) = _entries(tmp_path)
    saved = json.loads(entry.read_text())
    assert saved["argv"] == first["argv"]
    assert os.path.basename(saved["argv"][0]) == "java"
    assert saved["env"].get("SPARK_HOME")                   # what the scripts exported

    second, err = _probe(tmp_path, nice=3, cds=cds)
    assert _how(err) == "remembered"
    assert second["argv"] == first["argv"]                  # the same JVM command line
    assert second["count"] == 7 and second["nice"] == 3

    # another niceness is not part of the command: the same entry serves it
    third, err = _probe(tmp_path, nice=0, cds=cds)
    assert _how(err) == "remembered" and third["nice"] == 0

    saved["argv"][0] = str(tmp_path / "no-such-java")
    entry.write_text(json.dumps(saved))
    fourth, err = _probe(tmp_path, nice=3, cds=cds)
    assert _how(err) == "spark-submit" and fourth["count"] == 7
    assert "remembered JVM launch failed" in err
    assert json.loads(entry.read_text())["argv"] == first["argv"]    # replaced


def test_the_key_follows_what_the_launch_reads(tmp_path, monkeypatch):
    monkeypatch.delenv("OOPSCOPE_SPARK_LAUNCH_CACHE", raising=False)
    home = tmp_path / "spark"
    (home / "bin").mkdir(parents=True)
    (home / "jars").mkdir()
    for name in ("spark-submit", "spark-class", "load-spark-env.sh"):
        (home / "bin" / name).write_text("#!/bin/sh\n")
    command = [str(home / "bin" / "spark-submit"), "--conf", "spark.master=local[*]",
               "pyspark-shell"]
    env = {"PATH": os.environ.get("PATH", ""), "HOME": "/root", "SPARK_LOCAL_IP": "127.0.0.1"}
    key = jvm.launch_key(command, env, str(home))
    assert key is not None and key == jvm.launch_key(list(command), dict(env), str(home))
    # unrelated variables do not matter; the ones the scripts and launcher read do
    assert jvm.launch_key(command, dict(env, TERM="xterm", OLDPWD="/"), str(home)) == key
    assert jvm.launch_key(command, dict(env, SPARK_LOCAL_IP="10.0.0.1"), str(home)) != key
    assert jvm.launch_key(command, dict(env, JAVA_HOME="/opt/jdk"), str(home)) != key
    assert jvm.launch_key(command[:-1] + ["--conf", "a=b", "pyspark-shell"], env,
                          str(home)) != key
    # the installation: a script or the jars folder changed, a conf file added
    os.utime(home / "bin" / "spark-class", ns=(1, 1))
    changed = jvm.launch_key(command, env, str(home))
    assert changed != key
    (home / "conf").mkdir()
    (home / "conf" / "spark-defaults.conf").write_text("spark.driver.memory 2g\n")
    assert jvm.launch_key(command, env, str(home)) not in (key, changed)
    # never remembered: a spark-env.sh (a script that may read anything), a dump named by
    # this process, or turned off
    (home / "conf" / "spark-env.sh").write_text("export X=1\n")
    assert jvm.launch_key(command, env, str(home)) is None
    (home / "conf" / "spark-env.sh").unlink()
    dump = command[:-1] + ["--conf", "spark.driver.extraJavaOptions=-XX:ArchiveClassesAtExit=x",
                           "pyspark-shell"]
    assert jvm.launch_key(dump, env, str(home)) is None
    monkeypatch.setenv("OOPSCOPE_SPARK_LAUNCH_CACHE", "0")
    assert jvm.launch_key(command, env, str(home)) is None


def test_only_a_spark_jvm_is_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    jvm.remember("k" * 16, os.getpid(), dict(os.environ))      # this Python process
    assert not _entries(tmp_path)
    assert jvm.remembered("k" * 16) is None
    (tmp_path / "oopscope").mkdir()
    (tmp_path / "oopscope" / f"jvm-launch-{'k' * 16}.json").write_text("{not json")
    assert jvm.remembered("k" * 16) is None


def test_submit_command_takes_pyspark_submit_args(monkeypatch):
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--conf spark.ui.enabled=true pyspark-shell")
    monkeypatch.delenv("SPARK_TESTING", raising=False)
    cmd = jvm.submit_command("/opt/spark", [("spark.master", "local[2]")])
    assert cmd == ["/opt/spark/bin/spark-submit", "--conf", "spark.master=local[2]",
                   "--conf", "spark.ui.enabled=true", "pyspark-shell"]
