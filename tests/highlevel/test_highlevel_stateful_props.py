"""The runtime's stateful sampling functions (`highlevel.stateful`) equal an independent oracle.

Oracle: `tests.oracles.stateful`, a plain-Python port of GS-lite's smart_sampling_state C code,
written without reading the runtime. Hypothesis drives both through the same call sequences,
shaped like the sampling operator's: clean_init, then per-tuple sampling calls, cleaning
triggers and passes, window ends (final_init + final cleaning) and carry-over into a fresh
state (dirty_init). After every step the results and every state field must be equal
(floats exactly, or both NaN). A few deterministic tests pin the oracle itself to values
worked out by hand from the C code.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.oracles.stateful import DOUBLE_FIELDS, FIELDS, FUNCTIONS, SmartSamplingState

U32 = 1 << 32
FLOAT_FUNCTIONS = {"ssthreshold", "gamma"}


def same(a: float, b: float) -> bool:
    a, b = float(a), float(b)
    return a == b or (math.isnan(a) and math.isnan(b))


# ---- random call sequences -------------------------------------------------------------------

cds = st.integers(0, 200)
lengths = st.integers(0, 3000)
sample_sizes = st.integers(1, 3) | st.integers(1, 50)     # small ones trigger cleaning often
glens = st.integers(0, 10**6)
delays = st.integers(0, 20)
flags = st.integers(0, 1)
# the supergroup's max$(time) moves forward by a tick, mostly 0 or 1 (same or next slot)
ticks = st.sampled_from([0, 0, 0, 1, 1, 2, 7])
# a group's max(time) is a little behind the clock, or anywhere at all
lags = st.integers(0, 25) | st.integers(0, U32 - 1)
clock_starts = st.sampled_from([0, 1, 1000, 2**31 - 4, U32 - 6]) | st.integers(0, U32 - 1)


def once(name: str, *params):
    """A step calling `name` once: (name, cd, [arguments])."""
    return st.tuples(st.just(name), cds, st.tuples(st.tuples(*params)))


def cleaning_pass(name: str, *params):
    """A cleaning pass: `name` over 1-8 groups in turn, with the same cd (as the operator does)."""
    return st.tuples(st.just(name), cds, st.lists(st.tuples(*params), min_size=1, max_size=8))


flow_group = (flags, delays, lags, glens)
steps = st.one_of(
    once("ssample", lengths, sample_sizes),
    once("flow_ssample", sample_sizes),
    once("ssdo_clean"),
    once("flow_ssdo_clean", ticks),
    cleaning_pass("ssclean_with", glens),
    cleaning_pass("ssfinal_clean", glens),
    cleaning_pass("flow_ssclean_with", *flow_group),
    cleaning_pass("flow_ssfinal_clean", *flow_group),
    once("nssample", lengths, st.integers(1, 5000)),
    st.sampled_from(["ssthreshold", "count_distinct", "packet_count", "gamma", "do_clean_count",
                     "delay", "newly_closed"]).flatmap(once),
    once("final_init"),
    once("dirty_init"),
)
# the flow query in the operator's order, so that counting slots and their trigger come up often:
# per tuple flow_ssample (WHERE), flow_ssdo_clean (CLEANING_WHEN), a flow_ssclean_with pass
# (CLEANING_BY); per window end final_init, a flow_ssfinal_clean pass (HAVING), dirty_init
small_sizes = st.integers(1, 3)
groups = st.lists(st.tuples(*flow_group), max_size=6)
flow_tuple = st.tuples(cds, small_sizes, ticks, groups).map(lambda x: [
    ("flow_ssample", x[0], [(x[1],)]), ("flow_ssdo_clean", x[0], [(x[2],)]),
    ("flow_ssclean_with", x[0], x[3])])
flow_window_end = st.tuples(cds, groups, cds).map(lambda x: [
    ("final_init", x[0], [()]), ("flow_ssfinal_clean", x[0], x[1]), ("dirty_init", x[2], [()])])
flow_rounds = st.lists(flow_tuple | flow_tuple | flow_tuple | flow_window_end, max_size=30)
# the operator samples (and so sets s_size) before anything else; without it z soon goes to inf
openings = st.lists(once("ssample", lengths, sample_sizes) | once("flow_ssample", sample_sizes),
                    max_size=1)


def runtime():
    from highlevel import stateful as S

    return S


def field_index(S, field: str) -> int:
    return getattr(S, field.upper())


def assert_same_state(S, oracle: SmartSamplingState, s: np.ndarray, where: str) -> None:
    want = oracle.fields()
    diffs = {f: (want[f], float(s[field_index(S, f)])) for f in FIELDS
             if not same(want[f], s[field_index(S, f)])}
    assert not diffs, f"{where}: fields differ (oracle, runtime): {diffs}"


def test_runtime_declares_the_oracles_functions():
    S = runtime()
    assert S.WORDS >= len(FIELDS)
    indexes = [field_index(S, f) for f in FIELDS]
    assert len(set(indexes)) == len(FIELDS) and all(0 <= i < S.WORDS for i in indexes)
    for name, nargs in FUNCTIONS.items():
        assert name in S.FUNCTIONS, name
        _, got_nargs, kind = S.FUNCTIONS[name]
        assert (got_nargs, kind) == (nargs, "float" if name in FLOAT_FUNCTIONS else "int"), name


@settings(max_examples=300, deadline=None)
@given(start=clock_starts, opening=openings, rest=st.lists(steps, max_size=80))
def test_runtime_equals_oracle_on_random_call_sequences(start, opening, rest):
    run_both(start, opening + rest)


@settings(max_examples=200, deadline=None)
@given(start=clock_starts, first=flow_tuple, rounds=flow_rounds)
def test_runtime_equals_oracle_on_flow_sampling_sequences(start, first, rounds):
    run_both(start, first + [step for steps_ in rounds for step in steps_])


def run_both(start: int, program: list) -> None:
    """clean_init, then every call of `program` on both; compare results and states after each."""
    S = runtime()
    oracle = SmartSamplingState()
    oracle.clean_init()
    s = np.zeros(S.WORDS, np.float64)
    S.clean_init(s)
    assert_same_state(S, oracle, s, "clean_init")
    clock = start
    for i, (name, cd, calls) in enumerate(program):
        if name == "final_init":
            oracle.final_init(cd)
            S.final_init(s, cd)
            assert_same_state(S, oracle, s, f"step {i}: final_init(cd={cd})")
            continue
        if name == "dirty_init":
            carried = SmartSamplingState()
            carried.dirty_init(oracle, cd)
            fresh = np.zeros(S.WORDS, np.float64)
            S.dirty_init(fresh, s, cd)
            oracle, s = carried, fresh
            assert_same_state(S, oracle, s, f"step {i}: dirty_init(cd={cd})")
            continue
        for params in calls:
            if name == "flow_ssdo_clean":
                clock = (clock + params[0]) % U32
                args = (clock,)
            elif name in ("flow_ssclean_with", "flow_ssfinal_clean"):
                cc, delay, lag, glen = params
                args = (cc, delay, (clock - lag) % U32, glen)
            else:
                args = params
            where = f"step {i}: {name}(cd={cd}, {', '.join(map(str, args))}) [time={oracle.time}]"
            want = oracle.call(name, cd, args)
            got = S.call(S.FUNCTIONS[name][0], s, cd, np.array(args, np.float64))
            assert same(want, got), f"{where}: returned {got}, oracle {want}"
            assert_same_state(S, oracle, s, where)


# ---- the oracle alone, against values worked out by hand from the C code --------------------

def fresh(**fields) -> SmartSamplingState:
    state = SmartSamplingState()
    state.clean_init()
    for name, value in fields.items():
        setattr(state, name, value)
    return state


def test_clean_init_values():
    f = fresh().fields()
    assert (f["z"], f["gamma"], f["do_sooth"]) == (200.0, 2.0, True)
    assert all(v == 0 for k, v in f.items() if k not in ("z", "gamma", "do_sooth"))
    assert all(isinstance(f[k], float) for k in DOUBLE_FIELDS)


@pytest.mark.parametrize("old_z, cd, s_size, want", [
    (200.0, 30, 10, 20.0),      # cd >= s_size: the smoothing still gives z/10
    (200.0, 3, 10, 20.0),       # cd < s_size: the same
    (15.0, 3, 10, 1.5),
    (5.0, 3, 10, 1.0),          # 0.5 is floored at 1
    (10.0, 3, 10, 1.0),         # exactly 1.0 -> 1
])
def test_dirty_init_is_a_tenth_of_the_old_threshold_floored_at_one(old_z, cd, s_size, want):
    old = fresh(z=old_z, s_size=s_size, do_clean=1, count_notsampled_new=4, z_prev=7.0,
                bcount=3, count=5.0, packet_count_=9, time=12)
    new = SmartSamplingState()
    new.dirty_init(old, cd)
    f = new.fields()
    assert f["z"] == want
    assert (f["gamma"], f["do_clean"], f["s_size"], f["count_notsampled_new"]) == (2.0, 1, s_size, 4)
    assert (f["z_prev"], f["bcount"], f["count"], f["packet_count"], f["time"]) == (0.0, 0, 0.0, 0, 0)
    assert f["do_sooth"] is True


def test_dirty_init_without_smoothing_uses_the_sample_ratio():
    new = SmartSamplingState()
    new.dirty_init(fresh(z=200.0, s_size=10, do_sooth=False), 30)
    assert new.z == 600.0
    new.dirty_init(fresh(z=200.0, s_size=10, do_sooth=False), 3)
    assert new.z == 100.0


def test_ssample_running_sum_and_big_packets():
    s = fresh(do_clean=1, gcount=50.0)
    assert s.ssample(0, 150, 10) == 0
    assert (s.count, s.s_size, s.do_clean, s.gcount) == (150.0, 10, 0, 0.0)
    assert s.ssample(0, 60, 10) == 1          # 210 >= 200: sampled, 10 carried
    assert s.count == 10.0
    assert s.ssample(0, 190, 10) == 1          # exactly 200 counts (>=)
    assert s.count == 0.0
    assert s.ssample(0, 201, 10) == 1          # bigger than z: always sampled
    assert (s.bcount, s.count, s.packet_count(0)) == (1, 0.0, 4)


def test_ssdo_clean_doubles_z_when_cd_exceeds_twice_the_sample_size():
    s = fresh(s_size=10)
    assert s.ssdo_clean(20) == 0 and s.z == 200.0          # 20 > 2*10 is false
    s.count, s.gcount, s.bcount = 3.0, 4.0, 5
    assert s.ssdo_clean(21) == 1
    assert (s.z, s.z_prev, s.do_clean, s.count, s.gcount, s.bcount) == (400.0, 200.0, 1, 0.0, 0.0, 0)
    assert s.do_clean_count(0) == 1
    assert s.ssdo_clean(0) == 1                              # still set until ssample clears it


def test_clean_with_counts_an_old_group_at_least_z_prev():
    s = fresh(z=400.0, z_prev=200.0)
    assert s.ssclean_with(0, 10) == 0 and s.gcount == 200.0     # 10 counts as 200
    assert s.ssclean_with(0, 250) == 1 and s.gcount == 50.0     # 450 >= 400
    assert s.ssclean_with(0, 401) == 1 and s.bcount == 1


def test_final_init_and_final_clean():
    s = fresh(s_size=10, count_notsampled_new=5)
    s.final_init(35)                            # (35 - 5) / 10 = 3
    assert (s.z, s.z_prev, s.final_z, s.count_notsampled_new, s.do_clean_count_) == (600.0, 200.0, 1, 0, 1)
    s.final_init(1)                             # once per window
    assert s.z == 600.0
    assert s.ssfinal_clean(10, 0) == 1          # cd <= s_size: keep, nothing counted
    assert (s.fcount, s.do_clean) == (0.0, 1)
    assert s.ssfinal_clean(11, 100) == 0 and s.fcount == 200.0   # 100 < z_prev counts as 200
    t = fresh(s_size=10)
    t.final_init(3)
    assert t.z == 100.0


def test_division_by_a_zero_sample_size_follows_ieee():
    s = fresh()
    s.final_init(5)
    assert s.z == math.inf
    s = fresh()
    s.final_init(0)                             # 0/0: NaN, and NaN <= 0 is false
    assert math.isnan(s.z) and math.isnan(s.ssthreshold(0))
    s = fresh(count_closed_flows=3, time=7)
    assert s.flow_ssdo_clean(0, 7) == 1 and s.z == math.inf


def test_flow_ssdo_clean_slots_and_trigger():
    s = fresh(s_size=2)
    assert s.flow_ssdo_clean(0, 100) == 0 and s.time == 100      # first time seen
    assert s.flow_ssdo_clean(0, 101) == 1 and s.count_closed == 1
    s.count_closed_flows = 5                                     # 5 > 2*2
    assert s.flow_ssdo_clean(0, 101) == 1
    assert (s.z, s.z_prev, s.count_closed, s.count_closed_flows) == (500.0, 200.0, 0, 0)
    assert s.flow_ssample(0, 2) == 1 and s.do_clean == 1          # cleared only while counting
    s = fresh()
    s.flow_ssdo_clean(0, U32 - 1)
    assert s.time == -1                                          # (int) of 2^32-1


def test_flow_age_is_unsigned_and_wraps():
    s = fresh(time=5, count_closed=1, z_prev=50.0)
    # 5 - (2^32 - 2) = 7 (mod 2^32): closed by delay 6, and 7 <= 6+1: newly closed
    assert s.flow_ssclean_with(0, 0, 6, U32 - 2, 30) == 0
    assert (s.count_closed_flows, s.gcount) == (0, 30.0)         # counted, then not sampled
    # maxtime after time: the age wraps to ~2^32, so the flow is old and kept
    assert s.flow_ssclean_with(0, 0, 6, 6, 30) == 1 and s.count_closed_flows == 1
    # delay 2^32-1: age 0 is still open (newly closed at the final cleaning) ...
    t = fresh(time=5)
    assert t.flow_ssfinal_clean(50, 0, U32 - 1, 5, 30) == 0
    assert (t.closing_now, t.delay(0), t.count_notsampled_new) == (1, -1, 1)
    # ... and age 2^32-1 is closed but old: delay+1 wraps to 0
    t = fresh(time=5)
    assert t.flow_ssfinal_clean(50, 0, U32 - 1, 6, 30) == 0
    assert (t.closing_now, t.fcount, t.count_notsampled_new) == (0, 30.0, 0)
    u = fresh(time=5, z_prev=50.0)
    assert u.flow_ssfinal_clean(50, 1, 3, 3, 30) == 0            # age 2 > 1: old, counts as 50
    assert (u.closing_now, u.fcount, u.count_notsampled_new) == (0, 50.0, 0)


def test_nssample_static_threshold():
    s = fresh()
    # 60, 100 (not > 100), 101 -> 1, 150 > z: sampled alone, 1 + 99 = 100 (not > 100)
    assert [s.nssample(0, n, 100) for n in (60, 40, 1, 150, 99)] == [0, 0, 1, 1, 0]
    assert s.nss_count == 100
    assert s.nssample(0, 1, 100) == 1 and s.nss_count == 1
    carried = SmartSamplingState()
    carried.dirty_init(s, 0)                   # a static counter: kept across windows
    assert carried.nss_count == 1
