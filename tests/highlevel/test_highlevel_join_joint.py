"""OA-Join joint punctuation (docs/semantics.md, "Joins"; thesis 7.2): never violated by a later result, and
it closes a downstream aggregate's group (one window on each timestamp) no later, and in the
thesis' Q7-1 situation earlier, than individual punctuation.

Oracle: a nested-loop model of the join over every interleaving tried: a result (l, r) exists
for every pair inside the band and is produced when the later of its two rows arrives.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from highlevel.join import group_closed, individual_punctuation, joint_punctuation


def in_band(l: int, r: int, band: bool, rl: int, rr: int, w: int) -> bool:
    return (l - rr <= r < l + rl) if band else l // w == r // w


def simulate(events, band: bool, rl: int, rr: int, w: int):
    """Run the event list [(side, "t"|"p", value)]: results with their arrival step, and the
    (step, individual, joint) punctuation after each punctuation event."""
    rows = ([], [])
    bounds = [None, None]
    results, puncts = [], []
    for step, (side, kind, v) in enumerate(events):
        if kind == "t":
            rows[side].append(v)
            for o in rows[1 - side]:
                l, r = (v, o) if side == 0 else (o, v)
                if in_band(l, r, band, rl, rr, w):
                    results.append((step, l, r))
        else:
            bounds[side] = v
            b = [None if x is None else (x // w if not band else x) for x in bounds]
            ind = individual_punctuation(b[0], b[1], band, rl, rr)
            joint = joint_punctuation(b[0], b[1], band, rl, rr)
            puncts.append((step, ind, joint))
    return results, puncts


@st.composite
def streams(draw):
    """Two streams of timestamps in a random interleaving, each with grammatical punctuation
    (a punctuation p on a side comes only after every row of that side below p)."""
    events = []
    for side in (0, 1):
        ts = draw(st.lists(st.integers(0, 40), min_size=1, max_size=14))
        # disorder within the side, punctuation at random cut points: p = min of the rest
        order = draw(st.permutations(ts))
        seq = []
        for k, t in enumerate(order):
            seq.append((side, "t", t))
            if draw(st.booleans()):
                rest = order[k + 1:]
                seq.append((side, "p", min(rest) if rest else 100))
        seq.append((side, "p", 100))            # end of input
        events.append(seq)
    merged, a, b = [], 0, 0
    picks = draw(st.lists(st.booleans(), min_size=len(events[0]) + len(events[1]),
                          max_size=len(events[0]) + len(events[1])))
    for take_left in picks:
        if (take_left and a < len(events[0])) or b >= len(events[1]):
            merged.append(events[0][a])
            a += 1
        else:
            merged.append(events[1][b])
            b += 1
    # monotone punctuation per side (a smaller value carries no information: drop it)
    out, last = [], [None, None]
    for side, kind, v in merged:
        if kind == "p":
            if last[side] is not None and v <= last[side]:
                continue
            last[side] = v
        out.append((side, kind, v))
    return out


@settings(max_examples=60, deadline=None)
@given(events=streams(), band=st.booleans(), rl=st.integers(1, 6), rr=st.integers(1, 6),
       w=st.sampled_from([2, 5]))
def test_joint_punctuation_is_never_violated_and_closes_no_later(events, band, rl, rr, w):
    results, puncts = simulate(events, band, rl, rr, w)
    val = (lambda x: x) if band else (lambda x: x // w)
    for step, ind, joint in puncts:
        later = [(val(l), val(r)) for s, l, r in results if s > step]
        if ind is not None:
            assert all(l >= ind[0] and r >= ind[1] for l, r in later)
        if joint is not None:
            assert all(not (l < joint[0] and r < joint[1]) for l, r in later)
    # a downstream count per (window of l, window of r): closes when complete, and with
    # joint punctuation never later than with individual punctuation only
    groups = {(val(l) // 1, val(r) // 1) for _, l, r in results}
    for gl, gr in groups:
        last_result = max(s for s, l, r in results if (val(l), val(r)) == (gl, gr))
        close_ind = close_joint = None
        joints = []
        for step, ind, joint in puncts:
            if joint is not None:
                joints.append(joint)
            if close_ind is None and group_closed(gl + 1, gr + 1, ind):
                close_ind = step
            if close_joint is None and group_closed(gl + 1, gr + 1, ind, joints):
                close_joint = step
        assert close_joint is not None and close_joint > last_result
        assert close_ind is None or close_joint <= close_ind


def test_q7_1_joint_punctuation_closes_earlier():
    """The thesis' Q7-1 shape (symmetric band of 2): the group (l = 0, r = 1) closes at the
    joint punctuation (2, 2) (every result with l < 2 and r < 2 is out), one punctuation
    before individual punctuation covers r < 2 (it needs b_L - 2 >= 2)."""
    rl = rr = 2
    events = [(0, "t", 0), (1, "t", 1), (0, "p", 2), (1, "p", 1), (1, "p", 2), (0, "p", 4),
              (1, "p", 4)]
    results, puncts = simulate(events, True, rl, rr, 1)
    assert [(l, r) for _, l, r in results] == [(0, 1)]
    closes = {}
    joints = []
    for step, ind, joint in puncts:
        if joint is not None:
            joints.append(joint)
        closes.setdefault("joint", step) if group_closed(1, 2, ind, joints) else None
        closes.setdefault("individual", step) if group_closed(1, 2, ind) else None
    assert joints[:2] == [(2, 1), (2, 2)]
    assert closes["joint"] == 4 < closes["individual"] == 5
