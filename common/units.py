"""Time units: every timestamp in oopscope is an int64 count of nanoseconds since the epoch."""

from __future__ import annotations

NS_PER_US = 1_000
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000

#: the largest timestamp (int64); bounds and punctuation saturate here
INT64_MAX = (1 << 63) - 1
