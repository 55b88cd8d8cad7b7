"""``topk-fast``: exact top-k of |x| on CPU in two streaming passes plus work on ~k candidates.

Semantics: the k indices that a stable sort on ``(-|x_i|, i)`` puts first, i.e. the k
largest magnitudes with ties broken by the lowest index, returned as ``(values, indices)``
with ``indices`` in **ascending index order**, of dtype ``index_dtype(numel)``, and
``values = x[indices]`` (signed). ``exactk-threshold`` returns the same set (up to ties) in an
unspecified order; ascending index is the canonical order of merge.py. ``-0.0`` and ``0.0``
have equal magnitude (a tie, broken by index). NaN inputs are unspecified (the numba path
ranks NaN above +inf).

Algorithm (CPU, float32 / float16 / bfloat16, numba). For non-negative floats the IEEE bit
pattern is monotone in the value, so ``key_i = bits(x_i) & ~sign`` orders entries by |x_i|
with no float arithmetic and no parameters:

  1. Pass 1 (reads d): histogram, over 2**15 bins of the key's top 15 bits (a log-scale
     histogram: 8 exponent + 7 mantissa bits for fp32, the exact key for 16-bit types), of the
     maximum key of every group of 16 entries (of every entry when k > d/64; a group is one
     lane of a 1024-entry chunk, entries 64 apart, so the maxima vectorise). From the top,
     take the first bin ``b`` whose cumulative count reaches k and set ``T = b << shift``.
     At least k groups hold an entry with key >= T, so at least k entries have key >= T:
     the k-th largest key is >= T and every top-k entry is a candidate.
  2. Pass 2 (reads d): compact the candidates (key >= T) with their indices, in index order.
     The same group maxima are recomputed; only groups whose max reaches T are read again.
  3. On the c candidates (c ~ k for smooth data): radix select (two 16-bit digits) for the
     k-th largest key v and the number g of keys above v; keep every key > v and the first
     k - g keys == v in index order, which is exactly the stable-sort tie rule.

Cost: 2 streaming reads of x at about memory speed (measured 25M fp32, one thread: ~6 ms
each, ``x.sum()`` 5 ms) + O(c) + O(2**16) on the candidates, versus torch.topk's O(d log k)
heap. Degenerate inputs (all equal, mostly zeros) make c large but the cost stays linear
in d. Memory: candidate buffers of min(d, 16 h) entries (h = groups counted above T): ~k
for smooth data, d for an all-equal x.

Other dtypes (float64), non-CPU tensors and environments without numba use
:func:`torch_select`: the same index set and order from torch ops (kth value by
``torch.topk``, ties by a cumulative count).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gtopk_lab.compression.merge import index_dtype
from gtopk_lab.compression.checks import check_selection as _check, selection_result as _result

try:
    import numba
except ImportError:  # optional: the torch path has the same semantics
    numba = None

__all__ = ["fast_topk_select", "torch_select", "numba_select", "HAVE_NUMBA"]

HAVE_NUMBA: bool = numba is not None

#: Pass 1 bins the maximum key of groups of _GROUP entries: one histogram update per 16 reads.
_GROUP = 16
#: Stride between a group's members: group l of a chunk is ``base + j * _LANES + l``
#: (j < _GROUP), so the group maxima are a lane-wise max over 16 rows, which LLVM vectorises;
#: contiguous groups need a horizontal max per group, which it left scalar (3x slower).
_LANES = 64
_CHUNK = _GROUP * _LANES
#: Pass 1 histograms group maxima only while k groups are few of all groups; denser k would
#: make most groups hit and the candidate set a large superset.
_GROUP_MAX_DENSITY = 1.0 / 64.0
_NBINS = 1 << 15
_DIGIT = 16


def _jit(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    """``numba.njit(cache=True, nogil=True)``, without the cache where none can be written.

    numba raises at decoration when neither ``__pycache__`` next to this file nor a user
    cache directory is writable; compiling on every process start is then the only option.
    Without numba the plain Python function is returned (never called on the hot path).
    """
    if numba is None:
        return fn
    try:
        return numba.njit(cache=True, nogil=True, **options)(fn)
    except RuntimeError as exc:  # "cannot cache function ...: no locator available"
        warnings.warn(f"topk-fast: numba cache unavailable ({exc}); compiling without cache",
                      RuntimeWarning, stacklevel=2)
        return numba.njit(cache=False, nogil=True, **options)(fn)


def _group_max(u: np.ndarray, mask: Any, base: int, acc: np.ndarray) -> None:
    for lane in range(_LANES):
        acc[lane] = u[base + lane] & mask
    for j in range(1, _GROUP):
        off = base + j * _LANES
        for lane in range(_LANES):
            acc[lane] = max(acc[lane], u[off + lane] & mask)


# inlined in numba's IR: as a call it ran 2.5x slower (measured), presumably because LLVM then
# cannot prove acc and u disjoint and does not vectorise
_group_max = _jit(_group_max, inline="always")


@_jit
def _threshold(u: np.ndarray, mask: Any, shift: int, k: int, grouped: bool) -> tuple[int, int]:
    """Pass 1: (T, h) with h >= k groups (entries when not grouped) whose max key is >= T."""
    n = u.size
    hist = np.zeros(_NBINS, np.int64)
    nchunks = n // _CHUNK if grouped else 0
    acc = np.empty(_LANES, u.dtype)
    for c in range(nchunks):
        _group_max(u, mask, c * _CHUNK, acc)
        for lane in range(_LANES):
            hist[acc[lane] >> shift] += 1
    for i in range(nchunks * _CHUNK, n):  # the tail: groups of one
        hist[(u[i] & mask) >> shift] += 1
    above = 0
    b = _NBINS - 1
    while b > 0 and above + hist[b] < k:
        above += hist[b]
        b -= 1
    return b << shift, above + hist[b]


@_jit
def _compact(u: np.ndarray, mask: Any, thresh: Any, out_idx: np.ndarray, out_key: np.ndarray) -> int:
    """Pass 2: candidates with key >= thresh, in index order; returns their count."""
    n = u.size
    c = 0
    nchunks = n // _CHUNK
    acc = np.empty(_LANES, u.dtype)
    hit = np.empty(_LANES, np.int64)
    for ch in range(nchunks):
        base = ch * _CHUNK
        _group_max(u, mask, base, acc)
        nhit = 0
        for lane in range(_LANES):
            if acc[lane] >= thresh:
                hit[nhit] = lane
                nhit += 1
        # rows outer, hit lanes (ascending) inner: visits the chunk in index order while
        # reading only the ~1 group per chunk that can hold candidates
        for j in range(_GROUP if nhit else 0):
            off = base + j * _LANES
            for h in range(nhit):
                i = off + hit[h]
                v = u[i] & mask
                if v >= thresh:
                    out_idx[c] = i
                    out_key[c] = v
                    c += 1
    for i in range(nchunks * _CHUNK, n):
        v = u[i] & mask
        if v >= thresh:
            out_idx[c] = i
            out_key[c] = v
            c += 1
    return c


@_jit
def _finish(cand_idx: np.ndarray, cand_key: np.ndarray, c: int, k: int, out: np.ndarray) -> int:
    """Step 3: the k entries of the stable order among the c candidates, in index order."""
    hist = np.zeros(1 << _DIGIT, np.int64)
    low = (1 << _DIGIT) - 1
    for i in range(c):
        hist[cand_key[i] >> _DIGIT] += 1
    above = 0
    hi = low
    while hi > 0 and above + hist[hi] < k:
        above += hist[hi]
        hi -= 1
    hist[:] = 0
    for i in range(c):
        v = cand_key[i]
        if (v >> _DIGIT) == hi:
            hist[v & low] += 1
    lo = low
    while lo > 0 and above + hist[lo] < k:
        above += hist[lo]
        lo -= 1
    kth = (hi << _DIGIT) | lo
    ties = k - above  # entries equal to kth to keep: the lowest indices first
    j = 0
    for i in range(c):
        v = cand_key[i]
        if v > kth:
            out[j] = cand_idx[i]
            j += 1
        elif v == kth and ties > 0:
            out[j] = cand_idx[i]
            j += 1
            ties -= 1
    return j


def _key_view(x: torch.Tensor) -> tuple[np.ndarray, Any, int]:
    """(bit pattern as unsigned numpy array, mask of the magnitude bits, histogram shift)."""
    if x.dtype == torch.float32:
        return x.view(torch.int32).numpy().view(np.uint32), np.uint32(0x7FFFFFFF), 31 - 15
    # float16 and bfloat16 share the layout sign | exponent | mantissa in 16 bits
    return x.view(torch.int16).numpy().view(np.uint16), np.uint16(0x7FFF), 0


def numba_select(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The numba path (steps 1-3) for a CPU float32/float16/bfloat16 ``x``; needs numba."""
    _check(x, k)
    if numba is None:
        raise RuntimeError("numba_select needs numba; use fast_topk_select or torch_select")
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"numba_select: expected a CPU float32/float16/bfloat16 tensor, got "
                        f"{x.dtype} on {x.device}")
    d = x.numel()
    idx_np = np.int32 if index_dtype(d) == torch.int32 else np.int64
    if k == d:
        return _result(x, torch.arange(d))
    xc = x.detach().contiguous()
    u, mask, shift = _key_view(xc)
    grouped = k <= d * _GROUP_MAX_DENSITY
    thresh, hits = _threshold(u, mask, shift, k, grouped)
    cap = min(d, hits * _GROUP if grouped else hits)
    cand_idx = np.empty(cap, idx_np)
    cand_key = np.empty(cap, u.dtype)
    c = _compact(u, mask, u.dtype.type(thresh), cand_idx, cand_key)
    out = np.empty(k, idx_np)
    taken = _finish(cand_idx, cand_key, c, k, out)
    if c < k or taken != k:  # would be a bug in pass 1's bound, never silently short
        raise AssertionError(f"topk-fast: {c} candidates, {taken} taken for k={k}")
    return _result(x, torch.from_numpy(out))


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
    if (numba is not None and x.device.type == "cpu"
            and x.dtype in (torch.float32, torch.float16, torch.bfloat16)):
        return numba_select(x, k)
    return torch_select(x, k)
