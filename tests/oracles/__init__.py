"""Independent oracles of the tests: the brute-force reference evaluator and sample packets."""
