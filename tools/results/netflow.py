"""A Spark-stage sink streaming each micro-batch's closed flow records to a NetFlow collector over UDP.

    NetflowSink("127.0.0.1:2055", 10)   # version 5, 9 or 10 (IPFIX); mtu=, pcap=, pace= ...

`write(batch_id, table)` encodes the batch's rows (the `netflow` query's columns) and sends
them; a batch id already sent is not sent again (False), so a re-run micro-batch does not
duplicate records. Sends that fail are counted (see `stats()`), never raised: a collector
that is down never stops the query. Nor does any other fault of the exporter (rows it cannot
read, a record it cannot encode): the batch's records are counted as not exported, the fault
is logged once per kind and named in the summary, and the query and its other outputs go on.
`close()` logs the summary line.

Sent datagrams are neither commit model of `tools.results` (a collector keeps what it got);
the same datagrams go to a file as the `netflow` format (`tools.results.formats.NetflowWriter`:
a pcap appended with a resume log, or a pcap per batch).
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
        #: micro-batches the exporter failed on, their records, and each kind of fault once
        self.fault_batches = 0
        self.fault_records = 0
        self.faults: dict[str, int] = {}

    def write(self, batch_id: int, table) -> bool:
        if batch_id in self._done:
            log.info("netflow sink: batch %d already sent", batch_id)
            return False
        self._done.add(batch_id)
        if table.num_rows:
            try:
                self.exporter.export(table, where=f"micro-batch {batch_id}: ")
            except Exception as exc:   # any fault of the exporter: the query must go on
                self._fault(batch_id, table.num_rows, exc)
        return True

    def _fault(self, batch_id: int, records: int, exc: Exception) -> None:
        text = str(exc)
        where = f"micro-batch {batch_id}: "     # the same fault in every batch is one kind
        kind = f"{type(exc).__name__}: {text[len(where):] if text.startswith(where) else text}"
        self.fault_batches += 1
        self.fault_records += records
        if kind not in self.faults:
            log.warning("netflow: micro-batch %d (%d records) not exported: %s (counted; the "
                        "query and its other outputs go on)", batch_id, records, kind)
            log.debug("netflow: the exporter's fault", exc_info=exc)
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def stats(self) -> dict:
        return {**self.exporter.stats(), "fault_batches": self.fault_batches,
                "fault_records": self.fault_records, "faults": dict(self.faults)}

    def summary(self) -> str:
        text = self.exporter.summary()
        if self.fault_batches:
            text += (f"; {self.fault_records} records of {self.fault_batches} micro-batch(es) "
                     f"not exported (" + ", ".join(f"{k} x{v}" for k, v in self.faults.items())
                     + ")")
        return text

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.exporter.close()
            # failed sends are worth a warning: the collector missed records
            level = logging.WARNING if self.failed() else logging.INFO
            log.log(level, "%s", self.exporter.summary())

    def failed(self) -> int:
        """Datagrams that failed to send plus micro-batches the exporter failed on."""
        s = self.exporter.stats().get("sent")
        return (s["failed_datagrams"] if s else 0) + self.fault_batches
