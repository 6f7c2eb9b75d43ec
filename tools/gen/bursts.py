"""Timed bursts of UDP frames on an interface: traffic whose per-second truth is known exactly.

Each burst is sent in the middle of one wall-clock second (by default from .4 s on), and
takes milliseconds, so every frame of burst k carries a kernel timestamp inside second k: the
exact count per 1-second window of what was sent, whatever the capture's own delays. The
tests of the appliance run it inside a network namespace at the far end of a veth pair:

    python -m tools.gen.bursts IFACE --per-burst 200 --seconds 10

prints one JSON line per burst, `{"second": S, "packets": N, "bytes": B}`, as it is sent.
Frames are built once as bytes (Ethernet, IPv4, UDP) and written to an AF_PACKET socket.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def udp_frame(src: str, dst: str, sport: int, dport: int, payload: int) -> bytes:
    """An Ethernet II / IPv4 / UDP frame with `payload` bytes of data."""
    data = b"o" * payload
    udp = struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    eth = bytes.fromhex("020000005302" "020000005301") + b"\x08\x00"
    return eth + ip + udp


def frames(count: int, sources: int = 4) -> list[bytes]:
    """`count` frames over `sources` source addresses and a few sizes."""
    return [udp_frame(f"198.51.100.{1 + i % sources}", "203.0.113.9", 40000 + i % sources,
                      5000, 18 + (i * 7) % 200) for i in range(count)]


def send_bursts(iface: str, per_burst: int, seconds: int, at: float = 0.4,
                out=sys.stdout) -> list[dict]:
    """Send one burst of `per_burst` frames in each of the next `seconds` seconds."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    sock.bind((iface, 0))
    burst = frames(per_burst)
    size = sum(len(f) for f in burst)
    sent = []
    second = int(time.time()) + 1
    for _ in range(seconds):
        wait = second + at - time.time()
        if wait > 0:
            time.sleep(wait)
        for f in burst:
            sock.send(f)
        if int(time.time()) != second:      # took too long: the truth would be unsure
            raise SystemExit(f"burst of second {second} overran it")
        record = {"second": second, "packets": per_burst, "bytes": size}
        sent.append(record)
        print(json.dumps(record), file=out, flush=True)
        second += 1
    sock.close()
    return sent


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("iface")
    ap.add_argument("--per-burst", type=int, default=200)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--at", type=float, default=0.4, help="offset in the second (0-0.9)")
    args = ap.parse_args(argv)
    send_bursts(args.iface, args.per_burst, args.seconds, args.at)


if __name__ == "__main__":
    main()
