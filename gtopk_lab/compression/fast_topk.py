"""``topk-fast``: exact top-k of |x| on CPU in one streaming read after a small sample.

Semantics: the k indices that a stable sort on ``(-|x_i|, i)`` puts first, i.e. the k
largest magnitudes with ties broken by the lowest index, returned as ``(values, indices)``
with ``indices`` in **ascending index order**, of dtype ``index_dtype(numel)``, and
``values = x[indices]`` (signed). ``exactk-threshold`` returns the same set (up to ties) in an
unspecified order; ascending index is the canonical order of merge.py. ``-0.0`` and ``0.0``
have equal magnitude (a tie, broken by index). NaN inputs are unspecified (the numba path
ranks NaN above +inf).

Algorithm (CPU, float32 / float16 / bfloat16, numba; kernels in
:mod:`gtopk_lab.compression.fast_topk_kernels`). For non-negative floats the IEEE bit
pattern is monotone in the value, so ``key_i = bits(x_i) & ~sign`` orders entries by |x_i|
with no float arithmetic and no parameters:

  1. Sample (reads ~256 d / k entries, at most d / 16): bin counts (2**15 bins: the key's
     top 15 bits, 8 exponent + 7 mantissa bits for fp32, the exact key for 16-bit types) of
     evenly spread blocks of 256 entries, a fraction f of x, and of the blocks' maxima. From
     the top, take the first bin whose count reaches ``m = f k + 4 sqrt(f k) + 8``, a block
     counting for at most 4x its share (so that one block inside a small layer of large
     entries cannot set T alone), and set T to its lower edge: about
     k + 4 sqrt(k / f) + 8 / f entries of x have key >= T (~1.3 k for N(0,1)).
  2. One read of x (:func:`~.fast_topk_kernels.compact`): the candidates (key >= T) with
     their indices, in index order, through the maxima of groups of 16 entries (only groups
     whose max reaches T are read again, from L1). Should the buffer (~2x the expected
     count, at most 8 k + 2**16) fill, the k first of the stable order are kept and T rises
     past their smallest key: a sample that set T too low (an all-equal x, large entries
     the sample missed) costs time, never memory or exactness.
  3. Fewer than k candidates (T too high; never seen on the test inputs, a 4-sigma event
     for i.i.d. data): the exact pass of the two-pass algorithm, bin counts of the group
     maxima of all of x, gives a T with at least k groups (so entries) at or above it, and
     step 2 runs again.
  4. On the c candidates: radix select (two 16-bit digits) for the k-th largest key v and
     the number g of keys above v; keep every key > v and the first k - g keys == v in
     index order, which is exactly the stable-sort tie rule; gather their values' bits.

Cost: one streaming read of x (25M fp32, one thread, this box: ~1.15 ``x.sum()``) + the
sample (~0.05 of a read) + O(c) + O(2**16): about 1.7 reads in all (benchmarks/RESULTS.md),
versus torch.topk's O(d log k) heap and the two-pass algorithm's 2.5-3.6. Inputs under
``_SAMPLE_MIN_NUMEL`` entries (in cache, where fixed costs dominate) take the exact pass
for step 1 instead.

Other dtypes (float64), non-CPU tensors and environments without numba use
:func:`torch_select`: the same index set and order from torch ops (kth value by
``torch.topk``, ties by a cumulative count).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gtopk_lab.compression import fast_topk_kernels as kern
from gtopk_lab.compression.checks import check_selection as _check, selection_result as _result
from gtopk_lab.compression.fast_topk_kernels import HAVE_NUMBA
from gtopk_lab.compression.merge import index_dtype

__all__ = ["fast_topk_select", "torch_select", "numba_select", "HAVE_NUMBA"]

#: The exact pass histograms group maxima only while k groups are few of all groups; denser
#: k would make most groups hit and the candidate set a large superset.
_GROUP_MAX_DENSITY = 1.0 / 64.0
#: Step 1 aims at this many top-k entries in the sample (relative error ~1/sqrt of it)...
_SAMPLE_HITS = 256
#: ...in blocks of this many entries (1 KiB of fp32: whole cache lines, small enough that
#: one block cannot dominate the count)...
_SAMPLE_BLOCK = 256
#: ...reading at most this fraction of x (k small against d).
_SAMPLE_MAX_FRACTION = 1.0 / 16.0
#: Below this size (2 MiB of fp32, in cache) fixed costs dominate and the exact pass is as
#: fast (measured: equal at 500k, the sample 8% faster at 1M, 12% at 2M).
_SAMPLE_MIN_NUMEL = 1 << 19
#: standard deviations of the sample count between the aim and the threshold's count
_SAMPLE_SIGMAS = 4.0
#: a block counts for at most this many times its expected share of the aim (+ 1/2)
_SAMPLE_SPREAD = 4.0


def _key_view(x: torch.Tensor) -> tuple[np.ndarray, Any, int]:
    """(bit pattern as unsigned numpy array, mask of the magnitude bits, histogram shift)."""
    if x.dtype == torch.float32:
        return x.view(torch.int32).numpy().view(np.uint32), np.uint32(0x7FFFFFFF), 31 - 15
    # float16 and bfloat16 share the layout sign | exponent | mantissa in 16 bits
    return x.view(torch.int16).numpy().view(np.uint16), np.uint16(0x7FFF), 0


def _sampled_threshold(u: np.ndarray, mask: object, shift: int, k: int) -> tuple[int, int]:
    """Step 1: (T, expected number of entries with key >= T)."""
    d = u.size
    fraction = min(_SAMPLE_MAX_FRACTION, _SAMPLE_HITS / k)
    nblocks = max(1, round(d * fraction / _SAMPLE_BLOCK))
    fraction = nblocks * _SAMPLE_BLOCK / d
    aim = fraction * k
    per_block = _SAMPLE_SPREAD * (aim / nblocks + 0.5)
    aim += _SAMPLE_SIGMAS * math.sqrt(aim) + 8.0
    hist, hist_max = kern.sample_histogram(u, mask, shift, _SAMPLE_BLOCK, nblocks)
    b, counted = kern.top_bin_spread(hist, hist_max, aim, per_block)
    return b << shift, int(counted / fraction)


def _candidates(u: np.ndarray, mask: object, shift: int, k: int,
                idx_np: type) -> tuple[np.ndarray, np.ndarray, int]:
    """Steps 1-3: candidate indices and keys (a superset of the top k, in index order) and their count."""
    d = u.size
    grouped = k <= d * _GROUP_MAX_DENSITY
    if d >= _SAMPLE_MIN_NUMEL:
        thresh, expected = _sampled_threshold(u, mask, shift, k)
        cap = min(d, 2 * min(max(expected, k), 4 * k) + (1 << 16)) + 2 * kern.CHUNK
        cand_idx, cand_key = np.empty(cap, idx_np), np.empty(cap, u.dtype)
        c, _ = kern.compact(u, mask, thresh, k, cand_idx, cand_key)
        if c >= k:
            return cand_idx, cand_key, c
    thresh, hits = kern.histogram_maxima(u, mask, shift, k, grouped)
    cap = min(d, hits * kern.GROUP if grouped else hits) + 2 * kern.CHUNK
    cand_idx, cand_key = np.empty(cap, idx_np), np.empty(cap, u.dtype)
    c, _ = kern.compact(u, mask, thresh, k, cand_idx, cand_key)
    return cand_idx, cand_key, c


def numba_select(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The numba path (steps 1-4) for a CPU float32/float16/bfloat16 ``x``; needs numba."""
    _check(x, k)
    if not HAVE_NUMBA:
        raise RuntimeError("numba_select needs numba; use fast_topk_select or torch_select")
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"numba_select: expected a CPU float32/float16/bfloat16 tensor, got "
                        f"{x.dtype} on {x.device}")
    d = x.numel()
    idx_np = np.int32 if index_dtype(d) == torch.int32 else np.int64
    if k == d:
        return _result(x, torch.arange(d))
    u, mask, shift = _key_view(x.detach().contiguous())
    cand_idx, cand_key, c = _candidates(u, mask, shift, k, idx_np)
    out, out_key = np.empty(k, idx_np), np.empty(k, u.dtype)
    taken, _ = kern.keep_first(cand_idx, cand_key, c, k, out, out_key)
    if c < k or taken != k:  # would be a bug in the threshold's bound, never silently short
        raise AssertionError(f"topk-fast: {c} candidates, {taken} taken for k={k}")
    idx = torch.from_numpy(out)
    if x.requires_grad:  # values that carry the autograd graph, as x[idx] does
        return _result(x, idx)
    bits = np.empty(k, u.dtype)
    kern.gather(u, out, bits)  # x[idx] through torch costs ~0.08 of a read pass at k = 25k
    signed = np.int32 if u.dtype == np.uint32 else np.int16
    return torch.from_numpy(bits.view(signed)).view(x.dtype), idx


def torch_select(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch-only path with the same semantics (any floating dtype and device).

    The k-th largest |x| v comes from ``torch.topk``; the result keeps every |x| > v and the
    first k - #(|x| > v) entries with |x| == v in index order. Cost: torch.topk plus ~4 O(d)
    elementwise passes.
    """
    _check(x, k)
    d = x.numel()
    if k == d:
        return _result(x, torch.arange(d, device=x.device))
    a = x.detach().abs()
    kth = torch.topk(a, k, sorted=False).values.min()
    greater = a > kth
    eq = a == kth
    ties = k - int(torch.count_nonzero(greater))
    keep = greater | (eq & (torch.cumsum(eq, 0) <= ties))
    return _result(x, torch.nonzero(keep).flatten())


def fast_topk_select(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k, stable on (-|x|, index), ascending indices (see the module docstring).

    numba path for CPU float32/float16/bfloat16 when numba imports, else :func:`torch_select`.
    """
    _check(x, k)
    if (HAVE_NUMBA and x.device.type == "cpu"
            and x.dtype in (torch.float32, torch.float16, torch.bfloat16)):
        return numba_select(x, k)
    return torch_select(x, k)
