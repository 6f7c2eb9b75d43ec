"""IPFIX encoder (RFC 7011): templates 256/257 (IPv4/IPv6), options template 258.

Message header (16 bytes): version 10, length, export time (s), sequence = data records sent
in this observation domain before this message (template and options records do not count),
observation domain id. Records carry flowStartMilliseconds/flowEndMilliseconds (152/153,
absolute capture-time ms), 64-bit octetDeltaCount/packetDeltaCount, IPv6 addresses (27/28),
flowEndReason (136), ingressInterface (10), vlanId (58) and ipVersion (60). Over UDP the
templates are resent periodically (templates.py). When sampling (interval > 1) an options
template (scope observationDomainId 149) and an options data record carrying samplingInterval
(34) and samplingAlgorithm (35) go with them; that record counts in the sequence number, as
RFC 7011 says of every data record. nfdump 1.7.1 counts only flow records, so it reports one
"sequence failure" per template resend of a SAMPLED export; unsampled exports (the default)
send no options record and every reader agrees.
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

HEADER = struct.Struct(">HHIII")

_HEAD = [(1, 8, "bytes"), (2, 8, "packets"), (4, 1, "protocol"), (5, 1, "tos"),
         (6, 2, "tcp_flags"), (7, 2, "src_port")]
_MID = [(10, 4, "input"), (11, 2, "dst_port")]
_TAIL = [(58, 2, "vlan"), (60, 1, "ipversion"), (136, 1, "end_reason"),
         (152, 8, "first_ms"), (153, 8, "last_ms")]
# ICMP type*256+code: icmpTypeCodeIPv4 (32) / icmpTypeCodeIPv6 (139), and in the destination port
FIELDS_V4 = _HEAD + [(8, 4, "src4")] + _MID + [(12, 4, "dst4"), (32, 2, "icmp")] + _TAIL
FIELDS_V6 = _HEAD + [(27, 16, "src6")] + _MID + [(28, 16, "dst6"), (139, 2, "icmp")] + _TAIL


class IpfixEncoder(TemplateEncoder):
    """Flow records -> IPFIX messages."""

    version = 10
    header_size = HEADER.size
    fields_v4 = FIELDS_V4
    fields_v6 = FIELDS_V6

    def template_sets(self) -> tuple[bytes, int, int]:
        templates = set_bytes(2, template_body(TEMPLATE_V4, FIELDS_V4)
                              + template_body(TEMPLATE_V6, FIELDS_V6))
        # options template: id, field count, scope field count, then scope and option fields
        options = set_bytes(3, np.array([TEMPLATE_OPTIONS, 3, 1, 149, 4, 34, 4, 35, 1],
                                        ">u2").tobytes())
        if self.sampling_interval == 1:
            return templates, 2, 0
        algorithm = 1
        data = set_bytes(TEMPLATE_OPTIONS, struct.pack(">IIB", self.source_id,
                                                       self.sampling_interval, algorithm))
        return templates + options + data, 4, 1

    def header(self, count: int, length: int, export_ms: int, sys_uptime: int,
               data_records: int) -> bytes:
        head = HEADER.pack(10, length, export_ms // 1000, self.sequence & 0xFFFF_FFFF,
                           self.source_id)
        self.sequence += data_records
        return head
