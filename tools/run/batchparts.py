"""The per-batch part files behind a resumable run's output that is written whole at the end.

A Parquet file has no footer until it is closed, and an aligned table at full speed (or the
outputs of several queries sharing stdout at full speed) is printed once, at the end: a
crash leaves none of them to continue. In a run that can resume (`tools.run.resume`), such
an output keeps each micro-batch's rows as a part file under the checkpoint instead
(`CHECKPOINT/outputs/<query>.parts/part-<batch>.parquet`, written through a temporary name
and a rename: a part is absent or complete). A batch that the checkpoint replays after a
crash finds its part and writes nothing twice; when the run ends, `tools.run.outputs`
writes the output from the parts, in batch order.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

_PART = re.compile(r"^part-(\d+)\.parquet$")


class BatchParts:
    """One output's part files, one per micro-batch that had rows, named by batch id."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)

    def path(self, batch_id: int) -> Path:
        return self.dir / f"part-{batch_id:012d}.parquet"

    def batch_ids(self) -> list[int]:
        """The batches written, in order (a temporary file of a part cut short is none)."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := _PART.match(n)))

    def holds(self, batch_id: int) -> bool:
        """The batch is written already (a batch the checkpoint replays after a crash)."""
        return self.path(batch_id).exists()

    def last(self) -> int:
        """The last batch id written, -1 when none."""
        ids = self.batch_ids()
        return ids[-1] if ids else -1

    def write(self, batch_id: int, table) -> None:
        """The batch's rows as its part: whole or not at all (raises OSError)."""
        import pyarrow.parquet as pq

        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.path(batch_id)
        tmp = final.with_name(f".{final.name}.tmp")
        try:
            pq.write_table(table, tmp, compression="snappy")
            os.replace(tmp, final)
        except BaseException:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise

    def read(self, batch_id: int):
        """The rows of one part (raises OSError, or pyarrow's error for a damaged part)."""
        import pyarrow.parquet as pq

        return pq.read_table(self.path(batch_id))

    def tables(self):
        """Every part's rows, in batch order, one table at a time (bounded memory)."""
        for batch_id in self.batch_ids():
            yield batch_id, self.read(batch_id)

    def rows(self) -> int:
        """The rows of every part, from the footers (no data is read)."""
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(self.path(b)).metadata.num_rows for b in self.batch_ids())
