"""Where a stage's closed rows go: the `Sink` protocol, and the spool sinks that feed one stage from another.

The file sinks, the run's outputs and the NetFlow exporter are sinks of the application
(`tools.results`: format writers x commit models). Results are per-window rows (orders of
magnitude fewer than partials), handed over from the driver with Arrow in the output types.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

# pyarrow is imported where a sink first needs it: the run's outputs are sinks, and the run
# imports them before it starts the JVM

log = logging.getLogger(__name__)


class Sink:
    """Receives each micro-batch's closed rows (an Arrow table in the output schema).

    Every sink a stage writes to is one: the spool sinks between stages here, the outputs
    of `tools.results` (part files, the run's appended outputs, NetFlow). A
    subclass defines `write`, and may change the defaults: a sink with `raw = True` receives
    the rows in the raw layout of `highlevel.rowlayout` (`window` = row time in ns, ip as two
    int64 halves) instead of the display schema; `end_batch(batch_id, punctuation)` is called
    once at the end of every processed micro-batch, before the stage commits it, with the
    stage's output punctuation (ns; None before the first), so a sink feeding another stage
    can forward it. A join gives a sink with `side` set (0 left, 1 right: a reader whose
    windows are on that side's time) that side's individual punctuation, and a `joint` one
    (a reader grouping by both sides' times) its individual and joint punctuation
    (`highlevel.join.JoinStage.sink_punctuation`).
    """

    raw: bool = False
    side: int | None = None
    joint: bool = False

    def write(self, batch_id: int, table: pa.Table) -> bool:
        """Write the rows of `batch_id`; False when that batch was already written."""
        raise NotImplementedError

    def end_batch(self, batch_id: int, punctuation) -> None:
        """The batch's rows are all written (a no-op unless the sink forwards punctuation)."""

    def close(self) -> None:
        """No more batches."""


class SpoolSink(Sink):
    """Feeds a reading stage: each micro-batch's rows and output punctuation become one spool
    file of the reader (`ROOT/<reader>/partials/<link>-<batch>.parquet`, the atomic format of
    `common.spool`), link name = `link` (the upstream query, or the join/MERGE alias).

    The file's sequence number is the micro-batch id, so a batch replayed after a crash finds
    its file and writes nothing twice, and the reader applies the punctuation in batch order.
    `prefix` is put before every data column (join sides share one spool directory). `side`
    (0 left, 1 right; feeding from a join only): the reader's windows are on that side's
    time, so the join gives it that side's individual punctuation. `joint`: the reader also
    groups by the other side's time (highlevel.joint), so the join gives a tuple (that side's
    individual punctuation, the other's, the joint pair on this side's and the other's time)
    and the file carries the last three in the `JOINT_MARKERS` columns.
    """

    raw = True

    def __init__(self, root, reader: str, link: str, prefix: str = "", side: int | None = None,
                 joint: bool = False):
        from common.spool import SpoolWriter

        self.writer = SpoolWriter(root, reader, link, fsync=False)
        self.prefix = prefix
        self.side = side
        self.joint = joint
        self.pending: dict[int, pa.Table] = {}
        self.files = 0

    def write(self, batch_id: int, table: pa.Table) -> bool:
        if self.prefix:
            table = table.rename_columns([c if c == "window" else self.prefix + c
                                          for c in table.column_names])
        self.pending[batch_id] = table.replace_schema_metadata(None)
        return True

    def end_batch(self, batch_id: int, punctuation) -> None:
        from common.spool import JOINT_MARKERS, spool_file_name

        table = self.pending.pop(batch_id, None)
        if (self.writer.dir / spool_file_name(self.writer.link, batch_id)).exists():
            return   # written before a crash: the same rows (batches are deterministic)
        self.writer.seq = batch_id
        markers = None
        if self.joint:
            punctuation, *more = punctuation if punctuation is not None else [None] * 4
            markers = dict(zip(JOINT_MARKERS, more))
        self.writer.write(table, punctuation, markers)
        self.files += 1
