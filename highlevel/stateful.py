"""GS-lite's built-in stateful sampling functions (`smart_sampling_state`) as Numba kernels.

These are the SFUNs of GS-lite's sampling operator (a query with SUPERGROUP / CLEANING_WHEN /
CLEANING_BY): the dynamic subset-sum sampling of `ssample`, `ssdo_clean`, `ssclean_with`,
`ssfinal_clean`, the flow sampling of `flow_ssample`, `flow_ssdo_clean`, `flow_ssclean_with`,
`flow_ssfinal_clean`, the reporting functions (`ssthreshold`, `count_distinct`, `packet_count`,
`gamma`, `do_clean_count`, `delay`, `newly_closed`) and the manual's static subset-sum
`nssample`. They are ported, bit for bit, from GS-lite's SSstateful_count_distinct.cc in
o-ran-sc/com-gs-lite (the C code, not the Tigon SQL manual, where the two differ).

One state (one supergroup in one window) is one row of `WORDS` float64 words, indexed by the
field constants below, in the C struct's field order, plus `NSS_COUNT`. C `double` fields are
float64; C `int` (and the `bool` `DO_SOOTH`, 0 or 1) fields hold int32 values, wrapped to 32-bit
two's complement whenever they are incremented or assigned from arithmetic, as the C does.
Every function takes `(state, cd)` first: `cd` is the hidden count of live groups of the
supergroup that the operator passes (the C's `curr_num_samples`, an `int`). The arguments
after it are float64; they are converted as the C parameter types convert them: `unsigned long
long` (lengths) truncates and wraps a negative value to 2^64 - |x| (then compares with doubles
in double), `unsigned int` (sample size, closing condition, delay, max time) wraps mod 2^32.

Where the code differs from the manual, the code wins:

- `final_init` sets z to z/2 when fewer groups than the sample size survive, else to
  z * cd / s_size (the C's "temp fix"; the manual's formulas use `bcount`), after subtracting
  the new flows not sampled in the previous window.
- `dirty_init` starts the next window at z_old / 10, floored at 1, because `do_sooth` is set
  everywhere and cleared nowhere. `do_sooth` is honoured as a field all the same: with it 0,
  z_old / 2 or z_old * cd / s_size, as in `final_init`. The C leaves the new state's z_prev
  uninitialised; here it is 0.0.
- The initial threshold z is 200 (the contributor manual says 100); `count` is a double.
- `nssample(len, z)` is not in com-gs-lite: the manual's static subset-sum with a strict `>`.
  Its counter, a process-global `static int` in the manual, is the `NSS_COUNT` word of the
  state here: zeroed by `clean_init`, carried over by `dirty_init`.

A division by a zero sample size gives inf or NaN as in C (the kernels never raise).
`FUNCTIONS` names each function's id for `call`, its number of arguments after (state, cd) and
its result type.
"""

from __future__ import annotations

import math

import numpy as np

from common.jit import ngjit, ngjit_inline

#: GS-lite's STATE name of these functions
STATE = "smart_sampling_state"

# field indexes of one state row: the C struct's fields in order, then nssample's counter
COUNT = 0                  # double: ssample's running sum of small lengths
GCOUNT = 1                 # double: running sum of the cleaning passes
FCOUNT = 2                 # double: running sum of the final (HAVING) pass
Z = 3                      # double: the threshold
Z_PREV = 4                 # double: the threshold before the last cleaning phase
GAMMA = 5                  # double: tolerance of the emergency cleaning
DO_CLEAN = 6               # int
BCOUNT = 7                 # int: lengths above the threshold
S_SIZE = 8                 # int: the sample size
FINAL_Z = 9                # int: final_init has run in this window
TIME = 10                  # int: the last counting slot (flow sampling)
PACKET_COUNT = 11          # int
DO_CLEAN_COUNT = 12        # int
DO_SOOTH = 13              # bool (0 or 1): divide z by 10 at the next window
COUNT_CLOSED = 14          # int: a counting phase is on
COUNT_CLOSED_FLOWS = 15    # int
COUNT_NOTSAMPLED_NEW = 16  # int
DELAY = 17                 # int
CLOSING_NOW = 18           # int
HOW_MANY_CLEANED = 19      # int
NSS_COUNT = 20             # int: nssample's counter
#: float64 words in one state row
WORDS = 21

_BURST_SOOTHING_FACTOR = 10.0
_TWO32 = 4294967296.0
_TWO64 = 18446744073709551616.0
_U32 = 0xFFFFFFFF


@ngjit_inline
def _i32(v):
    """An integer wrapped to C int (32-bit two's complement)."""
    return ((v + 0x80000000) & _U32) - 0x80000000


@ngjit_inline
def _trunc(x):
    """x rounded toward zero, exactly (fmod is exact, also beyond 2**53)."""
    return x - np.fmod(x, 1.0)


@ngjit_inline
def _u32(x):
    """A float64 argument as a C `unsigned int` (int64 in [0, 2**32)); not finite: 0."""
    t = _trunc(x)
    if not math.isfinite(t):
        return np.int64(0)
    t = np.fmod(t, _TWO32)
    if t < 0.0:
        t += _TWO32
    return np.int64(t)


@ngjit_inline
def _ull(x):
    """A float64 argument as a C `unsigned long long` converted to double (a negative int
    becomes 2**64 - |x|, rounded to double as C rounds it)."""
    t = np.fmod(_trunc(x), _TWO64)
    if t < 0.0:
        t += _TWO64
    return t


@ngjit_inline
def _int_of(x):
    """A float64 argument holding a C int (truncated, wrapped mod 2**32); not finite: 0."""
    t = _trunc(x)
    if not math.isfinite(t):
        return np.int64(0)
    return _i32(np.int64(np.fmod(t, _TWO32)))


@ngjit_inline
def _ratio(a, b):
    """a / b in IEEE double, b == 0 included (Numba would raise ZeroDivisionError)."""
    if b == 0.0:
        if a > 0.0:
            return math.inf
        if a < 0.0:
            return -math.inf
        return math.nan
    return a / b


@ngjit_inline
def _incr(s, field, by):
    s[field] = _i32(np.int64(s[field]) + by)


@ngjit
def clean_init(s):
    """`_sfun_state_clean_init_`: a supergroup not in the previous window."""
    s[:] = 0.0
    s[Z] = 200.0
    s[GAMMA] = 2.0
    s[DO_SOOTH] = 1.0


@ngjit
def dirty_init(new, old, cd):
    """`_sfun_state_dirty_init_`: carry a supergroup over from the previous window, whose
    final sample size (after HAVING) is cd."""
    cd = _i32(cd)
    old_z = old[Z]
    old_s_size = np.int64(old[S_SIZE])
    if cd < old_s_size:
        z = old_z / 2
    else:
        z = old_z * _ratio(float(cd), float(old_s_size))
    if old[DO_SOOTH] != 0.0:
        z = old_z / _BURST_SOOTHING_FACTOR
    if z <= 1.0:
        z = 1.0
    gamma_ = old[GAMMA]
    do_clean = old[DO_CLEAN]
    notsampled_new = old[COUNT_NOTSAMPLED_NEW]
    nss_count = old[NSS_COUNT]
    new[:] = 0.0  # bcount, counts, final_z, time, counters; z_prev too (uninitialised in C)
    new[Z] = z
    new[GAMMA] = gamma_
    new[DO_CLEAN] = do_clean
    new[S_SIZE] = float(old_s_size)
    new[COUNT_NOTSAMPLED_NEW] = notsampled_new
    new[DO_SOOTH] = 1.0
    new[NSS_COUNT] = nss_count


@ngjit
def final_init(s, cd):
    """`_sfun_state_final_init_`: the threshold of the final (HAVING) pass, cd groups live
    before it; only the first call in a window acts."""
    if s[FINAL_Z] != 0.0:
        return
    cd = _i32(cd)
    if s[COUNT_CLOSED] == 1.0:  # the window ends right after a counting phase
        s[COUNT_CLOSED] = 0.0
        s[COUNT_CLOSED_FLOWS] = 0.0
        s[HOW_MANY_CLEANED] = 0.0
    s[Z_PREV] = s[Z]
    notsampled_new = np.int64(s[COUNT_NOTSAMPLED_NEW])
    if notsampled_new != 0:
        cd = _i32(cd - notsampled_new)
    s_size = np.int64(s[S_SIZE])
    if cd < s_size:
        s[Z] = s[Z] / 2
    else:
        s[Z] = s[Z] * _ratio(float(cd), float(s_size))
    if s[Z] <= 0.0:
        s[Z] = 1.0
    s[BCOUNT] = 0.0
    s[FINAL_Z] = 1.0
    _incr(s, DO_CLEAN_COUNT, 1)
    s[COUNT_NOTSAMPLED_NEW] = 0.0


@ngjit_inline
def _subset_sum(s, field, new_len):
    """1 if new_len exceeds z, else whether the running sum `field` crosses z (>=)."""
    if new_len > s[Z]:
        _incr(s, BCOUNT, 1)
        return np.int64(1)
    s[field] += new_len
    if s[field] >= s[Z]:
        s[field] -= s[Z]
        return np.int64(1)
    return np.int64(0)


@ngjit
def ssample(s, cd, length, sample_size):
    """Dynamic subset-sum sampling of one tuple of size `length`: 1 if sampled."""
    _incr(s, PACKET_COUNT, 1)
    s[S_SIZE] = float(_i32(_u32(sample_size)))
    if s[DO_CLEAN] == 1.0:  # just back from a cleaning phase
        s[GCOUNT] = 0.0
        s[DO_CLEAN] = 0.0
    length = _ull(length)
    if length > s[Z]:
        _incr(s, BCOUNT, 1)
        return np.int64(1)
    s[COUNT] += length
    if s[COUNT] >= s[Z]:
        s[COUNT] -= s[Z]
        return np.int64(1)
    return np.int64(0)


@ngjit
def ssdo_clean(s, cd):
    """CLEANING_WHEN: more than gamma * sample size groups raise z by gamma."""
    if float(_i32(cd)) > s[GAMMA] * s[S_SIZE]:
        s[Z_PREV] = s[Z]
        s[Z] = s[GAMMA] * s[Z]
        s[DO_CLEAN] = 1.0
        s[BCOUNT] = 0.0
        s[COUNT] = 0.0
        s[GCOUNT] = 0.0
        _incr(s, DO_CLEAN_COUNT, 1)
    return np.int64(s[DO_CLEAN])


@ngjit_inline
def _adjusted_len(s, glen):
    """A group's size, counted at least as the previous threshold."""
    if glen < s[Z_PREV]:
        return s[Z_PREV]
    return glen


@ngjit
def ssclean_with(s, cd, glen):
    """CLEANING_BY: subsample a group of size glen at the new threshold."""
    return _subset_sum(s, GCOUNT, _adjusted_len(s, _ull(glen)))


@ngjit
def ssfinal_clean(s, cd, glen):
    """HAVING: the final subsampling of a group, unless at most s_size groups are live."""
    s[DO_SOOTH] = 1.0
    s[DO_CLEAN] = 1.0
    new_len = _adjusted_len(s, _ull(glen))
    if _i32(cd) <= np.int64(s[S_SIZE]):
        return np.int64(1)
    return _subset_sum(s, FCOUNT, new_len)


@ngjit
def ssthreshold(s, cd):
    return s[Z]


@ngjit
def count_distinct(s, cd):
    return _i32(cd)


@ngjit
def packet_count(s, cd):
    return np.int64(s[PACKET_COUNT])


@ngjit
def gamma(s, cd):
    return s[GAMMA]


@ngjit
def do_clean_count(s, cd):
    return np.int64(s[DO_CLEAN_COUNT])


@ngjit
def delay(s, cd):
    return np.int64(s[DELAY])


@ngjit
def newly_closed(s, cd):
    return np.int64(s[CLOSING_NOW])


@ngjit
def flow_ssample(s, cd, sample_size):
    """Flow sampling's WHERE: counts the tuple, ends a cleaning phase after a counting slot."""
    _incr(s, PACKET_COUNT, 1)
    s[S_SIZE] = float(_i32(_u32(sample_size)))
    if s[COUNT_CLOSED] == 1.0 and s[DO_CLEAN] == 1.0:
        s[HOW_MANY_CLEANED] = 0.0
        s[GCOUNT] = 0.0
        s[DO_CLEAN] = 0.0
    return np.int64(1)


@ngjit
def flow_ssdo_clean(s, cd, maxtime):
    """Flow sampling's CLEANING_WHEN: a new value of maxtime (max$(time)) starts a counting
    slot; too many closed flows counted raise z. do_clean stays 1 until flow_ssample clears it
    in a counting slot, so every tuple in between runs a cleaning pass, as in C."""
    maxtime_u = _u32(maxtime)
    if s[TIME] == 0.0:
        s[TIME] = float(_i32(maxtime_u))
    if (np.int64(s[TIME]) & _U32) != maxtime_u:  # int != unsigned: compared unsigned
        s[TIME] = float(_i32(maxtime_u))
        s[COUNT_CLOSED] = 1.0
        return np.int64(1)
    if s[COUNT_CLOSED_FLOWS] > s[GAMMA] * s[S_SIZE]:
        s[Z_PREV] = s[Z]
        s[Z] = _ratio(s[COUNT_CLOSED_FLOWS], s[S_SIZE]) * s[Z]
        s[DO_CLEAN] = 1.0
        s[BCOUNT] = 0.0
        s[COUNT] = 0.0
        s[GCOUNT] = 0.0
        _incr(s, DO_CLEAN_COUNT, 1)
    if s[COUNT_CLOSED] == 1.0:  # back from a counting slot
        s[COUNT_CLOSED] = 0.0
        s[COUNT_CLOSED_FLOWS] = 0.0
        s[GCOUNT] = 0.0
    return np.int64(s[DO_CLEAN])


@ngjit_inline
def _since(s, maxtime_u):
    """C's `state->time - maxtime`: int minus unsigned int, an unsigned 32-bit difference."""
    return (np.int64(s[TIME]) - maxtime_u) & _U32


@ngjit_inline
def _newly_closed(cc, d, delay_u):
    """A closed flow closed within the last counting slot (d: time since its last packet)."""
    if cc == 1:
        return d <= 1
    return d <= ((delay_u + 1) & _U32)


@ngjit
def flow_ssclean_with(s, cd, ccondition, delay, maxtime, glen):
    """Flow sampling's CLEANING_BY: in a counting slot counts the closed flows and subsamples
    the newly closed ones; otherwise subsamples the closed flows. Open flows are kept."""
    cc = _u32(ccondition)
    delay_u = _u32(delay)
    d = _since(s, _u32(maxtime))
    new_group = False
    if s[COUNT_CLOSED] == 1.0:
        if cc == 1 or d >= delay_u:
            _incr(s, COUNT_CLOSED_FLOWS, 1)
            new_group = _newly_closed(cc, d, delay_u)
        if not new_group:
            return np.int64(1)
    if cc == 0 and d < delay_u:  # still open
        return np.int64(1)
    glen_d = _ull(glen)
    new_len = glen_d if new_group else _adjusted_len(s, glen_d)
    if new_len > s[Z]:
        _incr(s, BCOUNT, 1)
        sampled = np.int64(1)
    else:
        s[GCOUNT] += new_len
        if s[GCOUNT] >= s[Z]:
            s[GCOUNT] -= s[Z]
            sampled = np.int64(1)
        else:
            sampled = np.int64(0)
            if s[COUNT_CLOSED] == 1.0:
                _incr(s, COUNT_CLOSED_FLOWS, -1)
    if s[DO_CLEAN] == 1.0:
        _incr(s, HOW_MANY_CLEANED, sampled)
    return sampled


@ngjit
def flow_ssfinal_clean(s, cd, ccondition, delay, maxtime, glen):
    """Flow sampling's HAVING: the final subsampling; counts the newly closed flows and those
    of them not sampled (subtracted from cd by the next window's final_init)."""
    cc = _u32(ccondition)
    delay_u = _u32(delay)
    s[DO_SOOTH] = 1.0
    s[DELAY] = float(_i32(delay_u))
    s[DO_CLEAN] = 1.0
    d = _since(s, _u32(maxtime))
    new_group = True
    if cc == 1 or d >= delay_u:
        new_group = _newly_closed(cc, d, delay_u)
    glen_d = _ull(glen)
    if new_group:
        _incr(s, CLOSING_NOW, 1)
        new_len = glen_d
    else:
        new_len = _adjusted_len(s, glen_d)
    if _i32(cd) <= np.int64(s[S_SIZE]):
        s[COUNT_NOTSAMPLED_NEW] = 0.0
        return np.int64(1)
    if new_len > s[Z]:
        _incr(s, BCOUNT, 1)
        sampled = np.int64(1)
    else:
        s[FCOUNT] += new_len
        if s[FCOUNT] >= s[Z]:
            s[FCOUNT] -= s[Z]
            sampled = np.int64(1)
        else:
            sampled = np.int64(0)
            if new_group:
                _incr(s, COUNT_NOTSAMPLED_NEW, 1)
    _incr(s, HOW_MANY_CLEANED, sampled)
    return sampled


@ngjit
def nssample(s, cd, length, z):
    """The manual's static subset-sum: a length above z, and every crossing of z (strict >)
    by the running sum, is sampled. The sum is a C int: `count += length` and `count -= z`
    are C's `int += double` (in double, truncated, wrapped here)."""
    if length > z:
        return np.int64(1)
    count = _int_of(s[NSS_COUNT] + length)
    if count > z:
        count = _int_of(count - z)
        s[NSS_COUNT] = float(count)
        return np.int64(1)
    s[NSS_COUNT] = float(count)
    return np.int64(0)


#: name (lower case) -> (function id for `call`, number of arguments after (state, cd),
#: result type "int" | "float")
FUNCTIONS: dict[str, tuple[int, int, str]] = {
    "ssample": (0, 2, "int"),
    "ssdo_clean": (1, 0, "int"),
    "ssclean_with": (2, 1, "int"),
    "ssfinal_clean": (3, 1, "int"),
    "ssthreshold": (4, 0, "float"),
    "count_distinct": (5, 0, "int"),
    "packet_count": (6, 0, "int"),
    "gamma": (7, 0, "float"),
    "do_clean_count": (8, 0, "int"),
    "delay": (9, 0, "int"),
    "newly_closed": (10, 0, "int"),
    "flow_ssample": (11, 1, "int"),
    "flow_ssdo_clean": (12, 1, "int"),
    "flow_ssclean_with": (13, 4, "int"),
    "flow_ssfinal_clean": (14, 4, "int"),
    "nssample": (15, 2, "int"),
}

_ARITY = np.zeros(len(FUNCTIONS), dtype=np.int64)
for _fid, _n, _ in FUNCTIONS.values():
    _ARITY[_fid] = _n
del _fid, _n, _


@ngjit
def call(fid, s, cd, args):
    """The function `fid` (see FUNCTIONS) on state s with arguments args[0..n-1], its result
    as float64; NaN for an unknown id or too few arguments (never raises)."""
    if fid < 0 or fid >= _ARITY.shape[0] or args.shape[0] < _ARITY[fid]:
        return math.nan
    if fid == 0:
        return float(ssample(s, cd, args[0], args[1]))
    if fid == 1:
        return float(ssdo_clean(s, cd))
    if fid == 2:
        return float(ssclean_with(s, cd, args[0]))
    if fid == 3:
        return float(ssfinal_clean(s, cd, args[0]))
    if fid == 4:
        return ssthreshold(s, cd)
    if fid == 5:
        return float(count_distinct(s, cd))
    if fid == 6:
        return float(packet_count(s, cd))
    if fid == 7:
        return gamma(s, cd)
    if fid == 8:
        return float(do_clean_count(s, cd))
    if fid == 9:
        return float(delay(s, cd))
    if fid == 10:
        return float(newly_closed(s, cd))
    if fid == 11:
        return float(flow_ssample(s, cd, args[0]))
    if fid == 12:
        return float(flow_ssdo_clean(s, cd, args[0]))
    if fid == 13:
        return float(flow_ssclean_with(s, cd, args[0], args[1], args[2], args[3]))
    if fid == 14:
        return float(flow_ssfinal_clean(s, cd, args[0], args[1], args[2], args[3]))
    return float(nssample(s, cd, args[0], args[1]))
