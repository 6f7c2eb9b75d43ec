"""The high level on Spark: combine partial aggregates, Meld/Merge links, close windows, sinks."""

import warnings

# pyspark warns at import about pandas >= 3; the high level exchanges Arrow tables, not pandas
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
