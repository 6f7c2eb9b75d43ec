"""The exporter's clock in capture time: boot times, export times and sys_uptime values.

Offline runs replay history, so the wall clock means nothing to a collector. The rule, per
datagram (`stamp`):

- **export time** of a datagram = the latest `last` of its records, rounded UP to the second
  (v9 and IPFIX headers carry whole seconds; v5 uses the same value with unix_nsecs 0), and
  never less than the previous datagram's (monotonic), so export time >= every record's end;
- **boot time** = the earliest `first` of the first records exported (of the first table, or
  of its first datagram when the table spans too long for one boot time), floored to the
  second, minus `boot_lead_ms` (default one hour, so that records of later datagrams that
  began a little earlier still have a valid uptime);
- **sys_uptime** = export time - boot time (ms); a record's FIRST/LAST = its time - boot time.

A collector computing `unix_secs*1000 - sys_uptime + first` gets the record's capture time back
to the ms. sys_uptime and the FIRST/LAST fields are 32-bit ms (~49.7 days). Whenever a datagram
needs it, the exporter **reboots** (the boot time moves to the datagram's earliest record,
minus the lead, counted in `reboots` and logged): when the uptime would pass 2^32-1 ms, and
when a record began before the boot time. If the datagram's records lie so far before the
previous export that the monotonic export time cannot reach back to them in 2^32 ms, its export
time follows its own records after the reboot (a collector sees time go back, as after a router
restart). The encoders never put records spanning more than `MAX_SPAN_MS` in one datagram
(`fitting`), so every datagram's uptimes are exact; only a single record longer than that
is clamped to the uptime range (counted in `clamped`).
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)

U32_MAX = 0xFFFF_FFFF
DEFAULT_BOOT_LEAD_MS = 3_600_000


def _floor_s(ms: int) -> int:
    return ms // 1000 * 1000


def _ceil_s(ms: int) -> int:
    return -(-ms // 1000) * 1000


class ExportClock:
    """Boot time, export times and uptimes for one exporter (kept across tables)."""

    def __init__(self, boot_lead_ms: int = DEFAULT_BOOT_LEAD_MS):
        self.boot_lead_ms = int(boot_lead_ms)
        self.boot_ms: int | None = None
        self.last_export_ms = 0
        self.clamped = 0
        self.reboots = 0

    @property
    def max_span_ms(self) -> int:
        """The widest [earliest first, latest last] of one datagram's records (ms): with the
        lead and the rounding to seconds, its uptimes still fit 32 bits."""
        return U32_MAX - self.boot_lead_ms - 2000

    def fitting(self, first_ms: np.ndarray, last_ms: np.ndarray) -> int:
        """How many leading records (at least one) can share a datagram, and so one boot."""
        if len(first_ms) <= 1:
            return len(first_ms)
        span = np.maximum.accumulate(last_ms.astype(np.int64)) \
            - np.minimum.accumulate(first_ms.astype(np.int64))
        over = np.flatnonzero(span > self.max_span_ms)
        return int(over[0]) if len(over) and over[0] > 0 else (1 if len(over) else len(span))

    def serves(self, first_ms: int, last_ms: int) -> bool:
        """Whether datagrams of records within [first_ms, last_ms] need no reboot (none has
        fixed the boot time yet, or the current one covers them)."""
        if self.boot_ms is None:
            return last_ms - first_ms <= self.max_span_ms
        return (first_ms >= self.boot_ms
                and max(_ceil_s(last_ms), self.last_export_ms) - self.boot_ms <= U32_MAX)

    def stamp(self, first_ms: int | None, last_ms: int | None) -> tuple[int, int]:
        """(export ms, sys_uptime ms) of a datagram whose records began at `first_ms` at the
        earliest and ended by `last_ms` (None, None: one without data records); reboots the
        clock when the datagram needs it."""
        if last_ms is None or first_ms is None:
            export = self.last_export_ms or ((self.boot_ms or 0) + self.boot_lead_ms)
            if self.boot_ms is None:
                self.boot_ms = export - self.boot_lead_ms
        else:
            export = max(_ceil_s(int(last_ms)), self.last_export_ms)
            boot = self.boot_ms
            if boot is None or first_ms < boot or export - boot > U32_MAX:
                if boot is not None:
                    self.reboots += 1
                    log.info("netflow: the exporter reboots at %d ms (uptime %d ms, a record "
                             "from %d ms)", export, export - boot, first_ms)
                boot = _floor_s(int(first_ms)) - self.boot_lead_ms
                if export - boot > U32_MAX:      # records far before the last export
                    export = _ceil_s(int(last_ms))
                if export - boot > U32_MAX:      # one record longer than the uptime range
                    boot = export - U32_MAX
                self.boot_ms = boot
        self.last_export_ms = export
        assert self.boot_ms is not None     # set above whenever it was missing
        return export, export - self.boot_ms

    def uptime(self, ms: np.ndarray, boot_ms: np.ndarray | None = None) -> np.ndarray:
        """Record times as uint32 ms since boot (clamped to [0, 2^32-1], clamps counted);
        `boot_ms`: each record's boot time (its datagram's), else the current one."""
        if len(ms) == 0:     # may come before any record fixed the boot time
            return np.zeros(0, np.uint32)
        if boot_ms is None:
            assert self.boot_ms is not None   # `stamp` fixed it for these records
            up = ms.astype(np.int64) - self.boot_ms
        else:
            up = ms.astype(np.int64) - boot_ms
        bad = (up < 0) | (up > U32_MAX)
        if bad.any():
            self.clamped += int(bad.sum())
            up = np.clip(up, 0, U32_MAX)
        return up.astype(np.uint32)
