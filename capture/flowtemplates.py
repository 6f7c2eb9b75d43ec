"""NetFlow v9 / IPFIX templates: what each information element becomes (`ELEMENTS`), and the
cache of an input's templates and options per (exporter, observation domain, template id).

A data template is compiled once, when it arrives, into one row of the kernel's field arrays
(`f_slot`, `f_kind`, `f_len`: `capture.flowkernels.decode_sets`), so decoding its data sets
needs no Python per record. Options templates are kept parsed: their data records (rare: the
sampling interval, the active timeout, the exporter's boot time) are read in Python. The
cache's `state` / `from_state` keep it in a run's state, so that a restarted run decodes at
once rather than waiting for the exporters to resend their templates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from capture import flowkernels as fk

#: information element id -> (slot, conversion) for the NETFLOW fields (elements not here are
#: skipped by their length). Ids are IANA's (RFC 7012), the same in NetFlow v9 for 1..127.
ELEMENTS: dict[int, tuple[int, int]] = {
    1: (fk.S_BYTES, fk.K_UINT), 85: (fk.S_BYTES, fk.K_UINT),            # octetDelta/TotalCount
    2: (fk.S_PACKETS, fk.K_UINT), 86: (fk.S_PACKETS, fk.K_UINT),        # packetDelta/TotalCount
    4: (fk.S_PROTOCOL, fk.K_UINT), 5: (fk.S_TOS, fk.K_UINT), 6: (fk.S_TCP_FLAGS, fk.K_UINT),
    7: (fk.S_SRCPORT, fk.K_UINT), 11: (fk.S_DSTPORT, fk.K_UINT),
    8: (fk.S_SRC_HI, fk.K_ADDR4), 12: (fk.S_DST_HI, fk.K_ADDR4),
    27: (fk.S_SRC_HI, fk.K_ADDR6), 28: (fk.S_DST_HI, fk.K_ADDR6),
    15: (fk.S_NH_HI, fk.K_ADDR4), 62: (fk.S_NH_HI, fk.K_ADDR6),
    10: (fk.S_INPUT, fk.K_UINT), 14: (fk.S_OUTPUT, fk.K_UINT),
    16: (fk.S_SRC_AS, fk.K_UINT), 17: (fk.S_DST_AS, fk.K_UINT),
    22: (fk.S_FIRST, fk.K_UPTIME_MS), 21: (fk.S_LAST, fk.K_UPTIME_MS),
    150: (fk.S_FIRST, fk.K_EPOCH_S), 151: (fk.S_LAST, fk.K_EPOCH_S),
    152: (fk.S_FIRST, fk.K_EPOCH_MS), 153: (fk.S_LAST, fk.K_EPOCH_MS),
    154: (fk.S_FIRST, fk.K_NTP), 155: (fk.S_LAST, fk.K_NTP),
    156: (fk.S_FIRST, fk.K_NTP), 157: (fk.S_LAST, fk.K_NTP),
    34: (fk.S_SAMPLING, fk.K_UINT), 305: (fk.S_SAMPLING, fk.K_UINT),
    60: (fk.S_IPVERSION, fk.K_UINT),
    # ICMP type * 256 + code: the destination port of ICMP flows, as nfdump shows them
    32: (fk.S_DSTPORT, fk.K_NONZERO), 139: (fk.S_DSTPORT, fk.K_NONZERO),
}
#: options elements read from options data records
OPT_SAMPLING = (34, 305, 50)            # samplingInterval, samplingPacketInterval, v9's 50
OPT_ACTIVE_TIMEOUT = 36                 # flowActiveTimeout (seconds)
OPT_IDLE_TIMEOUT = 37                   # flowIdleTimeout (seconds)
OPT_SYSTEM_INIT_MS = 160                # systemInitTimeMilliseconds (IPFIX uptime fields)

#: the NetFlow v5 record (48 bytes) as a template: (ie, length) in order
V5_FIELDS = ((8, 4), (12, 4), (15, 4), (10, 2), (14, 2), (2, 4), (1, 4), (22, 4), (21, 4),
             (7, 2), (11, 2), (0, 1), (6, 1), (4, 1), (5, 1), (16, 2), (17, 2), (0, 1), (0, 1),
             (0, 2))
V5_TEMPLATE_ROW = 0


@dataclass(frozen=True)
class Template:
    """A parsed template: its fields as (element id, length, enterprise number or 0); scope
    fields first for an options template (`scope` of them)."""

    fields: tuple[tuple[int, int, int], ...]
    options: bool = False
    scope: int = 0

    @property
    def fixed_length(self) -> int:
        return sum(ln for _, ln, _ in self.fields if ln != fk.VARLEN)


class TemplateCache:
    """An input's templates per (exporter, domain, template id), compiled for the kernel, and
    each (exporter, domain)'s options (sampling interval, active timeout, boot time)."""

    def __init__(self, width: int = 32):
        self._templates: dict[tuple[str, int, int], tuple[Template, int]] = {}
        self.options: dict[tuple[str, int], dict[str, int]] = {}
        self.f_count = np.zeros(0, np.int32)
        self.f_slot = np.zeros((0, width), np.int16)
        self.f_kind = np.zeros((0, width), np.int8)
        self.f_len = np.zeros((0, width), np.int32)
        self._rows: dict[Template, int] = {}
        #: bumped whenever a template or an option changes (a run saves its state then)
        self.revision = 0
        self._compile(Template(tuple((ie, ln, 0) for ie, ln in V5_FIELDS)))

    def __len__(self) -> int:
        return len(self._templates)

    def _compile(self, t: Template) -> int:
        """The kernel row of data template `t` (rows are shared by equal templates)."""
        row = self._rows.get(t)
        if row is not None:
            return row
        nf = len(t.fields)
        width = self.f_slot.shape[1]
        if nf > width:
            grow = max(nf, 2 * width) - width
            self.f_slot = np.pad(self.f_slot, ((0, 0), (0, grow)))
            self.f_kind = np.pad(self.f_kind, ((0, 0), (0, grow)))
            self.f_len = np.pad(self.f_len, ((0, 0), (0, grow)))
        slot = np.zeros(self.f_slot.shape[1], np.int16)
        kind = np.zeros(self.f_slot.shape[1], np.int8)
        length = np.zeros(self.f_slot.shape[1], np.int32)
        for k, (ie, ln, pen) in enumerate(t.fields):
            s, c = (0, fk.K_SKIP) if pen else ELEMENTS.get(ie, (0, fk.K_SKIP))
            slot[k], kind[k], length[k] = s, c, ln
        row = len(self.f_count)
        self.f_count = np.append(self.f_count, np.int32(nf))
        self.f_slot = np.vstack([self.f_slot, slot[None]])
        self.f_kind = np.vstack([self.f_kind, kind[None]])
        self.f_len = np.vstack([self.f_len, length[None]])
        self._rows[t] = row
        return row

    def learn(self, exporter: str, domain: int, template_id: int, t: Template) -> None:
        """Add or replace a template."""
        row = -1 if t.options else self._compile(t)
        key = (exporter, domain, template_id)
        if self._templates.get(key) != (t, row):
            self._templates[key] = (t, row)
            self.revision += 1

    def withdraw(self, exporter: str, domain: int, template_id: int) -> None:
        if self._templates.pop((exporter, domain, template_id), None) is not None:
            self.revision += 1

    def find(self, exporter: str, domain: int, template_id: int) -> tuple[Template, int] | None:
        """(template, kernel row; -1 for an options template) or None when unknown."""
        return self._templates.get((exporter, domain, template_id))

    def note_option(self, exporter: str, domain: int, name: str, value: int) -> None:
        opts = self.options.setdefault((exporter, domain), {})
        if opts.get(name) != int(value):
            opts[name] = int(value)
            self.revision += 1

    def option(self, exporter: str, domain: int, name: str) -> int | None:
        return self.options.get((exporter, domain), {}).get(name)

    # --- a run's state -------------------------------------------------------------------------

    def state(self) -> dict:
        """The templates and options as plain JSON-able data."""
        return {
            "templates": [[e, d, i, [list(f) for f in t.fields], t.options, t.scope]
                          for (e, d, i), (t, _) in self._templates.items()],
            "options": [[e, d, v] for (e, d), v in self.options.items()],
        }

    @classmethod
    def from_state(cls, state: dict) -> TemplateCache:
        cache = cls()
        for e, d, i, fields, options, scope in state.get("templates", []):
            cache.learn(str(e), int(d), int(i),
                        Template(tuple((int(a), int(b), int(c)) for a, b, c in fields),
                                 bool(options), int(scope)))
        for e, d, v in state.get("options", []):
            cache.options[(str(e), int(d))] = {str(k): int(x) for k, x in v.items()}
        return cache
