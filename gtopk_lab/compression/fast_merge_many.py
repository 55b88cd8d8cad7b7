"""Many gTop-k merges in one compiled call: the simulator's merges of one reduction level.

A butterfly or tree level of P virtual ranks is up to P / 2 independent merges of two
sparse vectors each (:mod:`gtopk_lab.comm.sim_gtopk`). At the simulator's sizes (the
MNIST-1D CNN: d = 5,210, k = 52) a merge's kernel takes about a microsecond and its call
from Python (argument checks, four array views, four tensors back) a hundred, so a P = 64
gTop-k call was ~9 ms of call overhead for ~0.1 ms of merging. :func:`numba_merge_many`
makes a whole level's merges in one call:

1. the operands packed as two flat arrays each (values, indices) with offsets, one pair j
   being ``a[oa[j]:oa[j + 1]]`` merged with ``b[ob[j]:ob[j + 1]]``;
2. for each pair, :func:`~gtopk_lab.compression.fast_merge.numba_merge`'s own kernel
   (the same compiled code, so each result is bitwise ``merge_sparse``'s), its kept and
   dropped entries appended to flat outputs with offsets;
3. the outputs cut into one (kept values, kept indices, dropped values, dropped indices)
   tuple of tensors per pair (views of the flat outputs: do not modify them in place).

:func:`numba_reduce_levels` goes further: a whole pairwise reduction (a butterfly over a
power of two, or a binomial tree's reduce), every level in one call, the operands packed once:

1. the n vectors packed as above; for half = 1, 2, 4, ... < n, the level's merges
   ``vec[s] = merge(vec[s], vec[s + half])`` for s = 0, 2 half, 4 half, ... with s + half < n,
   in that order (each merge's operands are earlier merges' results or inputs);
2. every merge's kept and dropped entries appended to flat outputs with offsets;
3. cut into one (kept values, kept indices, dropped values, dropped indices) per merge, in
   level order.

Both decline (None) where ``merge_sparse`` would not take the compiled path for every pair
(:func:`~gtopk_lab.compression.fast_merge.merge_applies`, or the kernel declines: an operand
not strictly ascending, a NaN sum); callers then merge pair by pair. Cost: one call, the
pairs' merges, and one copy of the operands into the packed inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gtopk_lab.compression import fast_merge
from gtopk_lab.compression.fast_merge import _jit, numpy_view

__all__ = ["numba_merge_many", "numba_reduce_levels", "reduction_levels"]

Pair = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

_merge: Any = None  # the compiled single merge, bound before the batch kernel is jitted


def _merge_many_kernel(va: np.ndarray, ia: np.ndarray, oa: np.ndarray, vb: np.ndarray, ib: np.ndarray,
                       ob: np.ndarray, k: int) -> tuple:
    """Steps 1-2: ``(ok, kept values, kept indices, kept offsets, dropped values, dropped
    indices, dropped offsets)``; ``ok`` False when the kernel declined any pair."""
    pairs = oa.size - 1
    total = (oa[pairs] - oa[0]) + (ob[pairs] - ob[0])
    kv = np.empty(total, dtype=va.dtype)
    ki = np.empty(total, dtype=ia.dtype)
    dv = np.empty(total, dtype=va.dtype)
    di = np.empty(total, dtype=ia.dtype)
    ko = np.zeros(pairs + 1, dtype=np.int64)
    do = np.zeros(pairs + 1, dtype=np.int64)
    for j in range(pairs):
        ok, a_v, a_i, d_v, d_i = _merge(va[oa[j]:oa[j + 1]], ia[oa[j]:oa[j + 1]],
                                        vb[ob[j]:ob[j + 1]], ib[ob[j]:ob[j + 1]], k)
        if not ok:
            return False, kv[:0], ki[:0], ko, dv[:0], di[:0], do
        ko[j + 1] = ko[j] + a_v.size
        kv[ko[j]:ko[j + 1]] = a_v
        ki[ko[j]:ko[j + 1]] = a_i
        do[j + 1] = do[j] + d_v.size
        dv[do[j]:do[j + 1]] = d_v
        di[do[j]:do[j + 1]] = d_i
    return True, kv, ki, ko, dv, di, do


def _reduce_levels_kernel(va: np.ndarray, ia: np.ndarray, oa: np.ndarray, k: int) -> tuple:
    """Steps 1-2 of :func:`numba_reduce_levels`: ``(ok, kept values, kept indices, kept
    offsets, dropped values, dropped indices, dropped offsets)`` per merge in level order;
    ``ok`` False when the kernel declined any merge."""
    n = oa.size - 1
    merges = max(n - 1, 0)
    longest = k
    for j in range(n):
        longest = max(longest, oa[j + 1] - oa[j])
    total = oa[n] - oa[0]
    # every slot's current vector lives in one buffer: the inputs, then each merge's result
    kv = np.empty(total + merges * longest, dtype=va.dtype)
    ki = np.empty(total + merges * longest, dtype=ia.dtype)
    kv[:total] = va[oa[0]:oa[n]]
    ki[:total] = ia[oa[0]:oa[n]]
    start = oa[:n] - oa[0]
    size = oa[1:] - oa[:n]
    dv = np.empty(merges * 2 * longest, dtype=va.dtype)
    di = np.empty(merges * 2 * longest, dtype=ia.dtype)
    ko = np.zeros(merges + 1, dtype=np.int64)
    do = np.zeros(merges + 1, dtype=np.int64)
    pos = total
    j = 0
    half = 1
    while half < n:
        s = 0
        while s + half < n:
            lo, hi = s, s + half
            ok, a_v, a_i, d_v, d_i = _merge(kv[start[lo]:start[lo] + size[lo]], ki[start[lo]:start[lo] + size[lo]],
                                            kv[start[hi]:start[hi] + size[hi]], ki[start[hi]:start[hi] + size[hi]], k)
            if not ok:
                return False, kv[:0], ki[:0], ko, dv[:0], di[:0], do
            kv[pos:pos + a_v.size] = a_v
            ki[pos:pos + a_v.size] = a_i
            ko[j] = pos
            start[lo] = pos
            size[lo] = a_v.size
            pos += a_v.size
            do[j + 1] = do[j] + d_v.size
            dv[do[j]:do[j + 1]] = d_v
            di[do[j]:do[j + 1]] = d_i
            j += 1
            s += 2 * half
        half *= 2
    # kept offsets as starts into kv; the last entry closes the last merge's result
    ko[merges] = pos
    return True, kv, ki, ko, dv, di, do


_KERNEL: dict[str, Any] = {}


def _kernel(name: str = "many") -> Any:
    global _merge
    if not _KERNEL:
        _merge = fast_merge.compiled_kernel("merge")
    if name not in _KERNEL:
        _KERNEL[name] = _jit(_merge_many_kernel if name == "many" else _reduce_levels_kernel)
    return _KERNEL[name]


def _offsets(sizes: Sequence[int]) -> np.ndarray:
    """Where each of the concatenated vectors starts, and the total last (int64)."""
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def _packed(tensors: Sequence[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    arrays = [numpy_view(t) for t in tensors]
    return np.concatenate(arrays), _offsets([a.size for a in arrays])


def _cut(kv: np.ndarray, ki: np.ndarray, ko: np.ndarray, dv: np.ndarray, di: np.ndarray, do: np.ndarray
         ) -> list[Pair]:
    """Step 3: the flat outputs as one (kept values, kept indices, dropped values, dropped
    indices) per merge, views cut by the offsets (``ko[0] == do[0] == 0``), in one
    ``split`` per output rather than four slicing calls per merge."""
    kept, dropped = np.diff(ko).tolist(), np.diff(do).tolist()
    kv_t, ki_t = torch.from_numpy(kv[:ko[-1]]).split(kept), torch.from_numpy(ki[:ko[-1]]).split(kept)
    dv_t, di_t = torch.from_numpy(dv[:do[-1]]).split(dropped), torch.from_numpy(di[:do[-1]]).split(dropped)
    return list(zip(kv_t, ki_t, dv_t, di_t))


def _applies(values: Sequence[torch.Tensor], indices: Sequence[torch.Tensor]) -> bool:
    """``merge_applies`` for many operands at once: the compiled merge is enabled, every
    values tensor CPU float32 and every indices tensor CPU int32."""
    return (fast_merge.enabled() and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in values)
            and all(t.dtype == torch.int32 and t.device.type == "cpu" for t in indices))


def numba_merge_many(pairs: Sequence[Pair], k: int) -> list[Pair] | None:
    """``merge_sparse(va, ia, vb, ib, k)`` of every ``(va, ia, vb, ib)`` in ``pairs`` (steps
    1-3 of the module docstring), or None where a pair would not take the compiled path."""
    if not pairs or not _applies([t for p in pairs for t in (p[0], p[2])], [t for p in pairs for t in (p[1], p[3])]):
        return None
    va, oa = _packed([p[0] for p in pairs])
    ia, _ = _packed([p[1] for p in pairs])
    vb, ob = _packed([p[2] for p in pairs])
    ib, _ = _packed([p[3] for p in pairs])
    ok, kv, ki, ko, dv, di, do = _kernel("many")(va, ia, oa, vb, ib, ob, k)
    if not ok:
        return None
    return _cut(kv, ki, ko, dv, di, do)


def reduction_levels(n: int) -> list[list[tuple[int, int]]]:
    """The merges ``(lo, hi)`` of each level of :func:`numba_reduce_levels` over n vectors:
    half = 1, 2, 4, ... < n, pairs ``(s, s + half)`` for s = 0, 2 half, ... with s + half < n."""
    levels = []
    half = 1
    while half < n:
        levels.append([(s, s + half) for s in range(0, n - half, 2 * half)])
        half *= 2
    return levels


def numba_reduce_levels(vectors: Sequence[tuple[torch.Tensor, torch.Tensor]], k: int,
                        packed: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[Pair] | None:
    """Every merge of the pairwise reduction of ``vectors`` ``(values, indices)`` (steps 1-3
    of the module docstring's second part): one ``merge_sparse(vec[lo], vec[hi], k)`` result
    per merge of :func:`reduction_levels`, flattened in level order, or None where a merge would
    not take the compiled path. The final vector is the last merge's kept pair (n >= 2).

    ``packed``: the vectors' values and indices already concatenated in order, as one tensor
    each (a caller that sorted them as rows of one matrix has them so): step 1's P views and
    copies are then skipped (0.2 ms of 0.56 at P = 64, k = 57)."""
    if len(vectors) < 2:
        return None
    if packed is not None:
        sizes = [v.numel() for v, _ in vectors]
        if packed[0].numel() == sum(sizes) and _applies([packed[0]], [packed[1]]):
            va, ia = numpy_view(packed[0]), numpy_view(packed[1])
            ok, kv, ki, ko, dv, di, do = _kernel("levels")(va, ia, _offsets(sizes), k)
            return _cut(kv[ko[0]:], ki[ko[0]:], ko - ko[0], dv, di, do) if ok else None
    if not _applies([v for v, _ in vectors], [i for _, i in vectors]):
        return None
    va, oa = _packed([v for v, _ in vectors])
    ia, _ = _packed([i for _, i in vectors])
    ok, kv, ki, ko, dv, di, do = _kernel("levels")(va, ia, oa, k)
    if not ok:
        return None
    # a merge's result ends where the next one's starts (results are appended in order)
    return _cut(kv[ko[0]:], ki[ko[0]:], ko - ko[0], dv, di, do)
