"""What an aggregation's batch runners get: the stage's `StageContext` and one `Batch`'s inputs.

`highlevel.aggregate.AggregateStage` decides, per micro-batch, what the batch's markers and
Meld say and which way it closes; the runners (`highlevel.microbatch`: the Spark path, the
driver path of flow records, the batch computed ahead; `highlevel.smallbatch`: small batches
combined on the driver) then do the closing. They use the stage only through these two
objects, which the stage makes for the batch: its configuration and state store, and the
steps it owns (emit, commit, combine, close), bound to it so that a kind overriding one
(`highlevel.running`, `highlevel.joint`) is still the one called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

    from highlevel.batchfiles import SpoolFileMarker
    from highlevel.flowrecords import FlowRecords
    from highlevel.spec import StageSpec
    from highlevel.stage import Ticker
    from highlevel.state import StageState, StateStore
    from highlevel.windows import WindowLogic


@dataclass(frozen=True)
class Batch:
    """One micro-batch of an aggregation after its markers and Meld: the state it starts from
    (`prev`, committed by the batch before) and the one it commits (`state`), its spool
    files, the combined punctuation and whether it closes more than `prev` did, and the
    partial rows kept (not late)."""

    batch_id: int
    files: list[SpoolFileMarker]
    prev: StageState
    state: StageState
    punctuation: int | None
    advanced: bool
    kept: int

    @property
    def open_dir(self) -> str:
        """The directory name of the open state this batch writes."""
        return f"open-{self.batch_id:010d}"


@dataclass(frozen=True)
class StageContext:
    """The part of an aggregate stage its batch runners use (module docstring), made by
    `AggregateStage.context` with the stage's settings as they are now."""

    spec: StageSpec
    window: WindowLogic
    store: StateStore
    tick: Ticker
    #: the Spark session (started on first use: a driver batch may never need it)
    session: Callable[[], Any]
    #: sort a result, write it to the sinks once; the rows written (`AggregateStage.emit`)
    emit: Callable[..., int]
    #: commit a batch's state: the sinks' batch end, then the state version
    commit: Callable[[StageState], None]
    # --- the Spark path
    #: the partial rows combined per (window, keys) (the rows as they are when unique)
    combine: Callable[[DataFrame], DataFrame]
    #: rows unique per (window, keys): nothing to combine, so nothing worth caching
    unique_rows: bool
    #: finalise and write the windows closing now; the rows written (`AggregateStage.close`)
    close: Callable[..., int]
    #: tumbling windows: close and collect the open rows in one job (`AggregateStage.
    #: close_keeping`): (rows written, open rows)
    close_keeping: Callable[..., tuple[int, pa.Table]]
    #: the rows that stay open after closing through a punctuation
    retained: Callable[[int], Column]
    #: the open state is collected and written with Arrow rather than by a Spark job
    open_on_driver: bool
    # --- the driver paths
    flow_records: FlowRecords | None
    #: the output and hidden columns of closed rows (HAVING applied), collected
    finalize: Callable[[DataFrame], pa.Table]
    #: Spark's Arrow result sorted, in the output schema
    output_table: Callable[[pa.Table], pa.Table]
    #: remove a driver batch's spool files once it is committed (`Stage.prune_spool`)
    prune_spool: bool

    @property
    def spark(self):
        return self.session()
