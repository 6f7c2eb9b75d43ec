"""The low level: the operator (WHERE, group keys, panes), fixed-size hash and flow tables, flush policies, aggregate kernels, the vectorised evaluator, HyperLogLog."""
