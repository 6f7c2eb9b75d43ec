"""The state store of a stage: what survives a micro-batch and a restart, one version per batch.

A stage's state after micro-batch N is a `StageState` (the punctuation its windows are closed
through, Meld's bounds, the next spool file expected per link and the punctuation of files
that came before their predecessor, counters, and what a stage kind keeps besides) plus the
Parquet directories it names: `open-<N>` holds the rows still open, and the row kinds keep
buffers `buf-...` named in `extra` (the join's stored sides, the Merge's waiting rows).

`StateStore.commit` writes `CHECKPOINT/state/<N>/meta.json` under a temporary name, lets the
sinks end the batch (`Sink.end_batch`: a crash before the rename replays the batch, and the
sinks are idempotent per batch id) and renames the directory into place: that rename is the
commit point of the batch. Versions older than the last `keep_versions`, and the directories
no kept version names, are removed behind (docs/architecture.md, "The high level";
docs/semantics.md, "Restart and exactly-once").
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class StageState:
    """What survives a micro-batch (and a restart): committed as `state/<batch>/meta.json`."""

    batch: int = -1
    open_dir: str | None = None          # Parquet dir of the open (not yet closed) panes
    punctuation: int | None = None       # combined punctuation P the windows are closed through
    meld: dict | None = None
    next_seq: dict = field(default_factory=dict)     # link -> next file seq to apply
    pending: dict = field(default_factory=dict)      # link -> {seq: punctuation or None}
    late_rows: int = 0
    closed_rows: int = 0
    corrected_rows: int = 0              # late 'correct': correction rows written
    zero_divisor_rows: int = 0           # rows written whose values met a zero divisor
    extra: dict = field(default_factory=dict)       # what other stage kinds keep (join, merge)

    def to_json(self) -> str:
        d = dict(self.__dict__)
        d["pending"] = {k: {str(s): p for s, p in v.items()} for k, v in self.pending.items()}
        return json.dumps(d, sort_keys=True)

    def for_batch(self, batch_id: int) -> StageState:
        """A copy to update in micro-batch `batch_id` (this one stays as committed)."""
        return StageState(**{**self.__dict__, "batch": batch_id, "next_seq": dict(self.next_seq),
                             "pending": {k: dict(v) for k, v in self.pending.items()},
                             "extra": dict(self.extra)})

    @classmethod
    def from_json(cls, text: str) -> StageState:
        d = json.loads(text)
        d["pending"] = {k: {int(s): p for s, p in v.items()} for k, v in d["pending"].items()}
        return cls(**d)


class StateStore:
    """The state versions of one stage under `root` (`CHECKPOINT/state`)."""

    def __init__(self, root: Path, keep_versions: int = 3):
        self.root = Path(root)
        self.keep_versions = keep_versions
        self.root.mkdir(parents=True, exist_ok=True)

    def version_dir(self, batch: int) -> Path:
        return self.root / f"{batch:010d}"

    def path(self, name: str) -> Path:
        """A directory the state names (`open_dir`, a buffer of `extra`)."""
        return self.root / name

    def load_latest(self, query: str) -> StageState:
        """The last committed state, or a fresh one."""
        versions = sorted(p for p in self.root.iterdir()
                          if p.is_dir() and p.name.isdigit() and (p / "meta.json").exists())
        if not versions:
            return StageState()
        state = StageState.from_json((versions[-1] / "meta.json").read_text())
        log.info("query %s: resuming after batch %d (P=%s)", query, state.batch,
                 state.punctuation)
        return state

    def commit(self, state: StageState, end_batch: Callable[[StageState], None]) -> None:
        """Commit `state` as the version of its batch; `end_batch(state)` runs just before
        the rename that commits it."""
        final = self.version_dir(state.batch)
        tmp = self.root / f".{final.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        (tmp / "meta.json").write_text(state.to_json())
        end_batch(state)
        os.rename(tmp, final)   # the commit point of the batch

    def collect_garbage(self, state: StageState) -> None:
        """Remove the versions before the last `keep_versions` and the directories that no
        kept version (open rows) or the committed `state` (buffers) names any more."""
        versions = sorted(p for p in self.root.iterdir() if p.name.isdigit())
        keep = versions[-self.keep_versions:]
        referenced = set()
        for v in keep:
            meta = v / "meta.json"
            if meta.exists():
                referenced.add(json.loads(meta.read_text()).get("open_dir"))
        for v in versions[:-self.keep_versions]:
            shutil.rmtree(v, ignore_errors=True)
        for d in self.root.glob("open-*"):
            if d.name not in referenced and int(d.name.split("-")[1]) < state.batch:
                shutil.rmtree(d, ignore_errors=True)
        buffers = {v for k, v in state.extra.items() if k.endswith("_dir") and v}
        for d in self.root.glob("buf-*"):
            if d.name not in buffers and \
                    int(d.name.split("-")[-1]) < state.batch - self.keep_versions:
                shutil.rmtree(d, ignore_errors=True)
