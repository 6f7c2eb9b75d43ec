"""Facts every level shares: errors, Numba options, time units, settings, the spool contract."""
