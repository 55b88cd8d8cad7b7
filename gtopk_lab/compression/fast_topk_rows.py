"""Every row's exact top-k of ``|x|`` for a ``[P, d]`` float32 matrix in one compiled call.

The simulator's batched steps (:func:`gtopk_lab.training.batched_step.batched_topk`) select
the top k of each of P ranks' compensated gradients. ``torch.topk(|x|, k, dim=1)`` keeps a
heap per row, about 4 ns an entry here (1.5 ms for the MNIST-1D CNN at P = 64: d = 5.7k,
k = 57), a tenth of a simulated P = 64 iteration. This module returns, for every row whose
k-th largest magnitude is not tied across the cut, exactly the set ``torch.topk`` returns for
that row (the set is then unique), in ascending index order; the rows where ties at the k-th
largest magnitude leave a choice, or that hold a NaN, are flagged for the caller to give to
``torch.topk`` itself, whose tie choice is its own.

Algorithm, per row (keys: the IEEE bits of ``x`` without the sign, ordered as ``|x|``; the
kernels of :mod:`gtopk_lab.compression.fast_topk_kernels`):

1. one read: the maxima of groups of 16 entries (vectorised), counted in 2048 bins of
   their top 11 bits (8 exponent, 3 mantissa bits; a small histogram, cheap to clear per
   row), the tail after the last 1024-entry chunk entry by entry; T = the lower edge of the
   highest bin whose count from the top reaches k: at least k groups, so entries, reach T;
   a key above +inf's (NaN) flags the row;
2. ``compact``: the entries with key >= T, in index order, reading again only the groups
   whose maximum reaches T (about k of d / 16);
3. among those c candidates, the k-th largest key t and how many of the k largest equal it
   (``need``): the candidates' top 11 bits counted, the bin that holds the k-th largest
   sorted (a few tens of keys at the CNN's k = 57: a radix select's further digits would
   scan 2 x 1024 bins), or, above 512 keys, selected by the merge kernel's two further
   10-bit digits (:mod:`gtopk_lab.compression.fast_merge`, whose bin helpers step 3 uses);
   if fewer keys than all those equal to t are needed, the row is flagged (a tie across the
   cut);
4. the candidates with key >= t, exactly k, in index order: indices and value bits.

Cost per row: one vectorised read of d entries, the hit groups again (16 k entries), O(c)
for the select and a sort of one bin's keys; bins are scanned from the largest key's down.
AMD EPYC, one thread (``benchmarks/rows_topk.py``, interleaved): 64 rows of 5.7k (k = 57)
2.8-3.4x faster than ``torch.topk`` (0.45 against 1.52 ms on a quiet stretch); 8 rows of
235k (k = 2350) 5.9-6.6x.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gtopk_lab.compression import fast_merge
from gtopk_lab.compression import fast_topk_kernels as kern

__all__ = ["rows_topk_applies", "numba_rows_topk"]

_BINS = 2048
_SHIFT = 20  # a 31-bit key's top 11 bits
_MAX_KEY = 0x7F800000  # +inf's; a NaN's key is above it
#: a bin of at most this many keys is sorted; a fuller one takes two more radix digits (the
#: wide CNN's rows, k = 2350 of 235k: sorting its bins was 1.2x slower than the digits)
_SORT_MAX = 512


def _kth_key_small(key: np.ndarray, c: int, k: int, top: int) -> tuple[int, int]:
    """(t, need): the k-th largest of ``key[:c]`` (1 <= k <= c, every key <= ``top``) and how
    many of the k largest equal it. The keys' top 11 bits are counted (2048 bins, scanned down
    from ``top``'s) and the bin of the k-th largest copied out, as the merge's select does
    (:mod:`gtopk_lab.compression.fast_merge`); that bin is then sorted (up to
    :data:`_SORT_MAX` keys: the merge's two further 10-bit digits would scan 2 x 1024 bins for
    the few tens of keys such a bin holds at small k), else finished by those digits.
    Cost: 2 reads of c keys, the bins between ``top``'s and t's, one bin's select."""
    hist = np.zeros(_BINS, np.int64)
    for j in range(c):
        hist[key[j] >> _SHIFT] += 1
    b, need = fast_merge._bin_of_kth(hist, np.int64(top) >> _SHIFT, k)
    cand, m = fast_merge._copy_bin(key[:c], hist[b], _SHIFT, b)
    if m > _SORT_MAX:
        return fast_merge._low_digits(cand, m, b, need, hist)
    cand = np.sort(cand[:m])
    t = cand[m - need]  # the need-th largest of the bin
    for j in range(m - need + 1, m):  # those of the k largest above t
        need -= cand[j] > t
    return t, need


def _rows_kernel(u2: np.ndarray, k: int, out_idx: np.ndarray, out_bits: np.ndarray, ok: np.ndarray) -> None:
    """Steps 1-4 of the module docstring for every row of ``u2`` (uint32 bits, C order):
    row r's k indices and value bits into ``out_idx[r]``/``out_bits[r]`` where ``ok[r]``."""
    rows, d = u2.shape
    mask = np.uint32(0x7FFFFFFF)
    hist = np.zeros(_BINS, np.int64)
    acc = np.empty(kern.LANES, np.uint32)
    nchunks = d // kern.CHUNK
    # room for every entry plus compact's chunk of slack: its buffer can never fill
    idx = np.empty(d + 2 * kern.CHUNK, np.int64)
    key = np.empty(d + 2 * kern.CHUNK, np.uint32)
    for r in range(rows):
        u = u2[r]
        hist[:] = 0
        top = np.uint32(0)
        for ch in range(nchunks):
            kern._group_max(u, mask, ch * kern.CHUNK, acc)
            for lane in range(kern.LANES):
                hist[acc[lane] >> _SHIFT] += 1
                top = max(top, acc[lane])
        for i in range(nchunks * kern.CHUNK, d):
            v = u[i] & mask
            hist[v >> _SHIFT] += 1
            top = max(top, v)
        if top > np.uint32(_MAX_KEY):
            ok[r] = False
            continue
        above = 0
        b = np.int64(top) >> _SHIFT  # no bin above the largest key's holds anything
        while b > 0 and above + hist[b] < k:
            above += hist[b]
            b -= 1
        c, _ = kern.compact(u, mask, np.int64(b) << _SHIFT, k, idx, key)
        t, need = _kth_key_small(key, c, k, top)
        equal = 0
        for j in range(c):
            equal += key[j] == t
        if equal != need:
            ok[r] = False
            continue
        ok[r] = True
        a = 0
        for j in range(c):  # branch-free: written, then counted
            out_idx[r, a] = idx[j]
            out_bits[r, a] = u[idx[j]]
            a += key[j] >= t


_KERNEL: list[Any] = []


def _compiled() -> Any:
    """The jitted row kernel, made on first use (numba's disk cache afterwards)."""
    if not _KERNEL:
        global _kth_key_small
        fast_merge.compiled_kernel("merge")  # jits the select helpers the row kernel calls
        _kth_key_small = kern.jit(_kth_key_small)
        _KERNEL.append(kern.jit(_rows_kernel))
    return _KERNEL[0]


def rows_topk_applies(x: torch.Tensor, k: int) -> bool:
    """Whether :func:`numba_rows_topk` takes ``x``: numba is installed, a CPU float32 ``[P, d]``
    tensor without grad, 1 <= k < d (k = d is every index, no selection)."""
    return (kern.HAVE_NUMBA and isinstance(x, torch.Tensor) and x.dim() == 2 and x.device.type == "cpu"
            and x.dtype == torch.float32 and not x.requires_grad and 1 <= k < x.shape[1])


def numba_rows_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(values [P, k], indices [P, k] int64, ok [P] bool)`` for ``x`` (see
    :func:`rows_topk_applies`): where ``ok[r]``, row r's top-k of ``|x[r]|`` (the set
    ``torch.topk`` returns for it, ascending index; values bitwise ``x[r, indices]``); the
    other rows are unspecified (a tie across the k-th largest magnitude, or a NaN)."""
    x = x.contiguous()
    rows = x.shape[0]
    out_idx = np.empty((rows, k + 1), np.int64)  # one slot more: the branch-free writes
    out_bits = np.empty((rows, k + 1), np.uint32)
    ok = np.empty(rows, np.bool_)
    _compiled()(x.view(torch.int32).numpy().view(np.uint32), k, out_idx, out_bits, ok)
    values = torch.from_numpy(np.ascontiguousarray(out_bits[:, :k]).view(np.int32)).view(torch.float32)
    return values, torch.from_numpy(np.ascontiguousarray(out_idx[:, :k])), torch.from_numpy(ok)
