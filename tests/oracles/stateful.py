"""Oracle of GS-lite's stateful sampling functions (STATE smart_sampling_state), in plain Python.

A line-by-line port of the C semantics of GS-lite's `SSstateful_count_distinct.cc`
(o-ran-sc/com-gs-lite), written independently of the runtime module `highlevel.stateful`
so that a randomized test can compare the two. Nothing here is shared with the runtime:
no field table, no numpy, no Numba.

C types are kept exactly:

* `double` fields are Python floats (IEEE binary64, like C); a division by zero gives
  +-inf or NaN as in C instead of raising.
* `int` fields are Python ints wrapped to 32-bit two's complement after every change;
  `(int)` conversions of `unsigned int` arguments wrap the same way.
* `unsigned int` / `unsigned long long` arguments are reduced modulo 2**32 / 2**64, so a
  negative value becomes 2**k - |x| as in C.
* An unsigned argument compared with, or added to, a double is first converted to double.
* `state->time - maxtime` is `int - unsigned int`, i.e. unsigned 32-bit arithmetic, and is
  compared unsigned with `delay`, `1` and `delay + 1` (which wraps modulo 2**32 too).

Decisions where the C code leaves something open:

* `dirty_init` does not assign `z_prev` in C (uninitialised memory); here it becomes 0.0.
* `do_sooth` is honoured as in C, although nothing ever sets it false.
* `nssample(len, z)` is not in GS-lite (the manuals' static subset-sum sampling); it keeps
  one more int field, `nss_count`: 0 after `clean_init`, carried over by `dirty_init` (the
  manuals' counter is a `static int`, never reset between windows), untouched by
  `final_init`. `len` and `z` are unsigned and compared exactly.

Every function takes the hidden `cd` (GS-lite's `curr_num_samples`) first, then its own
arguments; `call(name, cd, args)` dispatches by the GSQL function name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# the C struct's fields in declaration order, then nssample's counter
FIELDS = (
    "count", "gcount", "fcount", "z", "z_prev", "gamma",
    "do_clean", "bcount", "s_size", "final_z", "time", "packet_count", "do_clean_count",
    "do_sooth",
    "count_closed", "count_closed_flows", "count_notsampled_new", "delay", "closing_now",
    "how_many_cleaned",
    "nss_count",
)
DOUBLE_FIELDS = frozenset({"count", "gcount", "fcount", "z", "z_prev", "gamma"})

# fields whose name is also a function name (an accessor method): stored with a trailing "_"
_RENAMED = frozenset({"packet_count", "gamma", "do_clean_count", "delay"})

# GSQL function name -> number of arguments after (state, cd)
FUNCTIONS = {
    "ssample": 2,
    "ssdo_clean": 0,
    "ssclean_with": 1,
    "ssfinal_clean": 1,
    "ssthreshold": 0,
    "count_distinct": 0,
    "packet_count": 0,
    "gamma": 0,
    "do_clean_count": 0,
    "delay": 0,
    "newly_closed": 0,
    "flow_ssample": 1,
    "flow_ssdo_clean": 1,
    "flow_ssclean_with": 4,
    "flow_ssfinal_clean": 4,
    "nssample": 2,
}

_BURST_SOOTHING_FACTOR = 10.0


def _i32(x) -> int:
    """C `int`: wrap to 32-bit two's complement."""
    x = int(x) & 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


def _u32(x) -> int:
    """C `unsigned int`."""
    return int(x) & 0xFFFFFFFF


def _u64(x) -> int:
    """C `unsigned long long`."""
    return int(x) & 0xFFFFFFFFFFFFFFFF


def _div(a: float, b: float) -> float:
    """IEEE-754 double division as C does it: x/0 is +-inf, 0/0 is NaN (Python would raise)."""
    if b != 0.0:
        return a / b
    if a == 0.0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _attr(field: str) -> str:
    return field + "_" if field in _RENAMED else field


class SmartSamplingState:
    """One `smart_sampling_state` (C `struct SSstate`) and the functions over it.

    Fields are attributes named like the C struct's, except `packet_count`, `gamma`,
    `do_clean_count` and `delay`, which clash with the accessor functions of the same
    names and are stored as `packet_count_`, `gamma_`, `do_clean_count_`, `delay_`.
    `fields()` gives every field under its C name. A new object is all zeros (like a fresh
    runtime state array); GS-lite's `new state()` is uninitialised and always goes through
    `clean_init` or `dirty_init` first.
    """

    def __init__(self) -> None:
        self.count = 0.0
        self.gcount = 0.0
        self.fcount = 0.0
        self.z = 0.0
        self.z_prev = 0.0
        self.gamma_ = 0.0
        self.do_clean = 0
        self.bcount = 0
        self.s_size = 0
        self.final_z = 0
        self.time = 0
        self.packet_count_ = 0
        self.do_clean_count_ = 0
        self.do_sooth = False
        self.count_closed = 0
        self.count_closed_flows = 0
        self.count_notsampled_new = 0
        self.delay_ = 0
        self.closing_now = 0
        self.how_many_cleaned = 0
        self.nss_count = 0

    def fields(self) -> dict[str, float | int | bool]:
        """Every field under its C name, in struct order."""
        return {f: getattr(self, _attr(f)) for f in FIELDS}

    def __repr__(self) -> str:
        return "SmartSamplingState(" + ", ".join(f"{k}={v!r}" for k, v in self.fields().items()) + ")"

    # ---- state initialisation -----------------------------------------------------------

    def clean_init(self) -> None:
        """_sfun_state_clean_init: a supergroup not present in the previous window."""
        self.count = self.gcount = self.fcount = 0.0
        self.z = 200.0
        self.z_prev = 0.0
        self.gamma_ = 2.0
        self.do_clean = self.bcount = self.s_size = self.final_z = self.time = 0
        self.count_closed = self.count_closed_flows = self.count_notsampled_new = 0
        self.packet_count_ = self.do_clean_count_ = 0
        self.do_sooth = True
        self.how_many_cleaned = self.delay_ = self.closing_now = 0
        self.nss_count = 0

    def dirty_init(self, old: SmartSamplingState, cd) -> None:
        """_sfun_state_dirty_init: this state follows `old`, the previous window's, with cd groups."""
        cd = _i32(cd)
        if cd < old.s_size:
            self.z = old.z / 2
            if old.do_sooth:
                self.z = old.z / _BURST_SOOTHING_FACTOR
        else:
            self.z = old.z * _div(float(cd), float(old.s_size))
            if old.do_sooth:
                self.z = old.z / _BURST_SOOTHING_FACTOR
        if self.z <= 1.0:
            self.z = 1.0
        self.gamma_ = old.gamma_
        self.do_clean = old.do_clean
        self.s_size = old.s_size
        self.bcount = 0
        self.gcount = self.count = self.fcount = 0.0
        self.final_z = self.time = 0
        self.count_closed = self.count_closed_flows = 0
        self.count_notsampled_new = old.count_notsampled_new
        self.packet_count_ = self.do_clean_count_ = 0
        self.do_sooth = True
        self.how_many_cleaned = self.delay_ = self.closing_now = 0
        self.z_prev = 0.0       # not assigned by the C code (uninitialised memory)
        self.nss_count = old.nss_count

    def final_init(self, cd) -> None:
        """_sfun_state_final_init: threshold for the final cleaning (HAVING) at the window end."""
        cd = _i32(cd)
        if self.final_z != 0:
            return
        if self.count_closed == 1:
            self.count_closed = self.count_closed_flows = self.how_many_cleaned = 0
        self.z_prev = self.z
        if self.count_notsampled_new != 0:
            cd = _i32(cd - self.count_notsampled_new)
        if cd < self.s_size:
            self.z = self.z / 2
        else:
            self.z = self.z * _div(float(cd), float(self.s_size))
        if self.z <= 0:
            self.z = 1.0
        self.bcount = 0
        self.final_z = 1
        self.do_clean_count_ = _i32(self.do_clean_count_ + 1)
        self.count_notsampled_new = 0

    # ---- dynamic subset-sum sampling ----------------------------------------------------

    def ssample(self, cd, length, sample_size) -> int:
        length, sample_size = _u64(length), _u32(sample_size)
        self.packet_count_ = _i32(self.packet_count_ + 1)
        self.s_size = _i32(sample_size)
        sampled = 0
        if self.do_clean == 1:           # just back from a cleaning phase
            self.gcount = 0.0
            self.do_clean = 0
        if float(length) > self.z:
            self.bcount = _i32(self.bcount + 1)
            sampled = 1
        else:
            self.count += float(length)
            if self.count >= self.z:
                sampled = 1
                self.count -= self.z
        return sampled

    def ssdo_clean(self, cd) -> int:
        cd = _i32(cd)
        if float(cd) > self.gamma_ * float(self.s_size):
            self.z_prev = self.z
            self.z = self.gamma_ * self.z
            self.do_clean = 1
            self.bcount = 0
            self.count = self.gcount = 0.0
            self.do_clean_count_ = _i32(self.do_clean_count_ + 1)
        return self.do_clean

    def _inflated(self, glen: int) -> float:
        """An old group counts at least z_prev (the threshold it survived)."""
        g = float(glen)
        return self.z_prev if g < self.z_prev else g

    def ssclean_with(self, cd, glen) -> int:
        new_len = self._inflated(_u64(glen))
        if new_len > self.z:
            self.bcount = _i32(self.bcount + 1)
            return 1
        self.gcount += new_len
        if self.gcount >= self.z:
            self.gcount -= self.z
            return 1
        return 0

    def ssfinal_clean(self, cd, glen) -> int:
        cd = _i32(cd)
        self.do_sooth = True
        self.do_clean = 1
        new_len = self._inflated(_u64(glen))
        if cd <= self.s_size:            # no need to clean
            return 1
        if new_len > self.z:
            self.bcount = _i32(self.bcount + 1)
            return 1
        self.fcount += new_len
        if self.fcount >= self.z:
            self.fcount -= self.z
            return 1
        return 0

    def ssthreshold(self, cd) -> float:
        return self.z

    def count_distinct(self, cd) -> int:
        return _i32(cd)

    # ---- accessors (reporting) ----------------------------------------------------------

    def packet_count(self, cd) -> int:
        return self.packet_count_

    def gamma(self, cd) -> float:
        return self.gamma_

    def do_clean_count(self, cd) -> int:
        return self.do_clean_count_

    def delay(self, cd) -> int:
        return self.delay_

    def newly_closed(self, cd) -> int:
        return self.closing_now

    # ---- flow sampling ------------------------------------------------------------------

    def _age(self, maxtime: int) -> int:
        """`state->time - maxtime`: int minus unsigned int, so unsigned 32-bit."""
        return (self.time - maxtime) & 0xFFFFFFFF

    def flow_ssample(self, cd, sample_size) -> int:
        self.packet_count_ = _i32(self.packet_count_ + 1)
        self.s_size = _i32(_u32(sample_size))
        # a nested `if` in C: the comment lines between the two are not a statement
        if self.count_closed == 1 and self.do_clean == 1:
            self.how_many_cleaned = 0
            self.gcount = 0.0
            self.do_clean = 0
        return 1

    def flow_ssdo_clean(self, cd, maxtime) -> int:
        maxtime = _u32(maxtime)
        if self.time == 0:
            self.time = _i32(maxtime)
        if _u32(self.time) != maxtime:  # int != unsigned int: compared unsigned
            self.time = _i32(maxtime)   # a new counting slot
            self.count_closed = 1
            return 1
        if float(self.count_closed_flows) > self.gamma_ * float(self.s_size):
            self.z_prev = self.z
            self.z = _div(float(self.count_closed_flows), float(self.s_size)) * self.z
            self.do_clean = 1
            self.bcount = 0
            self.count = self.gcount = 0.0
            self.do_clean_count_ = _i32(self.do_clean_count_ + 1)
        if self.count_closed == 1:       # just back from the counting slot
            self.count_closed = self.count_closed_flows = 0
            self.gcount = 0.0
        return self.do_clean

    def flow_ssclean_with(self, cd, ccondition, delay, maxtime, glen) -> int:
        ccondition, delay, maxtime, glen = _u32(ccondition), _u32(delay), _u32(maxtime), _u64(glen)
        age = self._age(maxtime)
        new_group = 0
        if self.count_closed == 1:       # counting phase
            if ccondition == 1 or age >= delay:
                self.count_closed_flows = _i32(self.count_closed_flows + 1)
                if ccondition == 1:
                    new_group = int(age <= 1)
                else:
                    new_group = int(age <= ((delay + 1) & 0xFFFFFFFF))
            if new_group == 0:           # open, or closed and old: keep
                return 1
        if ccondition == 0 and age < delay:   # still open: keep
            return 1
        new_len = self._inflated(glen) if new_group == 0 else float(glen)
        if new_len > self.z:
            self.bcount = _i32(self.bcount + 1)
            sampled = 1
        else:
            self.gcount += new_len
            if self.gcount >= self.z:
                sampled = 1
                self.gcount -= self.z
            else:
                sampled = 0
                if self.count_closed == 1:
                    self.count_closed_flows = _i32(self.count_closed_flows - 1)
        if self.do_clean == 1:
            self.how_many_cleaned = _i32(self.how_many_cleaned + sampled)
        return sampled

    def flow_ssfinal_clean(self, cd, ccondition, delay, maxtime, glen) -> int:
        cd = _i32(cd)
        ccondition, delay, maxtime, glen = _u32(ccondition), _u32(delay), _u32(maxtime), _u64(glen)
        self.do_sooth = True
        self.delay_ = _i32(delay)
        self.do_clean = 1
        age = self._age(maxtime)
        new_group = 1                    # newly closed or still open
        if ccondition == 1 or age >= delay:
            if ccondition == 1:
                new_group = int(age <= 1)
            else:
                new_group = int(age <= ((delay + 1) & 0xFFFFFFFF))
        if new_group == 0:
            new_len = self._inflated(glen)
        else:
            self.closing_now = _i32(self.closing_now + 1)
            new_len = float(glen)
        if cd <= self.s_size:            # no need to clean
            self.count_notsampled_new = 0
            return 1
        if new_len > self.z:
            sampled = 1
            self.bcount = _i32(self.bcount + 1)
        else:
            self.fcount += new_len
            if self.fcount >= self.z:
                sampled = 1
                self.fcount -= self.z
            else:
                sampled = 0
                if new_group == 1:
                    self.count_notsampled_new = _i32(self.count_notsampled_new + 1)
        self.how_many_cleaned = _i32(self.how_many_cleaned + sampled)
        return sampled

    # ---- static subset-sum sampling (the manuals' nssample, not in GS-lite) -------------

    def nssample(self, cd, length, z) -> int:
        length, z = _u64(length), _u32(z)
        if length > z:
            return 1
        self.nss_count = _i32(self.nss_count + length)
        if self.nss_count > z:
            self.nss_count = _i32(self.nss_count - z)
            return 1
        return 0

    # ---- dispatch -----------------------------------------------------------------------

    def call(self, name: str, cd, args: Sequence) -> float:
        """Call the function named `name` with the hidden cd and its own arguments; a float."""
        nargs = FUNCTIONS.get(name)
        if nargs is None:
            raise KeyError(f"unknown stateful function {name!r} (functions: {', '.join(FUNCTIONS)})")
        if len(args) != nargs:
            raise TypeError(f"{name} takes {nargs} argument(s) after cd, got {len(args)}")
        return float(getattr(self, name)(cd, *args))
