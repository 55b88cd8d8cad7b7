"""Compiled (numba) CPU paths of the gTop-k merge and of the sort by index, same results.

:func:`gtopk_lab.compression.merge.merge_sparse` calls :func:`numba_merge` first when both
operands are CPU float32 tensors with int32 indices (the wire format's); the kernel
computes exactly what the vectorised torch path computes, or declines and the torch path
runs. Its result, bitwise:

- the union of the indices, ascending; at an index both operands hold, ``a + b`` (one
  fp32 addition, a's value first, as the torch path's ``index_add_``);
- kept: the ``min(k, |union|)`` entries of largest magnitude, ties at the k-th largest
  magnitude to the lower index; dropped: the rest of the union; each ascending by index.

Algorithm (n = |union| entries):
  1. one two-pointer merge of the two ascending operands into the union (values summed at
     shared indices), then a check that the union is strictly ascending (it is exactly when
     each operand is: unique indices in canonical order);
  2. the magnitudes' IEEE bits without the sign as keys (NaN is a key above +inf's: the
     largest key declines a NaN sum); if n > k: t = the k-th largest key and g = the count
     above t, by a radix select: from n >= 8192 (:data:`_WIDE_MIN`) in two digits, 16 + 15
     bits, the first histogrammed in the same pass that makes the keys; below it in 11-bit
     digits just below the bits all candidates share (their own range, not the fixed top
     bits), sorting the last <= 512 candidates. The candidates in the bin of the k-th
     largest are copied out without a branch: top-k operands crowd a narrow band of
     magnitudes (most of 50k keys from a 25M gradient at density 0.001 share the top 11
     bits), and a branch on "in the bin" mispredicted on every other key (numba's
     ``np.partition`` took 1.8 ms at 50k entries, numpy's 0.27 ms);
  3. one pass over the union in index order writes every entry with |v| > t, and the first
     k - g entries with |v| == t, to kept, the others to dropped.
It declines (returns None) when an operand is not strictly ascending or a sum is NaN
(the torch path defines those cases), so callers always get the torch path's result.

Cost: O(n) reads and writes in four passes plus the bins of the select, no sort and no
Python loop. One thread, two ranks' top-k selections in the wire format
(``benchmarks/merge_kernel_ab.py``): 2 x 1k pairs 0.033 ms, 2 x 25k pairs 0.90 ms (1.0 ms
after a 30 ms sleep), 1.46x faster than the three-digit select with a branch
(``merge_sparse``'s torch path: 2.4-2.7 ms).

:func:`numba_sort_by_index` is the once-per-call sort of a local selection by index
(``merge.sort_by_index``): a stable LSD radix sort with as few <= 13-bit digits as the
largest index needs (2 passes below 2**26, the first digit counted while it checks the
input), returning the input when it is already ascending; 25k pairs of a 25M vector
0.29 ms against 1.08 ms (two numpy 16-bit radix passes).

The first call compiles (seconds; cached on disk by
numba afterwards). Without numba (:data:`HAVE_NUMBA` False), or with
``GTOPK_LAB_FAST_MERGE=0``, nothing here runs and the torch paths compute the same.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gtopk_lab.compression.radix_sort_kernel import radix_sort_kernel

__all__ = ["HAVE_NUMBA", "FAST_MERGE_ENV", "enabled", "numba_merge", "merge_applies", "numba_sort_by_index",
           "numba_wire_sort", "warm_up", "compiled_kernel", "index_bits", "numpy_view"]

#: numba is installed (optional: the torch paths compute the same). It is imported, and
#: the kernels compiled, on the first merge (importing numba costs ~0.5 s; merge.py is
#: imported by every collective)
HAVE_NUMBA: bool = importlib.util.find_spec("numba") is not None

#: ``GTOPK_LAB_FAST_MERGE=0`` turns the compiled paths off (read per call, so a benchmark can
#: time both paths side by side in one process tree): merges then take the torch path
FAST_MERGE_ENV = "GTOPK_LAB_FAST_MERGE"


def enabled() -> bool:
    """numba is importable and ``$GTOPK_LAB_FAST_MERGE`` is not "0" (one dict lookup)."""
    return HAVE_NUMBA and os.environ.get(FAST_MERGE_ENV, "1") != "0"


def _jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``numba.njit(cache=True, nogil=True)``; no disk cache where none can be written."""
    import numba

    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError as exc:  # "cannot cache function ...: no locator available"
        warnings.warn(f"fast_merge: numba cache unavailable ({exc}); compiling without cache",
                      RuntimeWarning, stacklevel=2)
        return numba.njit(cache=False, nogil=True)(fn)


def _bin_of_kth(hist: np.ndarray, top_bin: int, k: int) -> tuple[int, int]:
    """(b, r): the bin that holds the k-th largest key, scanning ``hist`` down from
    ``top_bin``, and that key's rank from the top among the keys of bin b."""
    above = 0
    b = top_bin
    while above + hist[b] < k:
        above += hist[b]
        b -= 1
    return b, k - above


def _copy_bin(keys: np.ndarray, size: int, shift: int, b: int) -> tuple[np.ndarray, int]:
    """The ``size`` keys with ``key >> shift == b``, copied out without a branch (every
    key is written, the cursor advances on a match: the test is random on crowded
    magnitudes, and a branch on it mispredicted on every other key)."""
    cand = np.empty(size + 1, dtype=np.uint32)
    c = 0
    bin_b = np.uint32(b)
    for j in range(keys.size):
        key = keys[j]
        cand[c] = key
        c += (key >> shift) == bin_b
    return cand, c


def _kth_largest_key(keys: np.ndarray, k: int, top_key: int, low_key: int) -> tuple[int, int]:
    """(t, r): t = the k-th largest of the 31-bit ``keys`` (1 <= k <= n), r = how many of
    the k largest equal t, for small inputs (below :data:`_WIDE_MIN` entries), every key in
    ``[low_key, top_key]``. Radix select whose digit is the 11 bits just below those all
    candidates share, so that 2048 bins span the candidates' own range (top-k operands crowd
    one or two exponents: a fixed top-11-bit digit put 1,079 of 1,999 keys in one bin), most
    significant first: count, find the bin of the k-th largest scanning down from the top
    key's, copy that bin out, and go on in its range; at most :data:`_SORT_MAX` candidates
    are sorted instead. Cost: 2 reads of n keys, then the same for each (far smaller) bin,
    and the bins between the top key's and the k-th largest's; exact, integer only."""
    hist = np.zeros(2048, dtype=np.int32)
    cand, c = keys, keys.size
    top, low = np.int64(top_key), np.int64(low_key)
    while True:
        if c <= _SORT_MAX:
            ordered = np.sort(cand[:c])
            t = ordered[c - k]
            need = k
            for j in range(c - k + 1, c):  # those of the k largest above t
                need -= ordered[j] > t
            return t, need
        span = 0
        while (top ^ low) >> span:
            span += 1
        if span == 0:  # every candidate is the same key
            return top, k
        shift = max(span - 11, 0)
        hist[:] = 0
        for j in range(c):
            hist[(np.int64(cand[j]) >> shift) & 2047] += 1
        b, k = _bin_of_kth(hist, (top >> shift) & 2047, k)
        prefix = ((top >> shift) & ~np.int64(2047)) | b
        cand, c = _copy_bin(cand[:c], hist[b], shift, prefix)
        if shift == 0:
            return prefix, k
        low = prefix << shift
        top = low | ((np.int64(1) << shift) - 1)


def _low_digits(cand: np.ndarray, c: int, prefix: int, need: int, hist: np.ndarray) -> tuple[int, int]:
    """The last two digits (10 + 10 bits) of a select whose first digit is a 31-bit key's top
    11 bits (:mod:`gtopk_lab.compression.fast_topk_rows`' crowded bins): (t, r) for
    the ``need``-th largest of the c keys ``cand[:c]``, all of whose top 11 bits are
    ``prefix``; ``hist`` is scratch of at least 1024 counters. Cost: 2 reads of c keys and
    2 scans of 1024 bins."""
    for shift in (10, 0):
        hist[:1024] = 0
        high = np.uint32(prefix)
        for j in range(c):
            key = cand[j]
            hist[(key >> shift) & 1023] += (key >> (shift + 10)) == high
        b, need = _bin_of_kth(hist, 1023, need)
        prefix = (prefix << 10) | b
    return prefix, need


#: a select's candidates are sorted from this many down (a 2048-bin pass costs more)
_SORT_MAX = 512

#: from this many union entries on, the merge histograms the magnitudes' top 16 bits while
#: it merges (65536 counters: their zeroing costs what ~8k entries do) and selects in two
#: digits (16 + 15 bits), instead of :func:`_kth_largest_key`'s passes afterwards
_WIDE_MIN = 8192


def _kth_largest_wide(keys: np.ndarray, hist: np.ndarray, top_key: int, k: int) -> tuple[int, int]:
    """:func:`_kth_largest_key` from ``hist``, the counts of ``keys >> 15`` (the merge made
    it), and ``top_key``, the largest key: the bin of the k-th largest, found scanning down
    from the top key's bin; one pass copies that bin's keys out; their low 15 bits are
    counted (32768 bins) and scanned. Cost: 1 read of n keys, O(bin size), and the bins
    between the top key and the k-th largest."""
    b, need = _bin_of_kth(hist, np.int64(top_key) >> 15, k)
    cand, c = _copy_bin(keys, hist[b], 15, b)
    low = np.zeros(32768, dtype=np.int32)
    for j in range(c):
        low[cand[j] & 32767] += 1
    d, rank = _bin_of_kth(low, 32767, need)
    return (b << 15) | d, rank


def _merge_kernel(va: np.ndarray, ia: np.ndarray, vb: np.ndarray, ib: np.ndarray, k: int) -> tuple:
    """Steps 1-3 of the module docstring; ``ok`` False = declined (outputs then empty)."""
    na, nb = ia.size, ib.size
    uv = np.empty(na + nb, dtype=va.dtype)
    ui = np.empty(na + nb, dtype=ia.dtype)
    empty_v, empty_i = uv[:0], ui[:0]
    p = q = n = 0
    # branch-free steps (selects, not jumps): which operand comes next is random
    while p < na and q < nb:
        x, y = ia[p], ib[q]
        take_a, take_b = x <= y, y <= x
        both = va[p] + vb[q]
        single = va[p] if take_a else vb[q]
        uv[n] = both if take_a and take_b else single
        ui[n] = x if take_a else y
        p += take_a
        q += take_b
        n += 1
    while p < na:
        uv[n], ui[n] = va[p], ia[p]
        p += 1
        n += 1
    while q < nb:
        uv[n], ui[n] = vb[q], ib[q]
        q += 1
        n += 1
    # each operand's entries come out in their own order, so the union is strictly ascending
    # exactly when both operands are: one check of it declines a non-canonical operand
    for j in range(1, n):
        if ui[j] <= ui[j - 1]:
            return False, empty_v, empty_i, empty_v, empty_i
    # |v| as its IEEE bits without the sign: monotone in |v| for non-NaN floats, -0.0 == 0.0;
    # NaN is exactly a key above +inf's, so the largest key tells whether a sum is NaN
    sign_off = np.uint32(0x7FFFFFFF)
    wide = n >= _WIDE_MIN and n > k
    hist = np.zeros(65536 if wide else 1, dtype=np.int32)
    if wide:  # one pass: keys, their largest, and the counts of their top 16 bits
        bits = uv.view(np.uint32)
        mag = np.empty(n, dtype=np.uint32)
        top_key = np.uint32(0)
        for j in range(n):
            m = bits[j] & sign_off
            mag[j] = m
            top_key = max(top_key, m)
            hist[np.int64(m) >> 15] += 1
    else:  # vectorised
        mag = uv[:n].view(np.uint32) & sign_off
        top_key = mag.max() if n > 0 else np.uint32(0)
        low_key = mag.min() if n > 0 else np.uint32(0)
    if top_key > np.uint32(0x7F800000):
        return False, empty_v, empty_i, empty_v, empty_i
    if n <= k:
        return True, uv[:n].copy(), ui[:n].copy(), empty_v, empty_i
    if wide:
        t, ties = _kth_largest_wide(mag[:n], hist, top_key, k)
    else:
        t, ties = _kth_largest_key(mag[:n], k, top_key, low_key)
    # one slot more each: both outputs are written every step and one cursor advances,
    # so the loop has no branch on the (random) keep decision
    kv = np.empty(k + 1, dtype=uv.dtype)
    ki = np.empty(k + 1, dtype=ui.dtype)
    dv = np.empty(n - k + 1, dtype=uv.dtype)
    di = np.empty(n - k + 1, dtype=ui.dtype)
    a = d = 0
    for j in range(n):
        m = mag[j]
        tie = m == t and ties > 0
        keep = m > t or tie
        ties -= tie
        kv[a], ki[a], dv[d], di[d] = uv[j], ui[j], uv[j], ui[j]
        a += keep
        d += not keep
    kv, ki, dv, di = kv[:k], ki[:k], dv[: n - k], di[: n - k]
    return True, kv, ki, dv, di



_KERNELS: dict[str, Callable[..., Any]] = {}


def compiled_kernel(name: str) -> Callable[..., Any]:
    """The jitted kernel ``name`` ("merge" | "sort"), made on first use. The merge kernel
    calls the select kernels, and they their helpers, through this module's globals, which
    must be jitted first."""
    if not _KERNELS:
        global _bin_of_kth, _copy_bin, _low_digits, _kth_largest_key, _kth_largest_wide
        _bin_of_kth, _copy_bin = _jit(_bin_of_kth), _jit(_copy_bin)
        _low_digits = _jit(_low_digits)
        _kth_largest_key = _jit(_kth_largest_key)
        _kth_largest_wide = _jit(_kth_largest_wide)
        _KERNELS.update(merge=_jit(_merge_kernel), sort=_jit(radix_sort_kernel))
    return _KERNELS[name]


def warm_up() -> None:
    """Compile (or load from numba's disk cache) every kernel now, on tiny inputs: a test
    session or a benchmark does this once, before ranks that would each compile at once."""
    if HAVE_NUMBA:
        v, i = np.ones(3, dtype=np.float32), np.arange(3, dtype=np.int32)
        compiled_kernel("merge")(v, i, v, i, 2)
        compiled_kernel("sort")(v, i[::-1].copy(), 0)
        compiled_kernel("sort")(v, i[::-1].astype(np.int64), 0)


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """``t``'s memory as a numpy array: a view when it is contiguous and needs no grad (a
    detach or contiguous that does nothing still costs a dispatch, on every merge)."""
    if t.requires_grad or not t.is_contiguous():
        t = t.detach().contiguous()
    return t.numpy()


def merge_applies(v_a: torch.Tensor, i_a: torch.Tensor, v_b: torch.Tensor, i_b: torch.Tensor) -> bool:
    """Whether :func:`numba_merge` may take this merge: :func:`enabled`, CPU float32 values,
    int32 indices (the wire dtype below 2**31 elements; one specialisation to compile, int64
    takes the torch path) (O(1) checks)."""
    return (enabled() and v_a.device.type == "cpu" and v_b.device.type == "cpu"
            and v_a.dtype == torch.float32 and v_b.dtype == torch.float32
            and i_a.dtype == torch.int32 and i_b.dtype == torch.int32
            and i_a.device.type == "cpu" and i_b.device.type == "cpu")


def numba_merge(v_a: torch.Tensor, i_a: torch.Tensor, v_b: torch.Tensor, i_b: torch.Tensor, k: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``merge_sparse``'s result (kept values, indices, dropped values, indices) from the
    compiled kernel, or None when it declines (an operand not strictly ascending, a NaN
    sum). Callers check :func:`merge_applies` first."""
    ok, kv, ki, dv, di = compiled_kernel("merge")(numpy_view(v_a), numpy_view(i_a), numpy_view(v_b), numpy_view(i_b), k)
    if not ok:
        return None
    return torch.from_numpy(kv), torch.from_numpy(ki), torch.from_numpy(dv), torch.from_numpy(di)


def index_bits(numel: int) -> int:
    """The sort kernel's ``bits_hint`` for indices into a vector of ``numel`` elements."""
    return max(int(numel) - 1, 1).bit_length()


def _sort(values: torch.Tensor, indices: torch.Tensor, index_dtypes: tuple[torch.dtype, ...],
          bits_hint: int = 0) -> tuple[int, int, bool, np.ndarray, np.ndarray] | None:
    """:func:`~gtopk_lab.compression.radix_sort_kernel.radix_sort_kernel` on CPU float32 values
    and ``index_dtypes`` indices, or None where it does not apply (not :func:`enabled`, other
    devices or dtypes, no entries)."""
    if not (enabled() and values.device.type == "cpu" and indices.device.type == "cpu"
            and values.dtype == torch.float32 and indices.dtype in index_dtypes
            and indices.numel() > 0):
        return None
    lo, hi, ascending, v, i = compiled_kernel("sort")(numpy_view(values), numpy_view(indices), bits_hint)
    return int(lo), int(hi), bool(ascending), v, i


def numba_sort_by_index(values: torch.Tensor, indices: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(values, indices) stably sorted by index by the compiled radix sort (the same
    tensors when already strictly ascending, fresh ones otherwise), or None where it does
    not apply (not :func:`enabled`, not CPU float32 values with non-negative int32
    indices). Any stable sort gives this one result. Cost: one scan, then ceil(bits / 13)
    counting passes, the first digit counted during the scan, O(n)."""
    done = _sort(values, indices, (torch.int32,))
    if done is None or done[0] < 0:
        return None
    _lo, _hi, ascending, v, i = done
    return (values, indices) if ascending else (torch.from_numpy(v), torch.from_numpy(i))


def numba_wire_sort(values: torch.Tensor, indices: torch.Tensor, numel: int = 0
                    ) -> tuple[int, int, torch.Tensor, torch.Tensor] | None:
    """``(lo, hi, values, int32 indices)``: a selection sorted by index in the wire format,
    with its smallest and largest index for the caller's range check (the result is
    meaningful only when ``0 <= lo`` and ``hi < 2**31``), in one compiled call; None where
    it does not apply (not :func:`enabled`, not CPU float32 values with int32 or int64
    indices). Replaces a range check, a dtype conversion and :func:`numba_sort_by_index`:
    three passes' worth of torch calls, each of which costs 0.1-0.25 ms on a core that
    has just waited (a rank between collectives). ``numel`` (the vector's length, when
    known) lets the kernel size its digits to the valid indices' bits."""
    done = _sort(values, indices, (torch.int32, torch.int64), index_bits(numel) if numel > 0 else 0)
    if done is None:
        return None
    lo, hi, ascending, v, i = done
    if lo < 0 or hi > 2**31 - 1:
        return lo, hi, values, indices
    if ascending:
        return lo, hi, values.contiguous(), indices.to(torch.int32).contiguous()
    return lo, hi, torch.from_numpy(v), torch.from_numpy(i)
