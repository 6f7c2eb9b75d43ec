"""The exporter's clock in capture time: a boot time, export times and sys_uptime values.

Offline runs replay history, so the wall clock means nothing to a collector. The rule:

- **boot time** = the first record's start (the earliest `first` of the first table exported),
  floored to the second, minus `boot_lead_ms` (default one hour, so that records of later
  micro-batches that began a little earlier than the first one still have a valid uptime);
- **export time** of a datagram = the latest `last` of its records, rounded UP to the second
  (v9 and IPFIX headers carry whole seconds; v5 uses the same value with unix_nsecs 0), and
  never less than the previous datagram's (monotonic), so export time >= every record's end;
- **sys_uptime** = export time - boot time (ms); a record's FIRST/LAST = its time - boot time.

A collector computing `unix_secs*1000 - sys_uptime + first` gets the record's capture time back
to the ms. A record starting before boot is clamped to uptime 0 (counted in `clamped`). When
an export would pass 2^32-1 ms of uptime (~49.7 days of capture), the exporter "reboots": the
boot time moves to the current records' start (logged; v9/IPFIX collectors see an uptime
going back, as after a router restart).
"""

from __future__ import annotations

import logging
from typing import overload

import numpy as np

log = logging.getLogger(__name__)

U32_MAX = 0xFFFF_FFFF
DEFAULT_BOOT_LEAD_MS = 3_600_000


class ExportClock:
    """Boot time, monotonic export times and uptimes for one exporter (kept across tables)."""

    def __init__(self, boot_lead_ms: int = DEFAULT_BOOT_LEAD_MS):
        self.boot_lead_ms = int(boot_lead_ms)
        self.boot_ms: int | None = None
        self.last_export_ms = 0
        self.clamped = 0

    def start(self, first_ms: np.ndarray, last_ms: np.ndarray) -> None:
        """Fix (or move, near the 32-bit uptime limit) the boot time for these records."""
        if len(first_ms) == 0:
            return
        earliest = int(first_ms.min())
        latest = max(int(last_ms.max()), self.last_export_ms)
        if self.boot_ms is None or -(-latest // 1000) * 1000 - self.boot_ms > U32_MAX:
            if self.boot_ms is not None:
                log.warning("netflow: uptime would pass 2^32 ms; the exporter reboots at %d ms",
                            earliest)
            self.boot_ms = (earliest // 1000) * 1000 - self.boot_lead_ms

    def uptime(self, ms: np.ndarray) -> np.ndarray:
        """Record times as uint32 ms since boot (clamped to [0, 2^32-1], clamps counted)."""
        if len(ms) == 0:     # may come before any record fixed the boot time
            return np.zeros(0, np.uint32)
        assert self.boot_ms is not None   # `start` fixed it for these records
        up = ms.astype(np.int64) - self.boot_ms
        bad = (up < 0) | (up > U32_MAX)
        if bad.any():
            self.clamped += int(bad.sum())
            up = np.clip(up, 0, U32_MAX)
        return up.astype(np.uint32)

    def export_times(self, chunk_last_ms: np.ndarray) -> np.ndarray:
        """Export ms (whole seconds, monotonic) of consecutive datagrams given their latest `last`."""
        if len(chunk_last_ms) == 0:
            return np.zeros(0, np.int64)
        t = -(-chunk_last_ms.astype(np.int64) // 1000) * 1000
        t = np.maximum.accumulate(np.maximum(t, self.last_export_ms))
        self.last_export_ms = int(t[-1])
        return t

    def export_time(self, last_ms: int | None) -> int:
        """Export ms of one datagram (`last_ms` None: one carrying no data records)."""
        if last_ms is None:
            t = self.last_export_ms or ((self.boot_ms or 0) + self.boot_lead_ms)
        else:
            t = max(-(-int(last_ms) // 1000) * 1000, self.last_export_ms)
        self.last_export_ms = t
        return t

    @overload
    def sys_uptime(self, export_ms: int) -> int: ...
    @overload
    def sys_uptime(self, export_ms: np.ndarray) -> np.ndarray: ...
    def sys_uptime(self, export_ms):
        return export_ms - self.boot_ms
