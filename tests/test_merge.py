"""Tests of gtopk_lab.compression.merge: index dtype, coalescing and merge_sparse."""

from __future__ import annotations

import pytest
import torch

from gtopk_lab.compression.merge import coalesce_sparse, index_dtype, merge_sparse, merge_sparse_torch

pytestmark = pytest.mark.timeout(30)


def _sparse(gen: torch.Generator, numel: int, n: int, ties: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randperm(numel, generator=gen)[:n].to(torch.int32)
    if ties:
        vals = torch.randint(-3, 4, (n,), generator=gen).float()
    else:
        vals = torch.randn(n, generator=gen)
    return vals, idx


def _dense(v: torch.Tensor, i: torch.Tensor, numel: int) -> torch.Tensor:
    out = torch.zeros(numel, dtype=v.dtype)
    out.index_add_(0, i.long(), v)
    return out


def _reference_merge(v_a, i_a, v_b, i_b, k, numel):
    """Dense reference: sum, support = union, k largest |v| with ties -> lower index."""
    dense = _dense(v_a, i_a, numel) + _dense(v_b, i_b, numel)
    support = torch.unique(torch.cat([i_a, i_b]).long())
    keys = sorted(support.tolist(), key=lambda j: (-abs(float(dense[j])), j))
    kept = torch.tensor(sorted(keys[:k]), dtype=torch.long)
    dropped = torch.tensor(sorted(keys[k:]), dtype=torch.long)
    return dense, kept, dropped


def test_index_dtype() -> None:
    assert index_dtype(1) == torch.int32
    assert index_dtype(2**31 - 1) == torch.int32
    assert index_dtype(2**31) == torch.int64
    with pytest.raises(ValueError, match="numel=0"):
        index_dtype(0)
    with pytest.raises(TypeError, match="numel"):
        index_dtype(3.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("n_a,n_b,k", [(20, 20, 20), (30, 10, 15), (5, 5, 20), (0, 7, 3), (50, 50, 1)])
def test_merge_matches_dense_reference(ties: bool, n_a: int, n_b: int, k: int) -> None:
    numel = 64  # small index space: many shared indices
    gen = torch.Generator().manual_seed(n_a * 100 + n_b + k + int(ties))
    v_a, i_a = _sparse(gen, numel, n_a, ties)
    v_b, i_b = _sparse(gen, numel, n_b, ties)
    vals, idx, d_v, d_i = merge_sparse(v_a, i_a, v_b, i_b, k)
    dense, kept, dropped = _reference_merge(v_a, i_a, v_b, i_b, k, numel)
    assert idx.dtype == torch.int32 and d_i.dtype == torch.int32
    assert torch.equal(idx.long(), kept)
    assert torch.equal(vals, dense[kept])
    assert torch.equal(d_i.long(), dropped)
    assert torch.equal(d_v, dense[dropped])
    # kept + dropped is exactly the sum of the inputs
    assert torch.equal(_dense(vals, idx, numel) + _dense(d_v, d_i, numel), dense)


def test_merge_is_bitwise_symmetric_and_deterministic() -> None:
    gen = torch.Generator().manual_seed(3)
    v_a, i_a = _sparse(gen, 10_000, 500)
    v_b, i_b = _sparse(gen, 10_000, 500)
    one = merge_sparse(v_a, i_a, v_b, i_b, 400)
    two = merge_sparse(v_b, i_b, v_a, i_a, 400)
    again = merge_sparse(v_a, i_a, v_b, i_b, 400)
    for x, y, z in zip(one, two, again):
        assert torch.equal(x, y) and torch.equal(x, z)


def test_merge_tie_break_prefers_lower_index() -> None:
    v = torch.tensor([1.0, -1.0, 1.0, 1.0])
    i = torch.tensor([9, 3, 7, 1], dtype=torch.int32)
    vals, idx, d_v, d_i = merge_sparse(v, i, v.new_empty(0), i.new_empty(0), 2)
    assert idx.tolist() == [1, 3] and vals.tolist() == [1.0, -1.0]
    assert d_i.tolist() == [7, 9]


def test_coalesce_adds_in_argument_order() -> None:
    # three "ranks" share index 5; float addition order matters: (1e8 + 1) - 1e8 != 1 + (1e8 - 1e8)
    v = torch.tensor([1e8, 2.0, 1.0, -1e8, 3.0])
    i = torch.tensor([5, 0, 5, 5, 2])
    vals, idx = coalesce_sparse(v, i)
    assert idx.tolist() == [0, 2, 5]
    expected = (torch.tensor(1e8) + torch.tensor(1.0)) + torch.tensor(-1e8)
    assert vals[2] == expected and vals[:2].tolist() == [2.0, 3.0]


def test_merge_int64_indices_and_float64() -> None:
    v = torch.tensor([1.0, 2.0], dtype=torch.float64)
    i = torch.tensor([2**40, 5], dtype=torch.int64)
    vals, idx, _, _ = merge_sparse(v, i, v, i, 1)
    assert idx.dtype == torch.int64 and idx.tolist() == [5] and vals.tolist() == [4.0]
    _, idx2, _, _ = merge_sparse(v, i, v.new_empty(0), i.new_empty(0), 2)
    assert idx2.tolist() == [5, 2**40]


def test_merge_errors_name_the_problem() -> None:
    v, i = torch.ones(3), torch.arange(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="k=0"):
        merge_sparse(v, i, v, i, 0)
    with pytest.raises(ValueError, match="same length"):
        merge_sparse(v, i[:2], v, i, 2)
    with pytest.raises(TypeError, match="indices dtype"):
        merge_sparse(v, i.float(), v, i, 2)
    with pytest.raises(TypeError, match="dtypes differ"):
        merge_sparse(v, i, v.double(), i, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_merge_cuda_matches_cpu() -> None:
    gen = torch.Generator().manual_seed(5)
    v_a, i_a = _sparse(gen, 100_000, 5000, ties=True)
    v_b, i_b = _sparse(gen, 100_000, 5000, ties=True)
    cpu = merge_sparse(v_a, i_a, v_b, i_b, 3000)
    gpu = merge_sparse(v_a.cuda(), i_a.cuda(), v_b.cuda(), i_b.cuda(), 3000)
    for x, y in zip(cpu, gpu):
        assert torch.equal(x, y.cpu())


def test_top_magnitude_mask_equals_stable_sort_with_ties() -> None:
    """The O(n) selection keeps exactly what a stable sort by descending |v| keeps."""
    from gtopk_lab.compression.merge import top_magnitude_mask

    gen = torch.Generator().manual_seed(3)
    for _ in range(300):
        n = int(torch.randint(1, 200, (1,), generator=gen))
        k = int(torch.randint(1, n + 1, (1,), generator=gen))
        v = torch.randint(-3, 4, (n,), generator=gen).float()  # many ties, zeros included
        order = torch.sort(v.abs().neg(), stable=True).indices
        expected = torch.zeros(n, dtype=torch.bool)
        expected[order[:k]] = True
        assert torch.equal(top_magnitude_mask(v, k), expected)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64, torch.int16])
def test_coalesce_accepts_other_integer_index_dtypes(dtype: torch.dtype) -> None:
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    indices = torch.tensor([7, 2, 7, 5]).to(dtype)
    out_v, out_i = coalesce_sparse(values, indices)
    assert out_i.dtype == dtype
    assert out_i.to(torch.int64).tolist() == [2, 5, 7]
    assert out_v.tolist() == [2.0, 4.0, 4.0]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_stable_argsort_cpu_equals_torch_stable_sort(dtype: torch.dtype) -> None:
    """numpy's timsort/radix (the CPU path) gives the one permutation torch.sort(stable) gives."""
    from gtopk_lab.compression.merge import stable_argsort

    gen = torch.Generator().manual_seed(3)
    high = 3 if dtype == torch.uint8 else 50
    runs = [torch.randint(0, high, (n,), generator=gen).sort().values for n in (0, 1, 37, 500, 2000)]
    keys = [torch.cat(runs).to(dtype), torch.randint(0, high, (3000,), generator=gen).to(dtype)]
    if dtype != torch.uint8:  # full-range keys on both sides of torch's radix threshold (32768)
        info = torch.iinfo(dtype)
        for n in (20_000, 40_000):
            keys.append(torch.randint(info.min, info.max, (n,), generator=gen, dtype=dtype))
            keys.append(torch.randint(0, 2**31 - 1, (n,), generator=gen).to(dtype))
    for key in keys:
        got = stable_argsort(key)
        assert got.dtype == torch.int64
        assert torch.equal(got, torch.sort(key.to(torch.int64), stable=True).indices)


def test_kth_largest_equals_kthvalue_with_ties_nan_and_half() -> None:
    from gtopk_lab.compression.merge import kth_largest

    gen = torch.Generator().manual_seed(4)
    for x in (torch.randn(1001, generator=gen).abs(), torch.randint(0, 5, (400,), generator=gen).float(),
              torch.randn(300, generator=gen, dtype=torch.float64).abs(),
              torch.randn(64, generator=gen).abs().half()):
        for k in (1, 2, x.numel() // 2, x.numel()):
            got = kth_largest(x, k)
            assert got.dtype == x.dtype and got.item() == torch.kthvalue(x, x.numel() - k + 1).values.item()
    with_nan = torch.tensor([1.0, float("nan"), 3.0, 2.0])  # falls back to torch.kthvalue
    assert torch.equal(kth_largest(with_nan, 2), torch.kthvalue(with_nan, 3).values)


def _coalesce_then_select(v_a, i_a, v_b, i_b, k):
    """The former merge: coalesce the union, then a top-magnitude mask (independent path)."""
    from gtopk_lab.compression.merge import top_magnitude_mask

    dtype = i_a.dtype if i_a.dtype == i_b.dtype else torch.int64
    values, indices = coalesce_sparse(torch.cat([v_a, v_b]), torch.cat([i_a.to(dtype), i_b.to(dtype)]))
    keep = top_magnitude_mask(values, k)
    return values[keep], indices[keep], values[~keep], indices[~keep]


@pytest.mark.parametrize("ties", [False, True])
def test_merge_bitwise_equals_coalesce_then_select_and_torch_only_path(monkeypatch: pytest.MonkeyPatch,
                                                                      ties: bool) -> None:
    """The pair-add merge equals the coalesce + mask algorithm, with the numpy order
    statistics (CPU) and with torch's (what CUDA runs), bitwise, operands sorted or not."""
    import gtopk_lab.compression.merge as merge_mod

    gen = torch.Generator().manual_seed(5 + ties)
    cases = []
    for n_a, n_b, k in ((300, 300, 300), (500, 200, 100), (64, 64, 200), (1000, 1000, 1), (0, 50, 10)):
        (v_a, i_a), (v_b, i_b) = _sparse(gen, 2000, n_a, ties), _sparse(gen, 2000, n_b, ties)
        cases.append((v_a, i_a.sort().values, v_b, i_b, k))
    expected = [_coalesce_then_select(*c) for c in cases]
    fast = [merge_sparse(*c) for c in cases]
    monkeypatch.setattr(merge_mod, "stable_argsort", lambda key: torch.sort(key, stable=True).indices)
    monkeypatch.setattr(merge_mod, "kth_largest", lambda m, k: torch.kthvalue(m, m.numel() - k + 1).values)
    torch_only = [merge_sparse(*c) for c in cases]
    for exp, got_fast, got_torch in zip(expected, fast, torch_only):
        for e, f, t in zip(exp, got_fast, got_torch):
            assert e.dtype == f.dtype == t.dtype and torch.equal(e, f) and torch.equal(e, t)


def test_sort_by_index_reorders_only_unsorted_selections() -> None:
    from gtopk_lab.compression.merge import sort_by_index

    v, i = torch.tensor([3.0, -1.0, 2.0]), torch.tensor([7, 2, 5], dtype=torch.int32)
    sv, si = sort_by_index(v, i)
    assert si.tolist() == [2, 5, 7] and sv.tolist() == [-1.0, 2.0, 3.0]
    same_v, same_i = sort_by_index(sv, si)
    assert same_v is sv and same_i is si  # already canonical: no copy


@pytest.mark.timeout(30)
def test_a_nan_sum_ranks_with_inf_so_a_merge_of_two_k_sets_keeps_k() -> None:
    """torch.topk's rule (NaN above every number), the selectors' own: the NaN is kept, ties
    with +inf to the lower index, and exactly k are kept (an exact-k rank that sent fewer
    would leave its peers waiting)."""
    v_a = torch.tensor([1.0, float("nan"), 3.0, 0.5])
    i_a = torch.tensor([0, 2, 4, 6], dtype=torch.int32)
    v_b = torch.tensor([2.0, 1.0, float("inf"), 0.25])
    i_b = torch.tensor([1, 2, 5, 7], dtype=torch.int32)
    for kept_v, kept_i, drop_v, drop_i in (merge_sparse(v_a, i_a, v_b, i_b, 4),
                                           merge_sparse_torch(v_a, i_a, v_b, i_b, 4)):
        assert kept_i.tolist() == [1, 2, 4, 5] and torch.isnan(kept_v[1]) and kept_v[3] == float("inf")
        assert drop_i.tolist() == [0, 6, 7]
    kept_v, kept_i, _, _ = merge_sparse(v_a, i_a, v_b, i_b, 1)  # NaN and +inf tie: the lower index
    assert kept_i.tolist() == [2] and torch.isnan(kept_v[0])
