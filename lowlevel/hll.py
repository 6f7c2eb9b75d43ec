"""COUNT_DISTINCT's mergeable sketch: a 64-bit hash and HyperLogLog registers, bit-exact by definition.

Shared by the reference evaluator and (re-implemented in Numba with the same formulas) the low
level, so a split run and a direct run give the same registers and the same estimate:

- hash64(v): `splitmix64` of the value's 64 bits (uint64 as is, int64 and float64 by their bit
  pattern, bool as 0/1); an `ip` value (hi, lo) hashes as `splitmix64(hi ^ splitmix64(lo))`;
- with m = 2**p registers: register index = h >> (64 - p); rank = leading zeros of (h << p) + 1,
  capped at 64 - p + 1; each register keeps the maximum rank (merge = register-wise max);
- estimate: alpha_m * m^2 / sum(2^-reg), with linear counting m*ln(m/V) when that raw
  estimate is <= 2.5 m and V registers are zero; rounded to the nearest integer.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def as_bits(values) -> np.ndarray:
    """The 64 bits a value hashes by (see the module docstring)."""
    if isinstance(values, tuple):
        hi, lo = values
        return np.asarray(hi, np.uint64) ^ splitmix64(lo)
    v = np.asarray(values)
    if v.dtype == np.bool_:
        return v.astype(np.uint64)
    if v.dtype == np.float64:
        v = np.where(v == 0.0, 0.0, v)  # -0.0 and 0.0 are one value
        return v.view(np.uint64)
    if v.dtype == np.int64:
        return v.view(np.uint64)
    if v.dtype == object:
        raise TypeError("COUNT_DISTINCT over strings is not supported")
    return v.astype(np.uint64)


def hash64(values) -> np.ndarray:
    return splitmix64(as_bits(values))


def leading_zeros(w: np.ndarray) -> np.ndarray:
    """Leading zero bits of each uint64 (64 for 0), exactly (binary search, no float)."""
    w = np.asarray(w, np.uint64).copy()
    n = np.zeros(w.shape, np.int64)
    for bits in (32, 16, 8, 4, 2, 1):
        top_zero = (w >> np.uint64(64 - bits)) == 0
        n += np.where(top_zero, bits, 0)
        w = np.where(top_zero, w << np.uint64(bits), w)
    return n + (w == 0)


def index_and_rank(h: np.ndarray, registers: int) -> tuple[np.ndarray, np.ndarray]:
    p = int(registers).bit_length() - 1
    if 1 << p != registers or p < 4:
        raise ValueError(f"HLL registers must be a power of two >= 16, not {registers}")
    idx = (h >> np.uint64(64 - p)).astype(np.int64)
    rank = np.minimum(leading_zeros(h << np.uint64(p)) + 1, 64 - p + 1).astype(np.uint8)
    return idx, rank


def registers_of(values, groups: np.ndarray, ngroups: int, registers: int = 64) -> np.ndarray:
    """Registers (ngroups x registers, uint8) of `values` whose group codes are `groups`."""
    regs = np.zeros((ngroups, registers), np.uint8)
    if len(groups):
        idx, rank = index_and_rank(hash64(values), registers)
        np.maximum.at(regs, (np.asarray(groups, np.int64), idx), rank)
    return regs


def hll_alpha(m: int) -> float:
    """The HyperLogLog bias constant for m registers."""
    return {16: 0.673, 32: 0.697, 64: 0.709}.get(m, 0.7213 / (1 + 1.079 / m))


def estimate(regs: np.ndarray) -> np.ndarray:
    """HLL estimates (uint64) of a (rows x m) register array."""
    regs = np.asarray(regs)
    if regs.ndim == 1:
        regs = regs[None, :]
    m = regs.shape[1]
    raw = hll_alpha(m) * m * m / np.sum(np.ldexp(1.0, -regs.astype(np.int64)), axis=1)
    zeros = np.sum(regs == 0, axis=1)
    with np.errstate(divide="ignore"):
        linear = m * np.log(m / np.maximum(zeros, 1))
    est = np.where((raw <= 2.5 * m) & (zeros > 0), linear, raw)
    return np.rint(est).astype(np.uint64)
