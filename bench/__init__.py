"""Benchmark scripts (not installed): run as `python -m bench.NAME`."""
