"""NetFlow v9 encoder (RFC 3954): templates 256/257 (IPv4/IPv6), options template 258.

Header (20 bytes): version 9, count = every record in the packet (template records, the
options template record, the options data record and the data records), sys_uptime ms,
unix_secs, sequence (+1 per export packet, whatever it holds), source id. FIRST_SWITCHED (22)
and LAST_SWITCHED (21) are sys_uptime ms (see clock.py for the capture-time rule). The
options template (scope System = source id) carries SAMPLING_INTERVAL (34) and
SAMPLING_ALGORITHM (35: 1 deterministic) in one options data record sent with the templates.
ICMP flows carry type*256+code both in L4_DST_PORT (the v5 habit) and ICMP_TYPE (32), which
is where nfdump looks for it.
v9 has no flow end reason field; IPFIX carries it.
"""

from __future__ import annotations

import struct

import numpy as np

from tools.netflow.templates import (
    TEMPLATE_OPTIONS,
    TEMPLATE_V4,
    TEMPLATE_V6,
    TemplateEncoder,
    set_bytes,
    template_body,
)

HEADER = struct.Struct(">HHIIII")

_COMMON_HEAD = [(1, 8, "bytes"), (2, 8, "packets"), (4, 1, "protocol"), (5, 1, "tos"),
                (6, 1, "tcp_flags"), (7, 2, "src_port")]
_COMMON_TAIL = [(10, 4, "input"), (11, 2, "dst_port")]
_TIMES = [(21, 4, "last_up"), (22, 4, "first_up"), (32, 2, "icmp"), (58, 2, "vlan"),
          (60, 1, "ipversion")]
FIELDS_V4 = _COMMON_HEAD + [(8, 4, "src4")] + _COMMON_TAIL + [(12, 4, "dst4")] + _TIMES
FIELDS_V6 = _COMMON_HEAD + [(27, 16, "src6")] + _COMMON_TAIL + [(28, 16, "dst6")] + _TIMES


class V9Encoder(TemplateEncoder):
    """Flow records -> NetFlow v9 export packets."""

    version = 9
    header_size = HEADER.size
    fields_v4 = FIELDS_V4
    fields_v6 = FIELDS_V6

    def template_sets(self) -> tuple[bytes, int, int]:
        templates = set_bytes(0, template_body(TEMPLATE_V4, FIELDS_V4)
                              + template_body(TEMPLATE_V6, FIELDS_V6))
        # options template: id, scope length (bytes), options length (bytes), scope, options
        options = set_bytes(1, np.array([TEMPLATE_OPTIONS, 4, 8, 1, 4, 34, 4, 35, 1],
                                        ">u2").tobytes())
        algorithm = 1
        data = set_bytes(TEMPLATE_OPTIONS, struct.pack(">IIB", self.source_id,
                                                       self.sampling_interval, algorithm))
        return templates + options + data, 4, 1

    def header(self, count: int, length: int, export_ms: int, sys_uptime: int,
               data_records: int) -> bytes:
        head = HEADER.pack(9, count, sys_uptime, export_ms // 1000, self.sequence & 0xFFFF_FFFF,
                           self.source_id)
        self.sequence += 1
        return head
