"""Where the Spark installation is: SPARK_HOME, or the pip-installed pyspark's own directory.

Both the driver JVM's launch (`highlevel.jvm`) and the key of the class-data archive
(`highlevel.jvmcache`) read it.
"""

from __future__ import annotations

import os


def spark_home() -> str:
    """SPARK_HOME, or the pip-installed pyspark's own directory, found without importing
    pyspark (its import takes ~0.1 s that the JVM's launch need not wait for)."""
    if "SPARK_HOME" in os.environ:
        return os.environ["SPARK_HOME"]
    from importlib.util import find_spec

    spec = find_spec("pyspark")
    if spec is not None and spec.origin is not None:
        home = os.path.dirname(spec.origin)
        if os.path.isfile(os.path.join(home, "bin", "spark-submit")) and \
                os.path.isdir(os.path.join(home, "jars")):
            return home
    from pyspark.find_spark_home import _find_spark_home

    return _find_spark_home()
