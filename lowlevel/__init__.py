"""The low level: Numba kernels for WHERE, group keys and sub-aggregation in fixed-size hash tables."""
