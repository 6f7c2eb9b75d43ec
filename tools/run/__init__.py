"""The run's outputs: format writers and their commit models (read by tools.pipeline)."""
