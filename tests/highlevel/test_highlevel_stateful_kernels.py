"""Hand-computed sequences of GS-lite's smart_sampling_state kernels (highlevel.stateful)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from highlevel import stateful as st


def fresh(**fields: float) -> np.ndarray:
    """A clean_init state, then the given fields (by lower-case name) overwritten."""
    s = np.full(st.WORDS, np.nan)
    st.clean_init(s)
    for name, value in fields.items():
        s[getattr(st, name.upper())] = value
    return s


def test_clean_init_values():
    s = fresh()
    assert s[st.Z] == 200.0 and s[st.GAMMA] == 2.0 and s[st.DO_SOOTH] == 1.0
    others = np.delete(s, [st.Z, st.GAMMA, st.DO_SOOTH])
    assert (others == 0.0).all() and len(s) == st.WORDS == 21


def test_ssample_admits_large_and_accumulates_small_to_z():
    s = fresh(do_clean=1, gcount=7)
    assert st.ssample(s, 0, 300.0, 10.0) == 1          # > z: sampled, counted in bcount
    assert (s[st.BCOUNT], s[st.COUNT], s[st.S_SIZE]) == (1, 0, 10)
    assert (s[st.DO_CLEAN], s[st.GCOUNT]) == (0, 0)    # back from a cleaning phase
    assert st.ssample(s, 0, 150.0, 10.0) == 0
    assert st.ssample(s, 0, 40.0, 10.0) == 0           # count 190
    assert st.ssample(s, 0, 30.0, 10.0) == 1           # 220 >= 200: sampled, 20 left
    assert s[st.COUNT] == 20.0
    assert st.ssample(s, 0, 180.0, 10.0) == 1          # exactly z again (>=)
    assert s[st.COUNT] == 0.0 and s[st.PACKET_COUNT] == 5 and s[st.BCOUNT] == 1


def test_ssample_negative_length_is_unsigned_long_long():
    s = fresh()
    assert st.ssample(s, 0, -1.0, 10.0) == 1           # 2**64 - 1 > z
    assert s[st.BCOUNT] == 1 and s[st.COUNT] == 0.0


def test_int_fields_wrap_to_int32():
    s = fresh(packet_count=2**31 - 1)
    st.ssample(s, 0, 1.0, 2.0**32 - 1)
    assert s[st.PACKET_COUNT] == -(2**31)
    assert s[st.S_SIZE] == -1                          # (int) of unsigned 0xFFFFFFFF


def test_ssdo_clean_triggers_above_gamma_times_sample_size():
    s = fresh(s_size=10, count=50, gcount=30, bcount=3)
    assert st.ssdo_clean(s, 20) == 0                   # 20 > 2 * 10 is false
    assert s[st.Z] == 200.0
    assert st.ssdo_clean(s, 21) == 1
    assert (s[st.Z], s[st.Z_PREV], s[st.DO_CLEAN_COUNT]) == (400.0, 200.0, 1)
    assert (s[st.COUNT], s[st.GCOUNT], s[st.BCOUNT]) == (0.0, 0.0, 0)
    assert st.ssdo_clean(s, 1) == 1                    # do_clean stays until ssample
    assert s[st.Z] == 400.0
    st.ssample(s, 0, 1.0, 10.0)
    assert st.ssdo_clean(s, 1) == 0


def test_ssclean_with_counts_small_groups_as_z_prev():
    s = fresh(z=400, z_prev=200)
    assert st.ssclean_with(s, 99, 100.0) == 0          # counted as 200
    assert st.ssclean_with(s, 99, 150.0) == 1          # 400 >= 400
    assert s[st.GCOUNT] == 0.0
    assert st.ssclean_with(s, 99, 500.0) == 1 and s[st.BCOUNT] == 1
    assert st.ssclean_with(s, 99, 250.0) == 0 and s[st.GCOUNT] == 250.0


def test_ssfinal_clean_keeps_all_up_to_sample_size():
    s = fresh(z=400, z_prev=200, s_size=3, do_sooth=0)
    assert st.ssfinal_clean(s, 3, 10.0) == 1 and s[st.FCOUNT] == 0.0
    assert (s[st.DO_SOOTH], s[st.DO_CLEAN]) == (1, 1)
    assert st.ssfinal_clean(s, 4, 10.0) == 0 and s[st.FCOUNT] == 200.0
    assert st.ssfinal_clean(s, 4, 300.0) == 1 and s[st.FCOUNT] == 100.0


def test_final_init_halves_or_scales_z_once_per_window():
    s = fresh(s_size=10, bcount=4)
    st.final_init(s, 5)
    assert (s[st.Z], s[st.Z_PREV], s[st.FINAL_Z], s[st.BCOUNT]) == (100.0, 200.0, 1, 0)
    st.final_init(s, 5)                                 # final_z set: no change
    assert s[st.Z] == 100.0 and s[st.DO_CLEAN_COUNT] == 1
    s = fresh(s_size=10)
    st.final_init(s, 30)
    assert s[st.Z] == 600.0                             # z * 30 / 10
    s = fresh(s_size=10, count_notsampled_new=5)
    st.final_init(s, 12)                                # 12 - 5 < 10
    assert s[st.Z] == 100.0 and s[st.COUNT_NOTSAMPLED_NEW] == 0
    s = fresh(count_closed=1, count_closed_flows=9, how_many_cleaned=4)
    st.final_init(s, 3)                                 # s_size 0: z * 3 / 0 = inf, no raise
    assert s[st.Z] == math.inf
    assert (s[st.COUNT_CLOSED], s[st.COUNT_CLOSED_FLOWS], s[st.HOW_MANY_CLEANED]) == (0, 0, 0)


def test_dirty_init_z_old_over_ten_floored_at_one():
    old = fresh(z=250, s_size=7, gamma=3, do_clean=1, count_notsampled_new=2, nss_count=5,
                count=9, z_prev=123, packet_count=8, time=77)
    new = np.full(st.WORDS, np.nan)
    st.dirty_init(new, old, 100)
    assert new[st.Z] == 25.0 and new[st.Z_PREV] == 0.0
    assert (new[st.GAMMA], new[st.DO_CLEAN], new[st.S_SIZE]) == (3.0, 1, 7)
    assert (new[st.COUNT_NOTSAMPLED_NEW], new[st.NSS_COUNT], new[st.DO_SOOTH]) == (2, 5, 1)
    assert (new[st.COUNT], new[st.PACKET_COUNT], new[st.TIME]) == (0.0, 0, 0)
    st.dirty_init(new, fresh(z=5), 0)
    assert new[st.Z] == 1.0                             # 0.5 floored at 1
    st.dirty_init(new, fresh(z=250, s_size=10, do_sooth=0), 4)
    assert new[st.Z] == 125.0                           # without do_sooth: z / 2
    st.dirty_init(new, fresh(z=250, s_size=10, do_sooth=0), 30)
    assert new[st.Z] == 750.0                           # z * 30 / 10


def test_flow_ssdo_clean_counting_slots():
    s = fresh(s_size=2)
    assert st.flow_ssdo_clean(s, 0, 100.0) == 0        # first time seen: no new slot
    assert (s[st.TIME], s[st.COUNT_CLOSED]) == (100, 0)
    assert st.flow_ssdo_clean(s, 0, 101.0) == 1        # new counting slot
    assert (s[st.TIME], s[st.COUNT_CLOSED]) == (101, 1)
    s[st.COUNT_CLOSED_FLOWS] = 5                        # 5 > 2 * 2: clean
    assert st.flow_ssdo_clean(s, 0, 101.0) == 1
    assert (s[st.Z], s[st.Z_PREV], s[st.DO_CLEAN_COUNT]) == (500.0, 200.0, 1)
    assert (s[st.COUNT_CLOSED], s[st.COUNT_CLOSED_FLOWS]) == (0, 0)
    assert st.flow_ssample(s, 0, 2.0) == 1
    assert st.flow_ssdo_clean(s, 0, 101.0) == 1        # do_clean kept outside a counting slot
    assert st.flow_ssdo_clean(s, 0, 102.0) == 1
    st.flow_ssample(s, 0, 2.0)                          # in a counting slot: ends cleaning
    assert s[st.DO_CLEAN] == 0
    assert st.flow_ssdo_clean(s, 0, 102.0) == 0


def test_flow_ssclean_with_counting_phase():
    s = fresh(time=101, count_closed=1)
    assert st.flow_ssclean_with(s, 0, 0.0, 5.0, 101.0, 50.0) == 1     # open: kept
    assert s[st.COUNT_CLOSED_FLOWS] == 0
    assert st.flow_ssclean_with(s, 0, 1.0, 5.0, 100.0, 50.0) == 0     # newly closed, too small
    assert s[st.COUNT_CLOSED_FLOWS] == 0 and s[st.GCOUNT] == 50.0     # counted then uncounted
    assert st.flow_ssclean_with(s, 0, 1.0, 5.0, 90.0, 50.0) == 1      # closed and old: kept
    assert s[st.COUNT_CLOSED_FLOWS] == 1
    assert st.flow_ssclean_with(s, 0, 0.0, 5.0, 95.0, 150.0) == 1     # idle 6 <= delay + 1
    assert s[st.COUNT_CLOSED_FLOWS] == 2 and s[st.GCOUNT] == 0.0


def test_flow_time_difference_is_unsigned():
    # max(time) after state.time: 101 - 102 is 0xFFFFFFFF >= delay, a closed old flow
    s = fresh(time=101, count_closed=1)
    assert st.flow_ssclean_with(s, 0, 0.0, 5.0, 102.0, 50.0) == 1
    assert s[st.COUNT_CLOSED_FLOWS] == 1 and s[st.GCOUNT] == 0.0
    # delay 0xFFFFFFFF: delay + 1 wraps to 0, so d = 0xFFFFFFFF is not "newly closed"
    s = fresh(time=101, z_prev=7)
    assert st.flow_ssfinal_clean(s, 5, 0.0, 2.0**32 - 1, 102.0, 3.0) == 0
    assert (s[st.CLOSING_NOW], s[st.FCOUNT], s[st.DELAY]) == (0, 7.0, -1)
    assert st.flow_ssfinal_clean(s, 5, 0.0, 2.0**32 - 2, 102.0, 3.0) == 0
    assert (s[st.CLOSING_NOW], s[st.FCOUNT]) == (1, 10.0)    # newly closed: glen, not z_prev
    assert s[st.COUNT_NOTSAMPLED_NEW] == 1


def test_flow_ssfinal_clean_counts_new_and_resets_when_small():
    s = fresh(time=50, s_size=3, count_notsampled_new=4)
    assert st.flow_ssfinal_clean(s, 3, 0.0, 10.0, 50.0, 1.0) == 1   # cd <= s_size
    assert (s[st.CLOSING_NOW], s[st.COUNT_NOTSAMPLED_NEW], s[st.DELAY]) == (1, 0, 10)
    assert (s[st.DO_CLEAN], s[st.DO_SOOTH]) == (1, 1)
    assert st.flow_ssfinal_clean(s, 4, 1.0, 10.0, 49.0, 300.0) == 1  # > z
    assert (s[st.BCOUNT], s[st.HOW_MANY_CLEANED], s[st.CLOSING_NOW]) == (1, 1, 2)


def test_nssample_strict_crossing():
    s = fresh()
    seq = [(150, 1), (60, 0), (40, 0), (1, 1), (100, 1), (99, 0)]
    got = [st.nssample(s, 0, float(n), 100.0) for n, _ in seq]
    assert got == [want for _, want in seq]
    assert s[st.NSS_COUNT] == 100                       # 60+40+1-100 = 1, then +100-100, then +99
    s = fresh(nss_count=2**31 - 10)
    st.nssample(s, 0, 20.0, 2.0**40)
    assert s[st.NSS_COUNT] == -(2**31) + 10


def test_reporting_functions():
    s = fresh(packet_count=3, do_clean_count=2, delay=9, closing_now=4, z=12.5)
    assert st.ssthreshold(s, 7) == 12.5 and st.gamma(s, 7) == 2.0
    assert st.count_distinct(s, 7) == 7 and st.packet_count(s, 7) == 3
    assert (st.do_clean_count(s, 7), st.delay(s, 7), st.newly_closed(s, 7)) == (2, 9, 4)


CALLS = [  # name, cd, args
    ("ssample", 4, (120.0, 3.0)), ("ssdo_clean", 9, ()), ("ssclean_with", 4, (60.0,)),
    ("ssfinal_clean", 9, (90.0,)), ("ssthreshold", 4, ()), ("count_distinct", 6, ()),
    ("packet_count", 4, ()), ("gamma", 4, ()), ("do_clean_count", 4, ()), ("delay", 4, ()),
    ("newly_closed", 4, ()), ("flow_ssample", 4, (3.0,)), ("flow_ssdo_clean", 4, (105.0,)),
    ("flow_ssclean_with", 9, (0.0, 2.0, 100.0, 70.0)),
    ("flow_ssfinal_clean", 9, (1.0, 2.0, 103.0, 80.0)), ("nssample", 4, (60.0, 100.0)),
]


def test_functions_table():
    table = st.FUNCTIONS
    assert {name for name, _, _ in CALLS} == set(table)
    assert sorted(fid for fid, _, _ in table.values()) == list(range(len(table)))
    for name, _, args in CALLS:
        assert table[name][1] == len(args)
    assert {k for k, v in table.items() if v[2] == "float"} == {"ssthreshold", "gamma"}


@pytest.mark.parametrize("name,cd,args", CALLS)
def test_call_dispatch_equals_direct_call(name, cd, args):
    fid, _, _ = st.FUNCTIONS[name]
    a = fresh(time=104, z_prev=50, s_size=3, count_closed=1, do_clean=1, count=150)
    b = a.copy()
    for _ in range(3):  # a few rounds, so state changes feed back
        direct = getattr(st, name)(a, cd, *args)
        called = st.call(fid, b, cd, np.array(args, dtype=np.float64))
        assert called == float(direct)
        np.testing.assert_array_equal(a, b)


def test_call_never_raises_on_bad_input():
    s = fresh()
    assert math.isnan(st.call(99, s, 0, np.zeros(4)))
    assert math.isnan(st.call(-1, s, 0, np.zeros(4)))
    assert math.isnan(st.call(st.FUNCTIONS["ssample"][0], s, 0, np.zeros(1)))
    s = fresh()
    st.final_init(s, 0)                                 # 0 / 0 sample size: NaN, no raise
    assert math.isnan(s[st.Z])
