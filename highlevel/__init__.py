"""The high level on Spark: combine partial aggregates, Meld/Merge links, close windows, sinks."""
