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

It declines (None) where ``merge_sparse`` would not take the compiled path for every pair
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
from gtopk_lab.compression.fast_merge import _jit, _np, merge_applies

__all__ = ["numba_merge_many"]

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


_KERNEL: list[Any] = []


def _kernel() -> Any:
    global _merge
    if not _KERNEL:
        _merge = fast_merge._compiled("merge")
        _KERNEL.append(_jit(_merge_many_kernel))
    return _KERNEL[0]


def _packed(tensors: Sequence[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    arrays = [_np(t) for t in tensors]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    return np.concatenate(arrays), offsets


def numba_merge_many(pairs: Sequence[Pair], k: int) -> list[Pair] | None:
    """``merge_sparse(va, ia, vb, ib, k)`` of every ``(va, ia, vb, ib)`` in ``pairs`` (steps
    1-3 of the module docstring), or None where a pair would not take the compiled path."""
    if not pairs or not all(merge_applies(*p) for p in pairs):
        return None
    va, oa = _packed([p[0] for p in pairs])
    ia, _ = _packed([p[1] for p in pairs])
    vb, ob = _packed([p[2] for p in pairs])
    ib, _ = _packed([p[3] for p in pairs])
    ok, kv, ki, ko, dv, di, do = _kernel()(va, ia, oa, vb, ib, ob, k)
    if not ok:
        return None
    kv_t, ki_t, dv_t, di_t = (torch.from_numpy(a) for a in (kv, ki, dv, di))
    kept, dropped = ko.tolist(), do.tolist()
    return [(kv_t[kept[j]:kept[j + 1]], ki_t[kept[j]:kept[j + 1]], dv_t[dropped[j]:dropped[j + 1]],
             di_t[dropped[j]:dropped[j + 1]]) for j in range(len(pairs))]
