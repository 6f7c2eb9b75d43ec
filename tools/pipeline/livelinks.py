"""Live interfaces as links: one capture thread per interface feeding a packet ring.

Per interface a thread polls its AF_PACKET ring (`capture.live.LiveCapture`: the kernel fills
a memory-mapped TPACKET_V3 ring, the thread decodes retired blocks in a nogil kernel) and
pushes the packets into the link's fixed-size `capture.ring.PacketRing`, which never blocks
and counts what it has to drop. The same thread generates the link's timer punctuation on the
wall clock (kernel timestamps are wall-clock times) and pushes it in order with the data, so a
silent interface still closes windows. The main thread takes from every ring and runs the low
level (`tools.pipeline.feeds.LinkFeeds`). Numba kernels release the GIL, so decoding and aggregating
use both cores.

A link whose queries read `TCP_data` or `UDP_data` (`payload=True`) captures the payloads too
and its packet ring gets a payload area of RING_PAYLOAD_BYTES: a packet whose payload finds
no room there is dropped and counted like one that finds no row (a ring drop).
"""

from __future__ import annotations

import logging
import threading
import time

from capture.punctuation import next_tick as next_tick_at
from capture.punctuation import tick_due

log = logging.getLogger(__name__)

RING_ROWS = 1 << 20
#: the payload area of a link that captures payloads: as large as the default kernel ring (64
#: blocks of 4 MiB), so the packet ring holds as many payload bytes as the kernel could hand
#: over at once; 256 bytes a row on average, or about 2.7 batches of 65,536 payloads of 1,460
#: bytes (a full Ethernet frame's TCP payload)
RING_PAYLOAD_BYTES = 256 << 20


class LiveLink(threading.Thread):
    """The capture thread of one interface; with `payload`, its batches carry the TCP/UDP
    payloads through a ring with a payload area of `payload_bytes`."""

    def __init__(self, name: str, interface: str, feeds, *, period_ns: int,
                 ring_rows: int = RING_ROWS, options: dict | None = None, payload: bool = False,
                 payload_bytes: int = RING_PAYLOAD_BYTES):
        super().__init__(name=f"oopscope-capture-{name}", daemon=True)
        from capture.live import LiveCapture
        from capture.ring import PacketRing

        self.link, self.interface = name, interface
        self.timer = feeds.timer          # driven from this thread only
        self.period_ns = period_ns
        # opened here, in the caller's thread: a missing interface or right fails the run now
        self.capture = LiveCapture(interface, link=name, payload=payload, **(options or {}))
        try:
            self.ring = PacketRing.create(ring_rows, link=name, shared=False,
                                          payload_bytes=payload_bytes if payload else 0)
        except BaseException:
            self.capture.close()
            raise
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        # after the wall clock's period boundaries (`capture.punctuation.next_tick`), by
        # the kernel's frame timeout and a little: the packets past a window's end are
        # then taken by its tick
        margin = (self.capture.frame_timeout_ms + 20) * 1_000_000
        next_tick = next_tick_at(time.time_ns(), self.period_ns, margin)
        try:
            while not self.stopping.is_set():
                wait = max(0.0, min(0.05, (next_tick - time.time_ns()) / 1e9))
                batch = self.capture.poll(wait)
                if batch is not None and len(batch):
                    self.ring.push(batch)
                    self.timer.observe(int(batch["timestamp"].max()))
                now = time.time_ns()
                if tick_due(now, next_tick, self.period_ns):
                    p = self.timer.fire(now)
                    if p is not None:
                        self.ring.punctuate(p)
                    next_tick = next_tick_at(now, self.period_ns, margin)
        except BaseException as exc:   # handed to the main thread, which reports it
            self.error = exc
        finally:
            self.ring.finish()

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        self.capture.close()


def run_live(lives: dict, feeds: dict, *, duration_ns: int | None, stop=lambda: False,
             batch_rows: int = 65536) -> str:
    """Take from every interface's ring into its feeds until the duration ends, a stop is
    asked (SIGTERM / Ctrl-C) or a capture thread fails. Finishes every link."""
    for live in lives.values():
        live.start()
    started = time.monotonic()
    reason = "stopped"
    try:
        while True:
            if stop():
                break
            if duration_ns is not None and (time.monotonic() - started) * 1e9 >= duration_ns:
                reason = "duration"
                break
            failed = [live for live in lives.values() if live.error is not None]
            if failed:
                reason = "capture failed"
                break
            if not _drain(lives, feeds, batch_rows):
                time.sleep(0.005)
    finally:
        for live in lives.values():
            live.stop()
        for live in lives.values():
            live.join(timeout=5)
        # whatever the threads pushed before they stopped still goes through
        while _drain(lives, feeds, batch_rows):
            pass
        for name, live in lives.items():
            live.close()
            feeds[name].finish()
    for live in lives.values():
        if live.error is not None:
            from capture.errors import CaptureError

            raise CaptureError(f"interface {live.interface} (link {live.link}): capture "
                               f"failed: {live.error}") from live.error
    return reason


def _drain(lives: dict, feeds: dict, batch_rows: int) -> bool:
    """One pass over the rings; True when anything was taken."""
    took = False
    for name, live in lives.items():
        batch, p = live.ring.take(batch_rows)
        if batch is not None and len(batch):
            feeds[name].process(batch)
            took = True
        if p is not None:
            feeds[name].punctuate(p)
            took = True
        live.ring.release()
    return took
