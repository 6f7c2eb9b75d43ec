"""Work items: what an appliance (`oopscope serve --spool SHARED`) asks its capture agents to
run, as files in the shared directory.

A query submitted to the server whose FROM names a link an agent captures is published as
`SHARED/work/<name>.json`, whole or not at all (a temporary file renamed over it): its text,
parameters and DEFINE overrides, the queries it runs, every link it reads and which agent
captures which of them, the spool its partial rows go to (`SHARED/run/<name>/g<N>/spool`),
the start of its first window and its state. Agents in watch mode (`tools.cluster.watch`)
poll these files: they run the low level of a `running` item for their links, and end it
(end-of-input punctuation) when the item is `cancelled` or gone. The server's stages read
the spool, as they read a local query's.

A file system every host can read is the transport, as for the heartbeats: no network layer.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common.cachedir import write_private

log = logging.getLogger(__name__)

WORK = "work"
RUNS = "run"
RUNNING, CANCELLED = "running", "cancelled"


@dataclass
class WorkItem:
    name: str
    generation: int
    file: str                                    # the query file's name (for messages)
    text: str
    params: dict = field(default_factory=dict)
    sets: dict = field(default_factory=dict)
    queries: list = field(default_factory=list)  # the chosen queries (the streams')
    links: list = field(default_factory=list)    # every link the plan reads, in plan order
    agents: dict = field(default_factory=dict)   # link -> host id of the agent capturing it
    spool: str = ""                              # where the partial rows go
    start_ns: int = 0                            # the first window: packets before it wait
    #: layers of [path, text] schema files it is planned with (`Submission.schema_layers`)
    schemas: list = field(default_factory=list)
    state: str = RUNNING                         # running | cancelled
    updated_ns: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return self.name, self.generation

    def links_of(self, host: str) -> list[str]:
        """The links of this item the agent `host` captures."""
        return [link for link in self.links if self.agents.get(link) == host]


def work_path(shared: Path, name: str) -> Path:
    return Path(shared) / WORK / f"{name}.json"


def spool_of(shared: Path, name: str, generation: int) -> Path:
    """A served query's spool on the shared directory (its agents write their links' files
    there; the server's stages read it)."""
    return Path(shared) / RUNS / name / f"g{generation}" / "spool"


def publish(shared: Path, item: WorkItem) -> None:
    path = work_path(shared, item.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    item.updated_ns = time.time_ns()
    write_private(path, json.dumps(asdict(item), indent=1) + "\n")


def withdraw(shared: Path, name: str, generation: int) -> None:
    """Remove the item `name` if it is still of `generation` (a newer one stays)."""
    path = work_path(shared, name)
    item = read_item(path)
    if item is not None and item.generation == generation:
        path.unlink(missing_ok=True)


def read_item(path: Path) -> WorkItem | None:
    try:
        return WorkItem(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        log.warning("work item %s: unreadable (%s); skipped", path, exc)
        return None


def read_work(shared: Path) -> dict[str, WorkItem]:
    """Every published item, by query name."""
    d = Path(shared) / WORK
    if not d.is_dir():
        return {}
    out = {}
    for path in sorted(d.glob("*.json")):
        item = read_item(path)
        if item is not None:
            out[item.name] = item
    return out
