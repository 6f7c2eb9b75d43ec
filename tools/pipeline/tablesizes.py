"""Remembered table sizes: a query that runs again starts its adaptive tables at the size
they had.

An adaptive table (`lowlevel.sizing`) starts from its declared count (DEFINE
expected_groups, else the default) and grows at most 4x per window: a query meeting 260K
groups per window from a start of 65,536 slots evicts for its first windows. A query that
ran before knows better, so the last size of each of its tables is kept with its state, per
(query, link):

- a resumable run (`tools.pipeline.resume`): `CHECKPOINT/tables.json`, rewritten (atomically)
  whenever one of its tables is re-sized;
- the appliance: the submission's record (`tools.serve.submission.Record.tables`), saved with
  its counters at the end of each batch;
- an agent (`tools.cluster.agent`, and the watching agent of `tools.cluster.watch`, per work
  item's query): `SPOOL/agents/HOST.tables` beside its heartbeat (`agent_tables`), a fanout
  member in its own (its host id is HOST.K), read whenever it starts.

The first size is then, in order: DEFINE aggregate_slots (a fixed table, never re-sized),
the remembered size, expected_groups, the default; capped by max_aggregate_slots and the
server's memory budget (`lowlevel.sizing.first_slots`). A size only sets where the table
starts: results do not depend on it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

TABLES = "tables.json"
#: the largest size the planner accepts (DEFINE aggregate_slots)
MAX_SLOTS = 1 << 30


def sound(value) -> bool:
    """Whether a JSON value is {query: {link: slots}}, slots a positive int up to 2^30."""
    return isinstance(value, dict) and all(
        isinstance(q, str) and isinstance(links, dict) and all(
            isinstance(link, str) and isinstance(n, int) and not isinstance(n, bool)
            and 1 <= n <= MAX_SLOTS for link, n in links.items())
        for q, links in value.items())


def sizes_of(feeds) -> dict[str, dict[str, int]]:
    """{query: {link: slots}} of the adaptive tables of `feeds` (`OperatorFeed`s)."""
    out: dict[str, dict[str, int]] = {}
    for f in feeds:
        slots = f.op.adaptive_slots
        if slots is not None:
            out.setdefault(f.op.plan.query, {})[f.op.plan.link] = int(slots)
    return out


def agent_tables(spool, host: str) -> Path:
    """Where the agent `host` of the shared spool `spool` keeps its tables' sizes."""
    from tools.pipeline.heartbeat import heartbeat_path

    return heartbeat_path(Path(spool), host).with_suffix(".tables")


def table_report(feeds) -> dict[str, dict[str, dict[str, int]]]:
    """{query: {link: {"slots": n, "resizes": r}}} of the hash tables of `feeds`
    (`OperatorFeed`s) now: what an agent's heartbeat says of them, so that `collect` can
    show the tables of the queries it melds. Read from another thread than the feeds':
    two ints each, a beat late at worst."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for f in feeds:
        engine = f.op.engine
        if engine is not None:
            out.setdefault(f.op.plan.query, {})[f.op.plan.link] = {
                "slots": int(engine.slots), "resizes": int(getattr(engine, "resizes", 0))}
    return out


class TableLog:
    """The remembered sizes of a resumable run, in `path` (its checkpoint's `tables.json`):
    `slots(query, link)` what the run before had, `note(...)` a table's size now."""

    def __init__(self, path: Path, resumed: bool):
        self.path = path
        self.sizes: dict[str, dict[str, int]] = self._load() if resumed else {}
        self._lock = threading.Lock()

    def _load(self) -> dict[str, dict[str, int]]:
        try:
            value = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("%s: cannot read the remembered table sizes (%s); the tables start "
                        "at their declared sizes", self.path, exc)
            return {}
        if not sound(value):
            log.warning("%s: not a record of table sizes ({query: {link: slots}}); the "
                        "tables start at their declared sizes", self.path)
            return {}
        return value

    def slots(self, query: str, link: str) -> int | None:
        return self.sizes.get(query, {}).get(link)

    def note(self, query: str, link: str, slots: int) -> None:
        """Table (query, link) has `slots` now: written when that is news."""
        with self._lock:
            if self.slots(query, link) == slots:
                return
            self.sizes.setdefault(query, {})[link] = int(slots)
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(self.sizes, indent=1) + "\n")
                os.replace(tmp, self.path)
            except OSError as exc:
                # only a resumed run's first windows are slower without it
                log.warning("cannot write %s: %s", self.path, exc)
