"""Resuming `oopscope run` over a kept spool and checkpoint after a crash (`kill -9`).

A run given both `--spool DIR` and `--checkpoint DIR` is resumable: it writes a manifest,
`run.json`, into both (the query file's text, its parameters and overrides, the links with
their capture files' sizes and modification times, the outputs and their formats), writes
each link's spool so that a file holds only rows of panes its own punctuation closes
(`tools.pipeline.feeds.OperatorFeed`), and logs after each output batch its id and the output's
size (`CHECKPOINT/outputs/<query>.json`, `tools.results.appended.QueryOutput`).

The same command over the same non-empty directories then resumes
(docs/semantics.md "Restart and exactly-once"):

- per (query, link), P = the last punctuation in the spool; every pane ending by P is
  complete there and no pane after it has a row. The link's capture file is read again but
  only packets at or after the start of the pane holding P reach that query's operator;
  the spool's sequence numbers continue;
- the Spark stages continue from their checkpoint (a batch not committed is replayed with
  the same files);
- each output is cut back to its last logged batch and appended to; a batch it holds
  already (the checkpoint's replay) is not written again. A Parquet output, or one written
  whole at the end (a table at full speed), keeps its batches as part files under the
  checkpoint and is written from them when the run ends (`tools.results.parts`).

Flow records resume like panes: a flow ends by its bucket's end, so its record waits in
the spool for the punctuation that closes its bucket.

A live link (`--interface`) resumes with a gap: the windows overlapping [P, the first
window start after the restart) are not written, and the gap is reported.

A manifest that differs (another query, other inputs or outputs) refuses the run and says
what differs; a directory with no manifest is an earlier run's that cannot resume.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import os_error_text
from common.units import NS_PER_S as NS
from tools.errors import RunConfigError
from tools.pipeline.windows import when

log = logging.getLogger(__name__)

MANIFEST = "run.json"
_INT64_MIN = -(1 << 63)
VERSION = 1


def _empty(d: Path) -> bool:
    return not d.is_dir() or not any(d.iterdir())


def manifest(config, chosen, formats: dict[str, str]) -> dict:
    """What the state of a resumable run depends on (JSON-able)."""
    from queries.explain import find_query_file

    digest = hashlib.sha256()
    for name in config.query_files:
        try:        # a shipped query's name too (the run planned it already)
            digest.update(find_query_file(name).read_bytes())
        except OSError:
            digest.update(str(name).encode())
    # record protocols and user functions change what the state means
    for name in (*config.schema_files, *config.function_files,
                 *([config.udf_module] if config.udf_module else [])):
        try:
            digest.update(Path(name).read_bytes())
        except OSError:
            digest.update(str(name).encode())
    links = []
    for name, path in config.links:
        try:
            st = os.stat(path)
            links.append({"name": name, "path": str(Path(path).resolve()),
                          "size": st.st_size, "mtime_ns": st.st_mtime_ns})
        except OSError:
            links.append({"name": name, "path": str(path)})
    return {
        "version": VERSION,
        "query_file": " + ".join(str(n) for n in config.query_files),
        "query_sha256": digest.hexdigest(),
        "params": sorted([list(p) for p in config.params]),
        "overrides": sorted([list(p) for p in config.overrides]),
        "links": links,
        "interfaces": [{"name": n, "interface": i} for n, i in config.interfaces],
        "outputs": sorted([{"query": qp.name, "path": out if out == "-" else
                            str(Path(out).resolve()), "format": formats[qp.name]}
                           for qp, out in chosen], key=lambda o: o["query"]),
    }


def differences(old: dict, new: dict) -> list[str]:
    """What differs between an earlier run's manifest and this one's, in words."""
    why = []
    if old.get("version") != new["version"]:
        return [f"it was written by another version of oopscope (manifest version "
                f"{old.get('version')})"]
    if old.get("query_sha256") != new["query_sha256"]:
        why.append(f"the query differs (the state is of {old.get('query_file')}, as it was "
                   f"then)")
    for key, what in (("params", "the parameters (--param)"),
                      ("overrides", "the DEFINE overrides (--set)")):
        if old.get(key) != new[key]:
            why.append(f"{what} differ")
    old_links = {lk["name"]: lk for lk in old.get("links", [])}
    new_links = {lk["name"]: lk for lk in new["links"]}
    for name in sorted(old_links.keys() | new_links.keys()):
        a, b = old_links.get(name), new_links.get(name)
        if a is None or b is None:
            why.append(f"link {name}: {'not in' if b is None else 'new since'} the run before")
        elif a.get("path") != b.get("path"):
            why.append(f"link {name}: a different capture file ({b.get('path')}, was "
                       f"{a.get('path')})")
        elif (a.get("size"), a.get("mtime_ns")) != (b.get("size"), b.get("mtime_ns")):
            why.append(f"link {name}: the capture file {b.get('path')} changed since the run "
                       f"before (size or modification time)")
    if old.get("interfaces") != new["interfaces"]:
        why.append("the interfaces (--interface) differ")
    if old.get("outputs") != new["outputs"]:
        why.append("the outputs (--output, --format) differ")
    return why


@dataclass
class Resume:
    """What a resumable run continues from (empty when it starts afresh)."""

    resumed: bool = False
    #: (query, link) -> the last punctuation of that link in the query's spool (None: none)
    punctuation: dict[tuple[str, str], int | None] = field(default_factory=dict)
    #: live links: (from, to) ns, the windows overlapping it are not written
    gap: tuple[int, int] | None = None

    def start_of(self, plan) -> int | None:
        """The first packet time (ns) a low-level operator of a resumed run takes: the
        start of the pane that holds P (a pane ending after P has no row in the spool)."""
        if not self.resumed:
            return None
        p = self.punctuation.get((plan.query, plan.link))
        if p is None:
            return None
        w = plan.window
        if w is None or not w.pane_ns:      # a selection: its rows are packets
            return p
        return ((p + w.offset_ns) // w.pane_ns) * w.pane_ns - w.offset_ns

    def starts(self, low_plans) -> dict[tuple[str, str], int | None]:
        """Per (query, link) of `low_plans`, the first packet time its operator takes."""
        return {(lp.query, lp.link): self.start_of(lp) for lp in low_plans}

    @classmethod
    def of_spool(cls, spool: Path, low_plans) -> Resume:
        """What a process that writes `low_plans` into a spool it wrote before continues
        from (an agent started again): resumed when a link of it is in the spool."""
        from common.spool import last_punctuations

        resume = cls(resumed=False)
        seen: dict[str, dict] = {}
        for lp in low_plans:
            if lp.query not in seen:
                seen[lp.query] = last_punctuations(spool, lp.query)
            if lp.link in seen[lp.query]:
                resume.resumed = True
            resume.punctuation[(lp.query, lp.link)] = \
                seen[lp.query].get(lp.link, (None, None))[1]
        return resume

    def live_gap(self, chosen) -> None:
        """A resumed live run: the windows from the last punctuation in the spool to the
        first window start after now are incomplete (the packets in between were never
        captured) and are not written; the operators take packets from that start on."""
        known = [p for p in self.punctuation.values() if p is not None]
        gap_from = min(known) if len(known) == len(self.punctuation) and known else _INT64_MIN
        after = time.time_ns() + NS // 5
        starts = [((after + w.offset_ns) // w.slide_ns + 1) * w.slide_ns - w.offset_ns
                  for qp, _ in chosen if (w := qp.high.window) is not None and w.slide_ns]
        start = max(starts) if starts else after + 1
        self.gap = (gap_from, start)
        self.punctuation = {k: start for k in self.punctuation}
        log.warning("resumed: the windows from %s to %s are a gap (the run was down) and are "
                    "not written", "the start" if gap_from == _INT64_MIN else when(gap_from),
                    when(start))

    def suppress_gap(self, graph) -> None:
        """The stages of `graph` leave out the windows of the gap (none without one)."""
        if self.gap is None:
            return
        gap = (int(self.gap[0]), int(self.gap[1]))
        for _, stage in graph.stages:
            stage.suppress = (gap,)


def output_log(checkpoint: Path, query: str) -> Path:
    """Where a resumable run logs an output's last whole batch (CSV, JSON lines, a paced
    table: `tools.results.appended.QueryOutput`)."""
    from urllib.parse import quote

    return checkpoint / "outputs" / f"{quote(query, safe='')}.json"


def output_parts(checkpoint: Path, query: str) -> Path:
    """Where a resumable run keeps the batches of a Parquet output, or of one written whole
    at the end (`tools.results.parts`)."""
    from urllib.parse import quote

    return checkpoint / "outputs" / f"{quote(query, safe='')}.parts"


def prepare(config, chosen, formats: dict[str, str], spool: Path,
            checkpoint: Path) -> Resume:
    """Check the kept spool and checkpoint of a resumable run: empty (write the manifest,
    start afresh) or an earlier run's of the same query and inputs (resume); else refuse,
    saying why."""
    new = manifest(config, chosen, formats)
    if _empty(spool) and _empty(checkpoint):
        for d in (spool, checkpoint):
            _mkdir(d, "--spool" if d is spool else "--checkpoint")
        (checkpoint / "outputs").mkdir(exist_ok=True)
        for d in (spool, checkpoint):
            _write_manifest(d, new)
        return Resume()
    for d, option in ((spool, "--spool"), (checkpoint, "--checkpoint")):
        path = d / MANIFEST
        try:
            old = json.loads(path.read_text())
        except FileNotFoundError:
            if _empty(d):
                continue            # killed before this one was written: nothing to keep
            raise RunConfigError(f"{option} {d}: not empty and not a resumable run's (no "
                                 f"{MANIFEST}: a run with both --spool and --checkpoint "
                                 f"writes one); give an empty or new directory") from None
        except (OSError, ValueError) as exc:
            raise RunConfigError(f"{option} {d}: cannot read {path}: {exc}") from None
        why = differences(old, new)
        if why:
            raise RunConfigError(f"{option} {d} holds the state of another run and cannot "
                                 f"resume it: {'; '.join(why)}; give an empty or new "
                                 f"directory")
    for d in (spool, checkpoint):
        _write_manifest(d, new)
    (checkpoint / "outputs").mkdir(exist_ok=True)
    return Resume(resumed=True)


def find_punctuation(resume: Resume, spool: Path, low_plans) -> None:
    """Each (query, link)'s last punctuation in the spool."""
    from common.spool import last_punctuations

    seen: dict[str, dict] = {}
    for lp in low_plans:
        if lp.query not in seen:
            seen[lp.query] = last_punctuations(spool, lp.query)
        _, p = seen[lp.query].get(lp.link, (None, None))
        resume.punctuation[(lp.query, lp.link)] = p


def _mkdir(d: Path, option: str) -> None:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunConfigError(f"{option} {d}: cannot create it: {os_error_text(exc)}") \
            from None


def _write_manifest(d: Path, data: dict) -> None:
    tmp = d / f".{MANIFEST}.tmp"
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, d / MANIFEST)
    except OSError as exc:
        raise RunConfigError(f"cannot write {d / MANIFEST}: {os_error_text(exc)}") from None
