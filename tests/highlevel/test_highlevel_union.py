"""Meld and Merge (docs/semantics.md, "Combining links: Meld and Merge") as pure state machines, no Spark."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from highlevel.errors import StageConfigError
from highlevel.union import Meld, Merge


def test_meld_example_of_the_semantics():
    meld = Meld(("l0", "l1")).build()
    assert meld.on_punctuation("l0", 20) is None      # the second input has not punctuated
    assert meld.on_punctuation("l1", 19) == 19        # b = (20, 19)
    emitted = [meld.on_punctuation("l1", p) for p in (20, 21, 22)]
    assert emitted == [20, None, None]                # exactly one punctuation, 20
    assert meld.output == 20


def test_meld_silent_input_holds_everything_back_until_it_punctuates():
    meld = Meld(3).build()
    out = [meld.on_punctuation(0, p) for p in range(10, 100, 10)]
    out += [meld.on_punctuation(1, p) for p in range(5, 95, 10)]
    assert out == [None] * len(out)
    assert meld.on_punctuation(2, 60) == 60           # the timer punctuation of the silent link
    assert meld.on_punctuation(2, 1000) == 85         # now bounded by input 1


def test_meld_closes_without_an_input_declared_silent_and_never_goes_back():
    """A capture agent whose heartbeats stopped: the output is the minimum over the others;
    the input's later punctuation is recorded, and the output does not go back when it
    rejoins."""
    meld = Meld(("a", "b")).build()
    assert meld.on_punctuation("a", 50) is None           # b has not punctuated
    meld = Meld(("a", "b")).build(meld.to_state(), silent={"b"})
    assert meld.advance() == 50                           # closes without b
    assert meld.on_punctuation("a", 70) == 70
    assert meld.on_punctuation("b", 20) is None           # late: below the output
    meld = Meld(("a", "b")).build(meld.to_state())        # b is back
    assert meld.on_punctuation("a", 90) is None           # bounded by b again (20) ...
    assert meld.output == 70                              # ... and the output stays
    assert meld.on_punctuation("b", 80) == 80
    assert Meld(("a",)).build(silent={"a"}).advance() is None   # nothing to close on


def test_meld_rows_pass_through_and_state_round_trips():
    meld = Meld(("a", "b")).build()
    rows = pa.table({"time": [3, 1, 2]})
    assert meld.on_rows("a", rows) is rows
    meld.on_punctuation("a", 5)
    again = Meld(("a", "b")).build(meld.to_state())
    assert again.on_punctuation("b", 7) == 5
    with pytest.raises(StageConfigError, match="unknown union input"):
        again.on_punctuation("c", 1)
    with pytest.raises(StageConfigError, match="distinct"):
        Meld(("a", "a")).build()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50)), max_size=40))
def test_meld_output_is_min_of_inputs_strictly_increasing(events):
    meld = Meld(3).build()
    bounds = [None, None, None]
    emitted = []
    for i, p in events:
        bounds[i] = p if bounds[i] is None else max(bounds[i], p)
        out = meld.on_punctuation(i, p)
        if out is not None:
            emitted.append(out)
            assert out == min(bounds)
        if None in bounds:
            assert out is None
    assert emitted == sorted(set(emitted))            # never a duplicate, never backwards
    if None not in bounds:
        assert meld.output == min(bounds)


def _rows(times, link):
    return pa.table({"time": pa.array(times, pa.int64()),
                     "link": pa.array([link] * len(times))})


def test_merge_releases_in_time_order_and_buffers_the_input_ahead():
    merge = Merge(("a", "b")).build()
    assert merge.on_rows("a", _rows([1, 2, 5, 8], "a")) == []
    assert merge.buffered_rows == 4                   # b has said nothing yet
    out = merge.on_rows("b", _rows([3, 4], "b"))     # b progressed to 4
    assert pa.concat_tables(out).column("time").to_pylist() == [1, 2, 3, 4]
    assert merge.buffered_rows == 2 and merge.buffered_bytes > 0
    released, punct = merge.on_punctuation("b", 9)
    assert pa.concat_tables(released).column("time").to_pylist() == [5, 8]
    assert punct == 8 and merge.buffered_rows == 0
    assert merge.peak_rows == 6 and merge.released_rows == 6   # all six held at once


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(1, 4)), min_size=1, max_size=30),
       st.integers(0, 2**31))
def test_merge_output_is_sorted_and_complete(steps, seed):
    rng = np.random.default_rng(seed)
    merge = Merge(2).build()
    clock = [0, 0]
    fed, out = [], []
    for link, n in steps:
        times = np.sort(clock[link] + rng.integers(0, 10, n))
        clock[link] = int(times[-1])
        fed += times.tolist()
        out += [t for tb in merge.on_rows(link, _rows(times, str(link)))
                for t in tb.column("time").to_pylist()]
        # memory held = rows not yet released
        assert merge.buffered_rows == len(fed) - len(out)
    for link in (0, 1):
        released, _ = merge.on_punctuation(link, 10**9)
        out += [t for tb in released for t in tb.column("time").to_pylist()]
    assert out == sorted(fed)
    assert merge.buffered_rows == 0
