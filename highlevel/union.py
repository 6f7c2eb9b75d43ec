"""Union of links: OOP `Meld` (punctuation only, rows pass through) and IOP `Merge` (time order).

Both are frozen configurations that `build()` a small pure-Python state machine
(docs/semantics.md, "Combining links: Meld and Merge"). Meld keeps one number per input; Merge buffers the rows of whichever
input is ahead until every other input's rows or punctuation catch up, and reports how much it
holds (the Q8-2 experiment measures that memory).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from highlevel.errors import StageConfigError

log = logging.getLogger(__name__)


def _input_names(inputs: int | Sequence[str]) -> tuple[str, ...]:
    names = tuple(str(i) for i in range(inputs)) if isinstance(inputs, int) else tuple(inputs)
    if not names:
        raise StageConfigError("a union needs at least one input (got none)")
    if len(set(names)) != len(names):
        raise StageConfigError(f"union inputs must be distinct, got {list(names)}")
    return names


@dataclass(frozen=True)
class Meld:
    """OOP union: tuples pass at once; output punctuation = min of the inputs' last ones.

    `inputs` is a count or the input (link) names.
    """

    inputs: int | tuple[str, ...]

    def build(self, state: dict | None = None, silent=()) -> MeldLogic:
        return MeldLogic(_input_names(self.inputs), state, silent)


class MeldLogic:
    """State: last punctuation b_i of every input and o of the output (None: none yet).

    `silent`: inputs declared silent (a capture agent whose heartbeats stopped,
    docs/deployment.md): the output is the minimum over the others, so windows close
    without them; what they send later is late for every window closed meanwhile. The
    output never goes back when a silent input returns."""

    def __init__(self, names: tuple[str, ...], state: dict | None = None, silent=()):
        self.names = names
        self.bounds: dict[str, int | None] = {n: None for n in names}
        self.output: int | None = None
        self.silent = frozenset(silent) & set(names)
        if state:
            self.bounds.update({k: v for k, v in state["bounds"].items() if k in self.bounds})
            self.output = state["output"]

    def _name(self, i: int | str) -> str:
        name = self.names[i] if isinstance(i, int) else i
        if name not in self.bounds:
            raise StageConfigError(f"unknown union input {i!r}; inputs are {list(self.names)}")
        return name

    def on_rows(self, i: int | str, rows):
        """Rows pass through unchanged (Meld never buffers)."""
        self._name(i)
        return rows

    def on_punctuation(self, i: int | str, p: int) -> int | None:
        """Record punctuation `p` of input i; the new output punctuation, or None."""
        name = self._name(i)
        b = self.bounds[name]
        if b is None or p > b:
            self.bounds[name] = int(p)
        return self.advance()

    def advance(self) -> int | None:
        """The output punctuation if it rises now (an input's punctuation, or an input
        declared silent), else None."""
        waited = [n for n in self.bounds if n not in self.silent]
        bounds = [v for n in waited if (v := self.bounds[n]) is not None]
        if not bounds or len(bounds) < len(waited):
            return None
        low = min(bounds)
        if self.output is None or low > self.output:
            self.output = low
            return low
        return None

    def to_state(self) -> dict:
        return {"bounds": dict(self.bounds), "output": self.output}


@dataclass(frozen=True)
class Merge:
    """IOP order-preserving union on the column `time` of every input.

    `ordered_inputs`: each input delivers its rows in time order (true for IOP links), so an
    input's latest row time bounds its future rows just as punctuation does.
    """

    inputs: int | tuple[str, ...]
    time: str = "time"
    ordered_inputs: bool = True

    def build(self) -> MergeLogic:
        return MergeLogic(_input_names(self.inputs), self.time, self.ordered_inputs)


@dataclass
class _Input:
    punct: int | None = None
    latest: int | None = None            # largest row time seen (ordered inputs only)
    held: list = field(default_factory=list)   # pa.Table pieces not yet released

    def progress(self) -> int | None:
        values = [v for v in (self.punct, self.latest) if v is not None]
        return max(values) if values else None


class MergeLogic:
    """Buffers rows until every input has progressed past them, releases them in time order."""

    def __init__(self, names: tuple[str, ...], time: str, ordered_inputs: bool):
        self.names, self.time, self.ordered = names, time, ordered_inputs
        self.inputs = {n: _Input() for n in names}
        self.output_punct: int | None = None
        self.peak_rows = 0
        self.peak_bytes = 0
        self.released_rows = 0

    def _input(self, i: int | str) -> _Input:
        name = self.names[i] if isinstance(i, int) else i
        if name not in self.inputs:
            raise StageConfigError(f"unknown union input {i!r}; inputs are {list(self.names)}")
        return self.inputs[name]

    @property
    def buffered_rows(self) -> int:
        return sum(t.num_rows for s in self.inputs.values() for t in s.held)

    @property
    def buffered_bytes(self) -> int:
        return sum(t.nbytes for s in self.inputs.values() for t in s.held)

    def on_rows(self, i: int | str, rows: pa.Table | pa.RecordBatch) -> list[pa.Table]:
        """Buffer an input's rows; return whatever can now be released (time order)."""
        state = self._input(i)
        table = pa.table(rows) if isinstance(rows, pa.RecordBatch) else rows
        if table.num_rows:
            state.held.append(table)
            if self.ordered:
                latest = int(pc.max(table.column(self.time)).as_py())
                state.latest = latest if state.latest is None else max(state.latest, latest)
        return self._release()

    def on_punctuation(self, i: int | str, p: int) -> tuple[list[pa.Table], int | None]:
        """Record punctuation; released rows and the new output punctuation (or None)."""
        state = self._input(i)
        if state.punct is None or p > state.punct:
            state.punct = int(p)
        released = self._release()
        bound = self._bound()
        if bound is not None and (self.output_punct is None or bound > self.output_punct):
            self.output_punct = bound
            return released, bound
        return released, None

    def _bound(self) -> int | None:
        progress = [s.progress() for s in self.inputs.values()]
        if any(p is None for p in progress):
            return None
        return min(progress)  # type: ignore[type-var]

    def _release(self) -> list[pa.Table]:
        self.peak_rows = max(self.peak_rows, self.buffered_rows)
        self.peak_bytes = max(self.peak_bytes, self.buffered_bytes)
        bound = self._bound()
        if bound is None:
            return []
        out, order_keys = [], []
        for k, state in enumerate(self.inputs.values()):
            if not state.held:
                continue
            held = pa.concat_tables(state.held) if len(state.held) > 1 else state.held[0]
            times = held.column(self.time).to_numpy()
            # rows at the bound may go: later rows of any input have time >= bound
            ready = times <= bound
            if ready.any():
                out.append(held.filter(pa.array(ready)))
                order_keys.append(np.full(int(ready.sum()), k))
                rest = held.filter(pa.array(~ready))
                state.held = [rest] if rest.num_rows else []
            else:
                state.held = [held]
        if not out:
            return []
        merged = pa.concat_tables(out, promote_options="permissive")
        times = merged.column(self.time).to_numpy()
        # stable sort on time, ties in input order: one deterministic total order
        order = np.lexsort((np.concatenate(order_keys), times))
        merged = merged.take(pa.array(order))
        self.released_rows += merged.num_rows
        return [merged]
