"""The numba kernels of ``topk-fast`` (:mod:`gtopk_lab.compression.fast_topk`).

Every kernel works on magnitude keys: the IEEE bit pattern of ``x`` as unsigned integers
(``u``) with the sign bit masked off (``u & mask``), which orders entries by ``|x|`` with no
float arithmetic (NaN above +inf). ``shift`` turns a key into one of ``NBINS`` histogram
bins (its top 15 bits). Indices grow in every loop, so candidate lists come out in index
order, which the tie rule needs.

- :func:`sample_histogram` — bin counts of ``nblocks`` evenly spaced blocks of the input
  and of the blocks' maxima; :func:`top_bin_spread` picks a threshold bin from them.
- :func:`histogram_maxima` — the exact threshold pass: bin counts of group maxima over
  the whole input.
- :func:`compact` — the candidates (key >= a threshold) with their indices, in one read of
  the input; when its buffer fills it keeps the k first of the stable order and raises the
  threshold, so a threshold that was too low costs time, never memory or exactness.
- :func:`keep_first` — the k first entries of the stable order among candidates (radix
  select, two 16-bit digits), in index order; :func:`gather` their values' bits.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    import numba
except ImportError:  # optional: fast_topk then takes its torch path
    numba = None

__all__ = ["HAVE_NUMBA", "GROUP", "CHUNK", "NBINS", "sample_histogram", "top_bin", "top_bin_spread",
           "histogram_maxima", "compact", "keep_first", "gather", "jit"]

HAVE_NUMBA: bool = numba is not None

#: Group maxima cover GROUP entries each: one histogram update or hit test per 16 reads.
GROUP = 16
#: Stride between a group's members: group l of a chunk is ``base + j * LANES + l``
#: (j < GROUP), so the group maxima are a lane-wise max over 16 rows, which LLVM vectorises;
#: contiguous groups need a horizontal max per group, which it left scalar (3x slower).
LANES = 64
CHUNK = GROUP * LANES
NBINS = 1 << 15
_DIGIT = 16


def jit(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
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
    for lane in range(LANES):
        acc[lane] = u[base + lane] & mask
    for j in range(1, GROUP):
        off = base + j * LANES
        for lane in range(LANES):
            acc[lane] = max(acc[lane], u[off + lane] & mask)


# inlined in numba's IR: as a call it ran 2.5x slower (measured), presumably because LLVM then
# cannot prove acc and u disjoint and does not vectorise
_group_max = jit(_group_max, inline="always")


@jit
def sample_histogram(u: np.ndarray, mask: Any, shift: int, block: int,
                     nblocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Bin counts of the keys of ``nblocks`` blocks of ``block`` entries spread evenly over
    ``u`` (first and last block at its ends; starts aligned to 32 entries, 128 bytes), and
    bin counts of the blocks' maximum keys."""
    hist = np.zeros(NBINS, np.int64)
    hist_max = np.zeros(NBINS, np.int64)
    span = u.size - block
    for s in range(nblocks):
        base = (s * span // max(nblocks - 1, 1)) & ~31
        top = np.int64(0)
        for i in range(base, base + block):
            b = np.int64((u[i] & mask) >> shift)
            hist[b] += 1
            top = max(top, b)
        hist_max[top] += 1
    return hist, hist_max


@jit
def top_bin(hist: np.ndarray, count: float) -> tuple[int, int]:
    """(b, n): the highest bin b whose count from the top, n, reaches ``count`` (bin 0 and
    the whole count when none does)."""
    above = 0
    b = NBINS - 1
    while b > 0 and above + hist[b] < count:
        above += hist[b]
        b -= 1
    return b, above + hist[b]


@jit
def top_bin_spread(hist: np.ndarray, hist_max: np.ndarray, count: float,
                   per_block: float) -> tuple[int, int]:
    """(b, n) as :func:`top_bin`, counting at most ``per_block`` entries for each block:
    the highest bin b where min(n, per_block * blocks with their max in or above b)
    reaches ``count``, so that no few blocks full of large entries (a small layer of large
    gradients that one sample block fell into) set the threshold alone."""
    above = 0
    blocks = 0
    b = NBINS - 1
    while b > 0 and min(above + hist[b], per_block * (blocks + hist_max[b])) < count:
        above += hist[b]
        blocks += hist_max[b]
        b -= 1
    return b, above + hist[b]


@jit
def histogram_maxima(u: np.ndarray, mask: Any, shift: int, k: int, grouped: bool) -> tuple[int, int]:
    """The exact pass: (T, h) with h >= k groups (entries when not grouped) whose max key
    is >= T, from the bin counts of the group maxima of all of ``u``. Then at least k
    entries have key >= T: every top-k entry is a candidate for T."""
    n = u.size
    hist = np.zeros(NBINS, np.int64)
    nchunks = n // CHUNK if grouped else 0
    acc = np.empty(LANES, u.dtype)
    for c in range(nchunks):
        _group_max(u, mask, c * CHUNK, acc)
        for lane in range(LANES):
            hist[acc[lane] >> shift] += 1
    for i in range(nchunks * CHUNK, n):  # the tail: groups of one
        hist[(u[i] & mask) >> shift] += 1
    b, hits = top_bin(hist, k)
    return b << shift, hits


@jit
def _kth_key(key: np.ndarray, c: int, k: int) -> tuple[int, int]:
    """(v, g): the k-th largest of key[:c] and the number g of keys above it (radix select)."""
    hist = np.zeros(1 << _DIGIT, np.int64)
    low = (1 << _DIGIT) - 1
    for i in range(c):
        hist[key[i] >> _DIGIT] += 1
    above = 0
    hi = low
    while hi > 0 and above + hist[hi] < k:
        above += hist[hi]
        hi -= 1
    hist[:] = 0
    for i in range(c):
        v = key[i]
        if (v >> _DIGIT) == hi:
            hist[v & low] += 1
    lo = low
    while lo > 0 and above + hist[lo] < k:
        above += hist[lo]
        lo -= 1
    return (hi << _DIGIT) | lo, above


@jit
def keep_first(idx: np.ndarray, key: np.ndarray, c: int, k: int, out_idx: np.ndarray,
               out_key: np.ndarray) -> tuple[int, int]:
    """The k first entries of the stable order (-key, index) among the c candidates
    ``idx[:c], key[:c]`` (in index order), written in index order to ``out_idx, out_key``
    (which may be ``idx, key`` themselves); returns (k, the k-th largest key v). Keeps every
    key > v and the first k - #(key > v) keys == v, which is the stable-sort tie rule."""
    kth, above = _kth_key(key, c, k)
    ties = k - above
    j = 0
    for i in range(c):
        v = key[i]
        if v > kth or (v == kth and ties > 0):
            if v == kth:
                ties -= 1
            out_idx[j] = idx[i]
            out_key[j] = v
            j += 1
    return j, kth


@jit
def gather(u: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
    """out[j] = u[idx[j]]: the selected entries' bit patterns, signs and NaN payloads kept."""
    for j in range(idx.size):
        out[j] = u[idx[j]]


@jit
def compact(u: np.ndarray, mask: Any, thresh: int, k: int, idx: np.ndarray,
            key: np.ndarray) -> tuple[int, int]:
    """One read of ``u``: the c entries with key >= T (T starts at ``thresh``) in index
    order into ``idx[:c], key[:c]``; returns (c, final T).

    1. Per chunk of 1024 entries the 64 group maxima (vectorised); only groups whose max
       reaches T are read again (from L1), row by row so indices stay in order; the tail
       after the last chunk entry by entry. Stores are branch-free (written, then counted).
       Grouped even for dense k: reading every entry scalar cost 6 x.sum() at 25M
       (grouped: 1.6-2.0 for k = 0.5-2% of d, 5.5 at 5%).
    2. When fewer than a chunk's worth of slots are left, the k first of the stable order
       are kept (:func:`keep_first`) and T becomes their smallest key + 1: a later entry
       equal to it has a higher index than k kept ones, so it cannot be in the top k.
       Needs ``idx.size >= k + 2 * CHUNK``; sized ~2x the expected count it runs rarely.
    """
    n = u.size
    room = idx.size - CHUNK  # a chunk's stores always fit
    t = np.int64(thresh)
    c = 0
    nchunks = n // CHUNK
    acc = np.empty(LANES, u.dtype)
    hit = np.empty(LANES, np.int64)
    for ch in range(nchunks + 1):
        if c > room:
            c, kth = keep_first(idx, key, c, k, idx, key)
            t = np.int64(kth) + 1
        base = ch * CHUNK
        if ch == nchunks:
            for i in range(base, min(base + CHUNK, n)):
                v = u[i] & mask
                idx[c] = i
                key[c] = v
                c += v >= t
            continue
        _group_max(u, mask, base, acc)
        nhit = 0
        for lane in range(LANES):
            if acc[lane] >= t:
                hit[nhit] = lane
                nhit += 1
        for j in range(GROUP if nhit else 0):
            off = base + j * LANES
            for h in range(nhit):
                i = off + hit[h]
                v = u[i] & mask
                idx[c] = i
                key[c] = v
                c += v >= t
    return c, t
