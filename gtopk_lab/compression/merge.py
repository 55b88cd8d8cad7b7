"""Merging sparse vectors: the arithmetic at the heart of gTop-k.

A k-sparse vector over a flat buffer of ``numel`` elements is the pair
``(values [n], indices [n])`` with unique indices (see docs/architecture.md).

``merge_sparse`` is the one routine every gTop-k schedule (tree, butterfly, fold) and the
in-process simulator use: union the indices, add the values at shared indices, keep the
k entries of largest magnitude. ``coalesce_sparse`` is the exact sum of any number of
sparse vectors and is what the Top-k AllGather uses.

Both are vectorised (sort + segment sums; no Python loop over entries) and deterministic:
the output is canonical (ascending index), ties in |value| are broken by the lower index,
and duplicate entries are added in argument order, so every rank that computes the same
merge holds bitwise-identical tensors. On CPU the index sort of a merge and its keep
threshold run in numpy on the tensors' memory (:func:`stable_argsort`,
:func:`kth_largest`); both compute a uniquely defined result, so CPU and CUDA agree.
A CPU float32 merge of canonical operands runs compiled instead
(:mod:`gtopk_lab.compression.fast_merge`, numba, one pass): the same result bitwise.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from gtopk_lab.compression.fast_merge import merge_applies, numba_merge, numba_sort_by_index, numba_wire_sort

__all__ = ["index_dtype", "coalesce_sparse", "merge_sparse", "check_sparse", "canonical_wire", "top_magnitude_mask",
           "stable_argsort", "kth_largest", "sort_by_index", "merge_sparse_torch", "check_range", "merge_cpu_clock"]

_INT32_LIMIT = 2**31


def merge_cpu_clock() -> float:
    """The CPU clock a collective's merges are timed with (``CommStats.merge_cpu_s``): this
    thread's (``time.thread_time``) when torch computes on one thread, as a rank does, so a
    Dask worker's own threads running beside a merge are not charged to it (the process
    clock read 0.75-1.2 ms for the same merges on the 200 Mbit/s testbed); the process's
    (``time.process_time``) otherwise, where intra-op threads do part of a merge."""
    return time.thread_time() if torch.get_num_threads() == 1 else time.process_time()


def index_dtype(numel: int) -> torch.dtype:
    """Index dtype for a sparse vector over ``numel`` elements: int32 if numel < 2**31, else int64."""
    if isinstance(numel, bool) or not isinstance(numel, int):
        raise TypeError(f"numel={numel!r} has type {type(numel).__name__}: expected int")
    if numel < 1:
        raise ValueError(f"numel={numel!r} is invalid: expected an integer >= 1")
    return torch.int32 if numel < _INT32_LIMIT else torch.int64


def check_sparse(values: torch.Tensor, indices: torch.Tensor, numel: int | None = None,
                 name: str = "values/indices") -> None:
    """Validate a sparse pair: 1-D tensors of equal length, integer indices in [0, numel).

    Cost: one min/max pass (``torch.aminmax``) over the indices when ``numel`` is given. Uniqueness is not
    checked (it would cost a sort); callers guarantee it.
    """
    if not isinstance(values, torch.Tensor) or not isinstance(indices, torch.Tensor):
        raise TypeError(f"{name}: expected torch.Tensor values and indices, got "
                        f"{type(values).__name__} and {type(indices).__name__}")
    if values.dim() != 1 or indices.dim() != 1:
        raise ValueError(f"{name}: expected 1-D tensors, got shapes {tuple(values.shape)} and "
                         f"{tuple(indices.shape)}")
    if values.numel() != indices.numel():
        raise ValueError(f"{name}: values has {values.numel()} entries but indices has "
                         f"{indices.numel()}: expected the same length")
    if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
        raise TypeError(f"{name}: indices dtype {indices.dtype} is invalid: expected an integer dtype")
    if not values.dtype.is_floating_point:
        raise TypeError(f"{name}: values dtype {values.dtype} is invalid: expected a floating dtype")
    if numel is not None and indices.numel() > 0:
        lo_t, hi_t = torch.aminmax(indices)
        check_range(int(lo_t), int(hi_t), numel, name)


def check_range(lo: int, hi: int, numel: int, name: str) -> None:
    """``ValueError`` naming ``name`` unless a selection's indices ``[lo, hi]`` lie in ``[0, numel)``."""
    if lo < 0 or hi >= numel:
        raise ValueError(f"{name}: indices range [{lo}, {hi}] is invalid: expected indices in "
                         f"[0, {numel}) (numel={numel})")


def canonical_wire(values: torch.Tensor, indices: torch.Tensor, numel: int,
                   name: str = "values/indices") -> tuple[torch.Tensor, torch.Tensor]:
    """A rank's selection checked (as :func:`check_sparse` with ``numel``), in the wire
    format (contiguous values, :func:`index_dtype` indices) and sorted by index, as every
    sparse collective starts.

    CPU float32 with int32/int64 indices below 2**31 elements: one compiled call
    (:func:`~gtopk_lab.compression.fast_merge.numba_wire_sort`) does the range check's
    min/max, the conversion and the sort; elsewhere ``check_sparse``, the conversion and
    :func:`sort_by_index`. Same result either way."""
    check_sparse(values, indices, None, name)
    if index_dtype(numel) == torch.int32:
        fast = numba_wire_sort(values, indices, numel)
        if fast is not None:
            lo, hi, sorted_values, sorted_indices = fast
            check_range(lo, hi, numel, name)
            return sorted_values, sorted_indices
    check_sparse(values, indices, numel, name)
    return sort_by_index(values.contiguous(), indices.to(index_dtype(numel)).contiguous())


def _stable_sort_by_index(values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) stably sorted by index; indices come back int32/int64.

    A stable sort permutes equal keys the same way in any integer dtype, so int32/int64
    indices are sorted as they come (int32 sorts ~2x faster than a widened int64 copy);
    other integer dtypes (uint16/32/64 lack index_select) are widened to int64, and the
    callers narrow the result back.
    """
    key = indices if indices.dtype in (torch.int32, torch.int64) else indices.to(torch.int64)
    perm = stable_argsort(key)
    return values.index_select(0, perm), key.index_select(0, perm)


def coalesce_sparse(values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum duplicate indices of a concatenation of sparse vectors.

    ``values``/``indices`` may hold repeated indices (e.g. several workers' selections
    concatenated in rank order). Returns ``(values, indices)`` sorted by ascending index with
    each index once and its values added **in input order** (deterministic on CPU and CUDA:
    the j-th occurrences of all indices are added in one scatter with distinct targets, for
    j = 0 .. max multiplicity - 1; the loop runs over multiplicities, at most P, never over
    entries).

    Cost: O(n log n) for the stable sort of n = len(indices) (:func:`stable_argsort`),
    plus O(n) for the segment sums. Index dtype is preserved.
    """
    n = indices.numel()
    if n == 0:
        return values.clone(), indices.clone()
    sorted_vals, sorted_idx = _stable_sort_by_index(values, indices)
    new_group = torch.ones(n, dtype=torch.bool, device=indices.device)
    if n > 1:
        torch.ne(sorted_idx[1:], sorted_idx[:-1], out=new_group[1:])
    starts = torch.nonzero(new_group).squeeze(1)
    n_groups = starts.numel()
    if n_groups == n:  # no duplicates: the common case for disjoint selections
        return sorted_vals, sorted_idx.to(indices.dtype)
    group_id = torch.cumsum(new_group, 0) - 1
    positions = torch.arange(n, device=indices.device)
    occurrence = positions - starts.index_select(0, group_id)
    out = sorted_vals.index_select(0, starts)
    max_mult = int(occurrence.max()) + 1
    for j in range(1, max_mult):
        # gathers by position (index_select) instead of boolean-mask indexing: same
        # elements in the same order, several times cheaper on CPU
        sel = torch.nonzero(occurrence == j).squeeze(1)
        out.index_add_(0, group_id.index_select(0, sel), sorted_vals.index_select(0, sel))
    return out, sorted_idx.index_select(0, starts).to(indices.dtype)


def top_magnitude_mask(values: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the k entries of largest |value|, ties broken by position (lower first).

    With ``values`` in canonical (ascending index) order, "lower position" is "lower index",
    the tie rule every rank must share. Algorithm: t = the k-th largest magnitude
    (``torch.kthvalue``, a selection, not a sort); keep every |v| > t, then the first
    ``k - count(|v| > t)`` entries with |v| == t. Cost O(n); the same result as a stable sort
    by descending magnitude, several times faster at the tens of thousands of entries a
    gTop-k merge handles.
    """
    n = values.numel()
    if k >= n:
        return torch.ones(n, dtype=torch.bool, device=values.device)
    magnitude = values.abs()
    threshold = torch.kthvalue(magnitude, n - k + 1).values
    keep = magnitude > threshold
    missing = k - int(keep.sum())
    if missing > 0:
        tied = magnitude == threshold
        keep |= tied & (torch.cumsum(tied, 0) <= missing)
    return keep


#: a CPU key with at most this many descents (ascending runs - 1) is sorted by numpy's timsort
_TIMSORT_MAX_DESCENTS = 8
#: torch's CPU sort is a comparison sort below this many elements (radix from here on)
_TORCH_RADIX_MIN = 32768


def _radix_argsort_u32(array: np.ndarray) -> np.ndarray:
    """Stable argsort of 32-bit unsigned keys: two stable passes over 16-bit digits
    (numpy sorts 16-bit keys by radix), least significant first."""
    low = (array & 0xFFFF).astype(np.uint16)
    perm = np.argsort(low, kind="stable")
    high = (array[perm] >> 16).astype(np.uint16)
    return perm[np.argsort(high, kind="stable")]


def stable_argsort(key: torch.Tensor) -> torch.Tensor:
    """int64 permutation that sorts the 1-D integer ``key`` ascending, equal keys in input order.

    On CPU, on the tensor's memory, whichever is fast for the key (one O(n) pass looks):
    - 8/16-bit keys: numpy's radix sort;
    - two ascending runs, such as two concatenated canonical vectors (or up to 9 runs
      below 32768 keys): numpy's timsort merges them in O(n) (2x faster than
      ``torch.sort`` at 2 x 25k);
    - fewer than 32768 keys that fit 32 bits: two 16-bit radix passes. ``torch.sort``
      uses a comparison sort below that size: 1.3 ms for 25k random keys, 6x slower than
      at 32768 (``benchmarks/merge_speed.py``);
    - otherwise ``torch.sort(stable=True)`` (radix).
    Other devices: ``torch.sort(stable=True)``. A stable sort's permutation is unique, so
    all paths agree.
    """
    if key.device.type == "cpu":
        array = key.numpy()
        if array.itemsize <= 2:
            return torch.from_numpy(np.argsort(array, kind="stable"))
        descents = int(np.count_nonzero(array[1:] < array[:-1]))
        small = array.size < _TORCH_RADIX_MIN
        if descents <= 1 or (small and descents <= _TIMSORT_MAX_DESCENTS):
            return torch.from_numpy(np.argsort(array, kind="stable"))
        if small:
            if array.dtype == np.int32:  # flipping the sign bit maps int32 order onto uint32
                return torch.from_numpy(_radix_argsort_u32(array.view(np.uint32) ^ np.uint32(0x80000000)))
            if array.dtype == np.int64 and array.min() >= 0 and array.max() < 2**32:
                return torch.from_numpy(_radix_argsort_u32(array.astype(np.uint32)))
    return torch.sort(key, stable=True).indices


def sort_by_index(values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, indices)`` reordered by ascending index; the same tensors if already so.

    A ``torch.topk`` selection comes in magnitude order. Sorting it once (O(k log k), ~0.2 ms
    at 25k on CPU) lets every later merge see two ascending runs, which
    :func:`stable_argsort` merges in O(n). Cost of the check alone: one O(k) pass. CPU
    float32 values with int32/int64 indices take the compiled radix sort of
    :mod:`gtopk_lab.compression.fast_merge` (three reads of the input at 25M); a stable
    sort's result is unique, so both paths agree.
    """
    if indices.numel() < 2:
        return values, indices
    # CPU float32 / int32: the compiled radix sort checks the order itself, in its first
    # pass (a separate check cost 0.1 ms hot and 0.4 ms cold at 25k); same result
    fast = numba_sort_by_index(values, indices)
    if fast is not None:
        return fast
    if not bool((indices[1:] < indices[:-1]).any()):
        return values, indices
    sorted_vals, sorted_idx = _stable_sort_by_index(values, indices)
    return sorted_vals, sorted_idx.to(indices.dtype)


def kth_largest(magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest entry (1 <= k <= n) of a 1-D float tensor, as a 0-d tensor.

    CPU float32/float64 without NaN: ``numpy.partition`` (introselect, about 2x faster than
    ``torch.kthvalue`` at 50k entries). Otherwise ``torch.kthvalue``. An order statistic is
    one value, so both agree.
    """
    n = magnitude.numel()
    if (magnitude.device.type == "cpu" and magnitude.dtype in (torch.float32, torch.float64)
            and not bool(torch.isnan(magnitude.sum()))):  # one NaN makes the sum NaN
        return torch.tensor(np.partition(magnitude.detach().numpy(), n - k)[n - k], dtype=magnitude.dtype)
    return torch.kthvalue(magnitude, n - k + 1).values


def merge_sparse(v_a: torch.Tensor, i_a: torch.Tensor, v_b: torch.Tensor, i_b: torch.Tensor,
                 k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge two sparse vectors and keep the k entries of largest magnitude.

    Algorithm (each operand's indices are unique, so an index occurs at most twice):
      1. concatenate (a first, then b) and stable-sort by index (:func:`stable_argsort`);
         an index held by both operands is now a pair of neighbours, a's entry first;
      2. add each pair's second value into its first (``a + b``) and mark the seconds;
      3. among the firsts (the union) keep the ``min(k, |union|)`` entries of largest
         |value|, ties to the lower index: one order statistic (:func:`kth_largest`), not a
         sort, with the seconds' magnitudes set to -1 so that they never count; a NaN ranks
         with +inf (above every number, as in ``torch.topk``, the selectors' rule), so a
         merge of two k-sets keeps k even when a sum is NaN;
      4. one stable sort of a 1-byte class (0 kept, 1 dropped, 2 second) lists the kept
         and the dropped positions, each in ascending index order.

    Returns ``(values, indices, dropped_values, dropped_indices)``. ``kept + dropped`` is
    exactly the (rounded) sum ``a + b``: the mass-conserving residual rule charges the
    dropped part to one rank. Inputs may be longer than k (e.g. GaussianK selections).

    Cost: O(n log n) for the index sort of n = n_a + n_b entries (O(n) on CPU for
    canonical operands: two ascending runs), O(n) for the rest; no Python loop over entries.
    On 2 x 25k pairs on one CPU thread: about 1.4 ms, against 2.5 ms for the former
    coalesce-then-select implementation (``benchmarks/merge_speed.py``). CPU float32
    canonical operands (every gTop-k merge) take the compiled one-pass kernel of
    :mod:`gtopk_lab.compression.fast_merge` instead, same result bitwise
    (:func:`merge_sparse_torch` is the vectorised path alone). Deterministic and
    canonical, so two ranks merging the same operands get bitwise-identical tensors (also
    with the operands swapped, since IEEE addition of two numbers is commutative).
    """
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k={k!r} has type {type(k).__name__}: expected int")
    if k < 1:
        raise ValueError(f"k={k!r} is invalid: expected an integer >= 1")
    check_sparse(v_a, i_a, name="merge_sparse(a)")
    check_sparse(v_b, i_b, name="merge_sparse(b)")
    if v_a.dtype != v_b.dtype:
        raise TypeError(f"merge_sparse: values dtypes differ ({v_a.dtype} vs {v_b.dtype}): expected equal")
    if merge_applies(v_a, i_a, v_b, i_b):
        merged = numba_merge(v_a, i_a, v_b, i_b, k)
        if merged is not None:  # None: not canonical or a NaN sum, which the torch path defines
            return merged
    return merge_sparse_torch(v_a, i_a, v_b, i_b, k)


def merge_sparse_torch(v_a: torch.Tensor, i_a: torch.Tensor, v_b: torch.Tensor, i_b: torch.Tensor,
                       k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`merge_sparse`'s vectorised torch path (steps 1-4), without the compiled
    kernel and without the argument checks (callers have made them): any device and dtype."""
    idx_dtype = i_a.dtype if i_a.dtype == i_b.dtype else torch.int64
    sorted_vals, sorted_idx = _stable_sort_by_index(torch.cat([v_a, v_b]),
                                                    torch.cat([i_a.to(idx_dtype), i_b.to(idx_dtype)]))
    n = sorted_idx.numel()
    second = torch.zeros(n, dtype=torch.bool, device=sorted_idx.device)
    if n > 1:
        torch.eq(sorted_idx[1:], sorted_idx[:-1], out=second[1:])
    n_second = int(second.sum())
    if n_second:
        pos = torch.nonzero(second).squeeze(1)
        sorted_vals.index_add_(0, pos - 1, sorted_vals.index_select(0, pos))
    n_union = n - n_second
    if n_union <= k:
        keep = ~second
        n_keep = n_union
    else:
        # NaN as +inf: kept, never silently parked in a residual, and exactly k kept (an
        # exact-k rank that sent fewer would leave its peers waiting for its message)
        magnitude = torch.nan_to_num(sorted_vals.abs(), nan=float("inf"), posinf=float("inf"))
        if n_second:
            magnitude.masked_fill_(second, -1.0)
        threshold = kth_largest(magnitude, k)
        keep = magnitude >= threshold
        n_keep = int(keep.sum())
        if n_keep != k:  # ties at the threshold: keep the lowest indices (positions) of them
            keep = magnitude > threshold
            tied = magnitude == threshold
            keep |= tied & (torch.cumsum(tied, 0) <= k - int(keep.sum()))
            n_keep = int(keep.sum())
    cls = (~keep).to(torch.uint8)
    if n_second:
        cls.masked_fill_(second, 2)
    order = stable_argsort(cls)
    kept, dropped = order[:n_keep], order[n_keep:n_union]
    return (sorted_vals.index_select(0, kept), sorted_idx.index_select(0, kept).to(idx_dtype),
            sorted_vals.index_select(0, dropped), sorted_idx.index_select(0, dropped).to(idx_dtype))
