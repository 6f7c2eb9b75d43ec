"""The driver JVM's options: a local session starts with the quick-start JIT and collector
(read back from the running JVM), other masters and OOPSCOPE_SPARK_QUICK_JVM=0 keep the
JVM's defaults."""

from __future__ import annotations

import pytest

from highlevel.session import quick_jvm_options


def test_the_running_local_jvm_has_the_quick_start_options(spark):
    if not spark.sparkContext.master.startswith("local"):
        pytest.skip("the tests run on a cluster master: its driver keeps the JVM's defaults")
    bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    args = list(bean.getInputArguments())
    assert "-XX:TieredStopAtLevel=1" in args and "-XX:+UseSerialGC" in args


def test_quick_options_only_for_local_masters_unless_turned_off(monkeypatch):
    monkeypatch.delenv("OOPSCOPE_SPARK_QUICK_JVM", raising=False)
    assert "TieredStopAtLevel=1" in quick_jvm_options("local[*]")
    assert quick_jvm_options("spark://10.0.0.5:7077") == ""
    monkeypatch.setenv("OOPSCOPE_SPARK_QUICK_JVM", "0")
    assert quick_jvm_options("local[2]") == ""
