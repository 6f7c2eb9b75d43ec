"""A Spark-stage sink streaming each micro-batch's closed flow records to a NetFlow collector.

    NetflowSink("127.0.0.1:2055", 10)   # version 5, 9 or 10 (IPFIX); mtu=, pcap=, pace= ...

`write(batch_id, table)` encodes the batch's rows (the `netflow` query's columns) and sends
them; a batch id already sent is not sent again (False), so a re-run micro-batch does not
duplicate records. Sends that fail are counted (see `stats()`), never raised: a collector
that is down never stops the query. `close()` logs the summary line.
"""

from __future__ import annotations

import logging

from highlevel.sinks import Sink
from tools.netflow.exporter import Exporter

log = logging.getLogger(__name__)


class NetflowSink(Sink):
    """Sends closed flow records of every micro-batch as NetFlow v5 / v9 / IPFIX datagrams."""

    def __init__(self, target: str, version: int = 9, **options):
        self.exporter = Exporter(target, version, **options)
        self._done: set[int] = set()
        self.closed = False

    def write(self, batch_id: int, table) -> bool:
        if batch_id in self._done:
            log.info("netflow sink: batch %d already sent", batch_id)
            return False
        self._done.add(batch_id)
        if table.num_rows:
            self.exporter.export(table, where=f"micro-batch {batch_id}: ")
        return True

    def stats(self) -> dict:
        return self.exporter.stats()

    def summary(self) -> str:
        return self.exporter.summary()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.exporter.close()
            # failed sends are worth a warning: the collector missed records
            level = logging.WARNING if self.failed() else logging.INFO
            log.log(level, "%s", self.exporter.summary())

    def failed(self) -> int:
        s = self.exporter.stats().get("sent")
        return s["failed_datagrams"] if s else 0
