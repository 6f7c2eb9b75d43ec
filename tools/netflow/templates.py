"""Template-based export (NetFlow v9 and IPFIX): field lists, record arrays, datagram packing.

A template is a list of (information element id, length, source) fields; its data records
are rows of a numpy structured array whose big-endian fields follow the template, built for
all records at once, so a datagram's data set is one slice's `tobytes()`. IPv4 and IPv6
records use two templates (256, 257); a datagram holds an IPv4 set, then an IPv6 set, filled
in record order within each family. Templates, the options template (258) and an options data
record with the sampling interval go in the first datagram and again every
`template_every_messages` datagrams or `template_every_s` seconds of export time (UDP
collectors that start late or restart learn them again). The records of one datagram span at
most the clock's 32-bit uptime range and share its boot time for that datagram (clock.py).
The version subclasses supply the header and the set encodings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tools.netflow.clock import ExportClock
from tools.netflow.records import FlowRecords

TEMPLATE_V4, TEMPLATE_V6, TEMPLATE_OPTIONS = 256, 257, 258
_NUMPY = {1: "u1", 2: ">u2", 4: ">u4", 8: ">u8"}


def record_dtype(fields: list[tuple[int, int, str]]) -> np.dtype:
    """The packed big-endian structured dtype of a template's data record."""
    parts = []
    for _ie, length, key in fields:
        if length == 16:  # an IPv6 address: high then low 64 bits, each big-endian
            parts += [(key + "_hi", ">u8"), (key + "_lo", ">u8")]
        else:
            parts.append((key, _NUMPY[length]))
    return np.dtype(parts)


def record_array(fields, rec: FlowRecords) -> np.ndarray:
    """Every record of `rec` as one structured array in the template's layout (uptime fields
    zero: the encoder sets them per datagram)."""
    arr = np.zeros(len(rec), record_dtype(fields))
    for _ie, length, key in fields:
        if key in ("src6", "dst6"):
            side = key[:3]
            arr[key + "_hi"] = getattr(rec, side + "_hi")
            arr[key + "_lo"] = getattr(rec, side + "_lo")
            continue
        if key == "src4":
            value = rec.src_v4
        elif key == "dst4":
            value = rec.dst_v4
        elif key == "icmp":  # ICMP type * 256 + code, the destPort of ICMP flows
            value = np.where((rec.protocol == 1) | (rec.protocol == 58), rec.dst_port, 0)
        elif key == "ipversion":
            value = np.where(rec.is_v6, 6, 4)
        elif key in ("first_up", "last_up"):
            continue    # uptimes depend on the datagram's boot time: set per datagram
        else:
            value = getattr(rec, key)
        if value.dtype.itemsize > length:  # reduced-size fields saturate rather than wrap
            value = np.minimum(value, (1 << (8 * length)) - 1)
        arr[key] = value
    return arr


def template_body(template_id: int, fields) -> bytes:
    """(template id, field count, (ie, length)...) as in both v9 and IPFIX template sets."""
    words = [template_id, len(fields)]
    for ie, length, _ in fields:
        words += [ie, length]
    return np.array(words, ">u2").tobytes()


def set_bytes(set_id: int, body: bytes) -> bytes:
    """A flowset/set: id, length (padding included), body, zero padding to 4 bytes."""
    pad = -(len(body) + 4) % 4
    return np.array([set_id, len(body) + 4 + pad], ">u2").tobytes() + body + b"\0" * pad


class TemplateEncoder:
    """Shared packing of v9 and IPFIX; subclasses give fields, header and option sets."""

    version = 0
    header_size = 0
    fields_v4: list = []
    fields_v6: list = []

    def __init__(self, max_payload: int = 1472, sampling_interval: int = 1, source_id: int = 0,
                 template_every_messages: int = 64, template_every_s: float = 60.0,
                 clock: ExportClock | None = None):
        self.max_payload = max_payload - max_payload % 4
        self.sampling_interval = max(1, int(sampling_interval))
        self.source_id = source_id
        self.template_every_messages = max(1, int(template_every_messages))
        self.template_every_ms = int(template_every_s * 1000)
        self.clock = clock or ExportClock()
        self.sequence = 0
        self.size4 = record_dtype(self.fields_v4).itemsize
        self.size6 = record_dtype(self.fields_v6).itemsize
        self._templates, self._template_records, self._options_records = self.template_sets()
        self._since_templates: int | None = None   # messages since the last templates
        self._templates_ms = 0
        need = self.header_size + len(self._templates) + 4 + self.size6 + 3
        if need > self.max_payload:
            raise ValueError(f"a datagram payload of {max_payload} bytes cannot hold the "
                             f"templates and one record ({need} bytes)")
        self.stats = {"records_in": 0, "records_out": 0, "datagrams": 0, "template_sends": 0}

    # --- version specifics ----------------------------------------------------------------
    def template_sets(self) -> tuple[bytes, int, int]:
        """The template and options sets (with the sampling options record), the number of
        records they hold, and how many of those are options DATA records."""
        raise NotImplementedError

    def header(self, count: int, length: int, export_ms: int, sys_uptime: int,
               data_records: int) -> bytes:
        raise NotImplementedError

    # --- packing ---------------------------------------------------------------------------
    def _templates_due(self) -> bool:
        if self._since_templates is None:
            return True
        # abs: after a reboot the export time may go back (clock.py)
        return (self._since_templates >= self.template_every_messages
                or abs(self.clock.last_export_ms - self._templates_ms) >= self.template_every_ms)

    def encode(self, rec: FlowRecords) -> list[tuple[bytes, int, int]]:
        """Datagrams (payload, data records, export ms) for `rec`; state kept across calls."""
        self.stats["records_in"] += len(rec)
        if len(rec) == 0:
            return []
        v6 = rec.is_v6
        # per family: [records, first ms, last ms, size, template id, next row]
        fam: list[list[Any]] = []
        for mask, fields, size, tid in ((~v6, self.fields_v4, self.size4, TEMPLATE_V4),
                                        (v6, self.fields_v6, self.size6, TEMPLATE_V6)):
            part = rec.take(mask) if not mask.all() else rec
            fam.append([record_array(fields, part), part.first_ms.astype(np.int64),
                        part.last_ms.astype(np.int64), size, tid, 0])
        uptimes = "first_up" in (fam[0][0].dtype.names or ())
        # the clock's span check per datagram only when the records need it (rarely: records
        # months apart in one table); else one boot time fits any datagram of them
        firsts = [f[1] for f in fam if len(f[1])]
        lasts = [f[2] for f in fam if len(f[2])]
        earliest = min(int(x.min()) for x in firsts)
        spread = max(int(x.max()) for x in lasts) - earliest
        check_span = spread > self.clock.max_span_ms
        # and when the clock's boot time serves the whole table, the table's earliest start
        # stands for each datagram's (no datagram can need a reboot): one numpy call less each
        same_boot = not check_span and self.clock.serves(earliest, earliest + spread)
        # first pass: which records go in which datagram, and each datagram's clock
        plan = []                                   # (templates?, [(family, pos, k)], stamp)
        boots: list[list[tuple[int, int]]] = [[] for _ in fam]     # per family: (rows, boot)
        while any(f[5] < len(f[0]) for f in fam):
            space = self.max_payload - self.header_size
            send_templates = self._templates_due()
            if send_templates:
                space -= len(self._templates)
            first = last = None
            taken = []
            for i, f in enumerate(fam):
                _, first_ms, last_ms, size, _, pos = f
                k = min(len(first_ms) - pos, (space - 4) // size) if space >= 4 + size else 0
                if k <= 0:
                    continue
                lo, hi = first_ms[pos:pos + k], last_ms[pos:pos + k]
                if check_span:    # records of one datagram share one boot time
                    k = self.clock.fitting(lo, hi) if first is None else \
                        self.clock.fitting(np.r_[first, lo], np.r_[last, hi]) - 1
                    if k <= 0:
                        continue
                    lo, hi = lo[:k], hi[:k]
                first = earliest if same_boot else \
                    int(lo.min()) if first is None else min(first, int(lo.min()))
                last = int(hi.max()) if last is None else max(last, int(hi.max()))
                taken.append((i, pos, k))
                space -= 4 + k * size + (-(k * size + 4) % 4)
                f[5] = pos + k
            export_ms, sys_uptime = self.clock.stamp(first, last)
            for i, _, k in taken:
                boots[i].append((k, export_ms - sys_uptime))
            plan.append((send_templates, taken, export_ms, sys_uptime))
            if send_templates:
                self._since_templates = 0
                self._templates_ms = export_ms
                self.stats["template_sends"] += 1
            assert self._since_templates is not None   # templates went out in the first message
            self._since_templates += 1
        if uptimes:
            # every record's uptimes at once, against the boot time of its datagram
            for f, segments in zip(fam, boots):
                if segments:
                    rows, boot = zip(*segments)
                    per_row = np.repeat(np.array(boot, np.int64), rows)
                    f[0]["first_up"] = self.clock.uptime(f[1], per_row)
                    f[0]["last_up"] = self.clock.uptime(f[2], per_row)
        # second pass: the datagrams, in order (headers number them)
        out = []
        for send_templates, taken, export_ms, sys_uptime in plan:
            body = [self._templates] if send_templates else []
            count = self._template_records if send_templates else 0
            data = 0
            for i, pos, k in taken:
                arr, tid = fam[i][0], fam[i][4]
                body.append(set_bytes(tid, arr[pos:pos + k].tobytes()))
                data += k
            payload = b"".join(body)
            length = self.header_size + len(payload)
            # an options data record is a data record too (RFC 7011 sequence numbers)
            records = data + (self._options_records if send_templates else 0)
            out.append((self.header(count + data, length, export_ms, sys_uptime, records)
                        + payload, data, export_ms))
            self.stats["records_out"] += data
        self.stats["datagrams"] += len(out)
        return out
