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


def test_sessions_are_made_without_extension_providers_and_the_thread_is_set_back(spark):
    """`_no_extension_providers`: while the session is made, the JVM thread serving this
    Python thread finds no session extension provider (pyspark's jars hold Spark ML's, whose
    start costs half a second), py4j still finds Spark's classes, and the thread's class
    loader and py4j's lookup are set back afterwards."""
    from highlevel.session import DEFAULTS, _no_extension_providers

    context = spark.sparkContext
    jvm = context._jvm
    interface = jvm.java.lang.Class.forName("org.apache.spark.sql.SparkSessionExtensionsProvider")

    def providers() -> int:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        return jvm.java.util.ServiceLoader.load(interface, loader).stream().count()

    def lookup() -> str:
        return jvm.py4j.reflection.ReflectionUtil.getClassLoadingStrategy().getClass().getName()

    loader, strategy = jvm.java.lang.Thread.currentThread().getContextClassLoader(), lookup()
    assert providers() >= 1
    with _no_extension_providers(context, dict(DEFAULTS)):
        assert providers() == 0
        assert jvm.org.apache.spark.sql.classic.SparkSession.getDefaultSession().isDefined()
    assert providers() >= 1 and lookup() == strategy
    assert jvm.java.lang.Thread.currentThread().getContextClassLoader().equals(loader)
    with _no_extension_providers(context, {**DEFAULTS, "spark.sql.extensions": "x.Ext"}):
        assert providers() >= 1           # extensions asked for: the session as usual
    assert spark.sql("select 40 + 2 as x").collect()[0].x == 42
