"""An exporter: flow tables in, datagrams of one NetFlow version out to a collector and/or a pcap.

    ex = Exporter("127.0.0.1:2055", version=10, mtu=1500, pcap="out.pcap")
    ex.export(table)        # any number of times (sequence numbers, clock, templates carry on)
    ex.close(); ex.stats()  # datagrams/records sent, failed sends by errno, skipped, split

The datagram payload is sized to the path MTU: `mtu` - IP header (20, or 40 when the
collector is IPv6) - 8 (UDP): 1472 bytes for the default 1500 over IPv4.
"""

from __future__ import annotations

import logging

from tools.netflow.clock import DEFAULT_BOOT_LEAD_MS, ExportClock
from tools.netflow.ipfix import IpfixEncoder
from tools.netflow.records import FlowRecords, from_table
from tools.netflow.sender import (
    DEFAULT_PACE,
    DEFAULT_PORT,
    PcapWriter,
    UdpSender,
    max_payload,
    parse_target,
)
from tools.netflow.v5 import V5Encoder
from tools.netflow.v9 import V9Encoder

log = logging.getLogger(__name__)

VERSIONS = (5, 9, 10)


def make_encoder(version: int, payload: int, sampling_interval: int = 1, source_id: int = 0,
                 template_every_messages: int = 64, template_every_s: float = 60.0,
                 clock: ExportClock | None = None):
    """The encoder of NetFlow `version` (5, 9, or 10 = IPFIX)."""
    if version == 5:
        return V5Encoder(payload, sampling_interval, engine_id=source_id & 0xFF, clock=clock)
    cls = {9: V9Encoder, 10: IpfixEncoder}.get(version)
    if cls is None:
        raise ValueError(f"NetFlow version {version}: allowed 5, 9, 10 (IPFIX)")
    return cls(payload, sampling_interval, source_id, template_every_messages, template_every_s,
               clock)


class Exporter:
    """Encodes flow tables and sends the datagrams (UDP, pcap, or both); never raises on send."""

    def __init__(self, target: str | None, version: int = 9, *, mtu: int = 1500,
                 pcap: str | None = None, sampling_interval: int = 1, source_id: int = 0,
                 pace: float = DEFAULT_PACE, sndbuf: int | None = None,
                 template_every_messages: int = 64, template_every_s: float = 60.0,
                 boot_lead_ms: int = DEFAULT_BOOT_LEAD_MS):
        if version not in VERSIONS:
            from tools.errors import NetflowError

            raise NetflowError(f"--netflow-version {version}: allowed 5, 9, 10 (IPFIX)")
        self.version = version
        self.sender = UdpSender(target, pace=pace, sndbuf=sndbuf) if target else None
        ipv6 = self.sender.ipv6 if self.sender else False
        self.pcap = None
        if pcap:
            dst = (self.sender.sockaddr[0], self.sender.port) if self.sender else \
                ("127.0.0.1", DEFAULT_PORT)
            self.pcap = PcapWriter(pcap, dst)
        self.encoder = make_encoder(version, max_payload(mtu, ipv6), sampling_interval,
                                    source_id, template_every_messages, template_every_s,
                                    ExportClock(boot_lead_ms))

    def export_records(self, records: FlowRecords) -> int:
        """Encode and send; returns the number of datagrams."""
        datagrams = self.encoder.encode(records)
        if self.sender:
            self.sender.send(datagrams)
        if self.pcap:
            self.pcap.send(datagrams)
        return len(datagrams)

    def export(self, table, where: str = "") -> int:
        """Export the rows of an Arrow table (or DataFrame) of netflow records."""
        return self.export_records(from_table(table, where))

    def stats(self) -> dict:
        out = {"version": self.version, **self.encoder.stats,
               "clamped_times": self.encoder.clock.clamped,
               "clock_reboots": self.encoder.clock.reboots}
        if self.sender:
            out["sent"] = self.sender.stats.as_dict()
        if self.pcap:
            out["pcap_packets"] = self.pcap.packets
        return out

    def summary(self) -> str:
        s = self.stats()
        parts = [f"netflow v{self.version}: {s['records_out']} records in {s['datagrams']} datagrams"]
        if self.sender:
            sent = s["sent"]
            parts.append(f"to {self.sender.host}:{self.sender.port}: {sent['datagrams']} sent, "
                         f"{sent['failed_datagrams']} failed ({sent['failed_records']} records"
                         + (", " + ", ".join(f"{k} x{v}" for k, v in sent["errors"].items())
                            if sent["errors"] else "") + ")")
        if self.pcap:
            parts.append(f"{s['pcap_packets']} packets to the pcap")
        if s.get("skipped_ipv6"):
            parts.append(f"{s['skipped_ipv6']} IPv6 records skipped (v5 is IPv4 only)")
        if s.get("split_extra"):
            parts.append(f"{s['split_extra']} extra records from splitting 32-bit counters")
        if s["clock_reboots"] and self.version != 10:
            parts.append(f"the exporter's clock rebooted {s['clock_reboots']} time(s) (records "
                         f"more than 49 days apart)")
        if s["clamped_times"]:
            parts.append(f"{s['clamped_times']} times clamped to the uptime range")
        return "; ".join(parts)

    def close(self) -> None:
        if self.sender:
            self.sender.close()
        if self.pcap:
            self.pcap.close()


__all__ = ["Exporter", "make_encoder", "parse_target", "VERSIONS"]
