"""The compiled merge and sort (gtopk_lab.compression.fast_merge) equal the torch paths bitwise.

Oracle: ``merge_sparse_torch`` (the vectorised path every other merge test checks against
its own oracles) and a stable ``numpy.argsort``; inputs are adversarial for the tie rule
and the arithmetic: all-equal and two-valued magnitudes, +-0.0, +-inf, shared indices,
k above the union, empty operands; int64 indices (above 2**31) take the torch path.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gtopk_lab.compression import fast_merge
from gtopk_lab.compression.merge import merge_sparse, merge_sparse_torch, sort_by_index

pytestmark = pytest.mark.skipif(not fast_merge.HAVE_NUMBA, reason="needs numba")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def _same(got: tuple, want: tuple) -> bool:
    return all(a.dtype == b.dtype and torch.equal(_bits(a), _bits(b)) for a, b in zip(got, want))


def _operands(rng: np.random.Generator, trial: int) -> tuple[torch.Tensor, ...]:
    numel = int(rng.integers(1, 300))
    high = numel if trial % 5 else 2**40  # sparse over a huge buffer: int64 indices
    n_a, n_b = (int(rng.integers(0, min(numel, 80) + 1)) for _ in range(2))
    pool = rng.choice(numel, size=min(numel, n_a + n_b), replace=False) * (high // numel)
    # about half the entries shared: b draws from a's indices too
    i_a = np.sort(pool[:n_a])
    i_b = np.sort(np.unique(np.concatenate([pool[n_a:], rng.choice(i_a, size=len(i_a) // 2)
                                            if len(i_a) else np.empty(0, dtype=pool.dtype)])))
    kind = trial % 4
    draw = {0: lambda n: rng.standard_normal(n),
            1: lambda n: rng.integers(-2, 3, n).astype(float),       # many ties
            2: lambda n: np.full(n, rng.choice([1.0, -1.0, 0.0, -0.0])),  # all equal
            3: lambda n: rng.choice([0.0, -0.0, np.inf, 1.0, -1.0, 2.0], n)}[kind]
    dtype = torch.int64 if high > numel else torch.int32
    return (torch.tensor(draw(len(i_a)), dtype=torch.float32), torch.tensor(i_a, dtype=dtype),
            torch.tensor(draw(len(i_b)), dtype=torch.float32), torch.tensor(i_b, dtype=dtype))


@pytest.mark.timeout(120)
def test_compiled_merge_equals_torch_path_bitwise() -> None:
    rng = np.random.default_rng(18)
    taken = 0
    for trial in range(1500):
        ops = _operands(rng, trial)
        k = int(rng.integers(1, 120))
        want = merge_sparse_torch(*ops, k)
        if ops[1].dtype == torch.int64:  # the kernel takes int32 (the wire's) only
            assert not fast_merge.merge_applies(*ops)
            assert _same(merge_sparse(*ops, k), want)
            continue
        assert fast_merge.merge_applies(*ops)
        got = fast_merge.numba_merge(*ops, k)
        if got is None:  # declined: only for a NaN sum (inf + -inf here)
            assert any(bool(torch.isnan(t).any()) for t in want[::2]), trial
            continue
        taken += 1
        assert _same(got, want), f"trial {trial}"
        assert _same(merge_sparse(*ops, k), want)
    assert taken > 900


@pytest.mark.timeout(120)
def test_compiled_merge_of_large_unions_equals_torch_path_bitwise() -> None:
    """Unions from fast_merge._WIDE_MIN entries on take the two-digit select whose histogram
    the merge builds: the same result, on draws that crowd one top-16-bit bin (equal
    exponent and high mantissa: the low 15 bits decide), all-equal and few-valued
    magnitudes, +-inf, k from 1 to above the union, and a NaN sum declined."""
    rng = np.random.default_rng(1818)
    wide = 0
    for trial in range(48):
        numel = int(rng.choice([40_000, 1_000_000]))
        n_a, n_b = (int(rng.integers(3000, 16_000)) for _ in range(2))
        i_a = np.sort(rng.choice(numel, size=n_a, replace=False))
        i_b = np.sort(np.unique(np.concatenate([rng.choice(numel, size=n_b, replace=False),
                                                rng.choice(i_a, size=n_a // 4)])))
        kind = trial % 6
        draw = {0: lambda n: rng.standard_normal(n),
                1: lambda n: rng.integers(-2, 3, n).astype(float),
                2: lambda n: np.full(n, rng.choice([1.0, -1.0, 0.0])),
                3: lambda n: rng.choice([0.0, -0.0, np.inf, 1.0, -1.0, 2.0], n),
                # one top bin: 1 + m * 2**-23 with m < 2**15, either sign
                4: lambda n: (1.0 + rng.integers(0, 2**15, n) * 2.0**-23) * rng.choice([-1.0, 1.0], n),
                5: lambda n: rng.standard_normal(n) * 1e-30}[kind]
        v_a = torch.tensor(draw(n_a), dtype=torch.float32)
        v_b = torch.tensor(draw(len(i_b)), dtype=torch.float32)
        ops = (v_a, torch.tensor(i_a, dtype=torch.int32), v_b, torch.tensor(i_b, dtype=torch.int32))
        union = len(np.union1d(i_a, i_b))
        k = int(rng.choice([1, 2, union // 3, union // 2, union - 1, union, union + 5]))
        k = max(k, 1)
        want = merge_sparse_torch(*ops, k)
        got = fast_merge.numba_merge(*ops, k)
        if got is None:
            assert any(bool(torch.isnan(t).any()) for t in want[::2]), trial
            continue
        wide += union >= fast_merge._WIDE_MIN and union > k
        assert _same(got, want), f"trial {trial} kind {kind} k {k} union {union}"
    assert wide >= 25
    v = torch.ones(9000)
    i = torch.arange(9000, dtype=torch.int32)
    w = v.clone()
    w[4000] = -float("inf")
    v[4000] = float("inf")  # inf + -inf: the one NaN sum
    assert fast_merge.numba_merge(v, i, w, i + 0, 100) is None
    assert fast_merge.numba_merge(v, i, torch.ones(9000), i + 0, 100) is not None  # inf + 1


@pytest.mark.timeout(120)
def test_the_small_select_is_the_kth_largest_key_and_its_ties() -> None:
    """The select of unions below _WIDE_MIN (11-bit digits over the candidates' own range,
    the last <= 512 sorted) against a sort: keys crowded in one exponent, two exponents, a
    few values, all equal, spread over every magnitude (0 to +inf's key), n across the sort
    threshold and up to _WIDE_MIN, k from 1 to n."""
    fast_merge.compiled_kernel("merge")  # jits the select
    rng = np.random.default_rng(77)
    draws = [lambda n: rng.standard_normal(n) * 4.0,
             lambda n: 3.3 + rng.random(n) * 1.5,                    # two exponents, crowded
             lambda n: 1.0 + rng.integers(0, 2**12, n) * 2.0**-23,   # one exponent, low bits decide
             lambda n: rng.integers(0, 4, n).astype(float),           # few values: ties at the cut
             lambda n: np.full(n, 2.5),                               # all equal
             lambda n: rng.choice([0.0, 1e-38, 1e-3, 1.0, 1e30, np.inf], n)]
    for trial in range(240):
        n = int(rng.choice([1, 2, 511, 512, 513, 700, 2000, 4097, fast_merge._WIDE_MIN - 1]))
        keys = np.abs(draws[trial % len(draws)](n)).astype(np.float32).view(np.uint32)
        k = min(n, int(rng.choice([1, 2, max(1, n // 3), max(1, n // 2), n])))
        ordered = np.sort(keys)[::-1]
        t = ordered[k - 1]
        got = fast_merge._kth_largest_key(keys, k, keys.max(), keys.min())
        assert (int(got[0]), int(got[1])) == (int(t), int(np.sum(ordered[:k] == t))), (trial, n, k)


@pytest.mark.timeout(120)
def test_compiled_merge_of_mid_size_unions_equals_torch_path_bitwise() -> None:
    """Unions of 600 to 8,000 entries (the small select's radix digits, not only its sort):
    top-k-like operands (magnitudes crowding one or two exponents), few values, all equal."""
    rng = np.random.default_rng(606)
    for trial in range(40):
        n_a, n_b = (int(rng.integers(300, 4000)) for _ in range(2))
        i_a = np.sort(rng.choice(1_000_000, size=n_a, replace=False))
        i_b = np.sort(np.unique(np.concatenate([rng.choice(1_000_000, size=n_b, replace=False),
                                                rng.choice(i_a, size=n_a // 3)])))
        draw = [lambda n: (3.3 + rng.random(n) * 1.5) * rng.choice([-1.0, 1.0], n),
                lambda n: rng.standard_normal(n),
                lambda n: rng.integers(-3, 4, n).astype(float),
                lambda n: np.full(n, -1.5)][trial % 4]
        ops = (torch.tensor(draw(n_a), dtype=torch.float32), torch.tensor(i_a, dtype=torch.int32),
               torch.tensor(draw(len(i_b)), dtype=torch.float32), torch.tensor(i_b, dtype=torch.int32))
        union = len(np.union1d(i_a, i_b))
        assert 512 < union < fast_merge._WIDE_MIN
        k = int(rng.choice([1, union // 4, union // 2, union - 1]))
        got = fast_merge.numba_merge(*ops, k)
        assert got is not None and _same(got, merge_sparse_torch(*ops, k)), (trial, union, k)


@pytest.mark.timeout(60)
def test_declines_non_canonical_operands_and_falls_back(monkeypatch) -> None:
    v = torch.tensor([3.0, -1.0, 2.0])
    i = torch.tensor([5, 1, 9], dtype=torch.int32)  # not ascending
    w, j = torch.tensor([1.0, 4.0]), torch.tensor([1, 7], dtype=torch.int32)
    assert fast_merge.numba_merge(v, i, w, j, 2) is None
    repeated = torch.tensor([1, 1], dtype=torch.int32)  # ascending, not strictly
    assert fast_merge.numba_merge(w, repeated, w, j, 2) is None
    assert fast_merge.numba_merge(w, j, w, repeated, 2) is None
    assert _same(merge_sparse(v, i, w, j, 2), merge_sparse_torch(v, i, w, j, 2))
    nan = torch.tensor([float("nan"), 1.0])
    assert fast_merge.numba_merge(nan, j, w, j, 1) is None
    monkeypatch.setenv(fast_merge.FAST_MERGE_ENV, "0")
    assert not fast_merge.merge_applies(w, j, w, j) and fast_merge.numba_sort_by_index(v, i) is None


@pytest.mark.timeout(60)
def test_compiled_sort_by_index_is_the_stable_sort() -> None:
    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(2, 9000))
        # 8-bit digits below 4096 entries, 13-bit above; 1 to 4 digit passes; duplicates when high is small; every 5th input ascending
        high = int(rng.choice([3, 1000, 2**13, 2**13 + 1, 2**25, 2**31 - 1]))
        dtype = torch.int32
        i = torch.tensor(rng.integers(0, high, n), dtype=dtype)
        if trial % 5 == 0:
            i = torch.unique(i)
            v = torch.tensor(rng.standard_normal(i.numel()), dtype=torch.float32)
            got = fast_merge.numba_sort_by_index(v, i)
            assert got is not None and torch.equal(got[1], i) and torch.equal(_bits(got[0]), _bits(v))
            assert got[0] is v and got[1] is i  # already ascending: the input, as sort_by_index's
            continue
        v = torch.tensor(rng.standard_normal(n), dtype=torch.float32)
        got = fast_merge.numba_sort_by_index(v, i)
        assert got is not None
        perm = np.argsort(i.numpy(), kind="stable")
        assert torch.equal(got[1], i[perm]) and torch.equal(_bits(got[0]), _bits(v[perm]))
        assert _same(sort_by_index(v, i), got)
    assert fast_merge.numba_sort_by_index(torch.ones(2), torch.tensor([-1, 1], dtype=torch.int32)) is None
    assert fast_merge.numba_sort_by_index(torch.ones(2), torch.tensor([2, 1])) is None  # int64: torch path


@pytest.mark.timeout(60)
def test_the_sort_kernel_with_a_bits_hint_is_the_stable_sort_whatever_the_hint() -> None:
    """The hint (the indices' bit count, from the vector's length) picks the digit width
    only: right, too small (an index beyond it) or too large, the result is the stable sort."""
    sort = fast_merge.compiled_kernel("sort")
    rng = np.random.default_rng(70)
    for trial in range(200):
        n = int(rng.integers(2, 9000))
        high = int(rng.choice([3, 1000, 2**13 + 1, 2**20, 2**25, 2**31 - 1]))
        i = rng.integers(0, high, n).astype(rng.choice([np.int32, np.int64]))
        v = rng.standard_normal(n).astype(np.float32)
        true_bits = fast_merge.index_bits(high)
        hint = int(rng.choice([true_bits, 1, max(1, true_bits - 3), true_bits + 5, 31]))
        lo, hi, ascending, sv, si = sort(v, i, hint)
        perm = np.argsort(i, kind="stable")
        assert (lo, hi) == (i.min(), i.max()) and ascending == bool(np.all(np.diff(i) > 0))
        if ascending:  # left where it is (n = 2 draws may come ascending)
            continue
        assert np.array_equal(si, i[perm].astype(np.int32)) and np.array_equal(sv.view(np.int32),
                                                                                 v[perm].view(np.int32)), (trial, hint)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_canonical_wire_is_the_range_check_conversion_and_stable_sort(index_dtype, monkeypatch) -> None:
    from gtopk_lab.compression.merge import canonical_wire

    rng = np.random.default_rng(11)
    for trial in range(60):
        numel = int(rng.choice([7, 5000, 25_000_000]))
        n = int(rng.integers(1, min(numel, 6000) + 1))
        i = torch.tensor(rng.choice(numel, size=n, replace=False), dtype=index_dtype)
        if trial % 6 == 0:
            i = torch.sort(i).values  # already ascending
        v = torch.tensor(rng.standard_normal(n), dtype=torch.float32)
        perm = np.argsort(i.numpy(), kind="stable")
        want = (v[perm], i[perm].to(torch.int32))
        got = canonical_wire(v, i, numel)
        assert _same(got, want) and got[1].is_contiguous()
        monkeypatch.setenv(fast_merge.FAST_MERGE_ENV, "0")  # the torch path: the same
        assert _same(canonical_wire(v, i, numel), want)
        monkeypatch.delenv(fast_merge.FAST_MERGE_ENV)
    # out of range: check_sparse's one line, from either path
    for bad in ([3, -1, 2], [0, 9, 4]):
        i = torch.tensor(bad, dtype=index_dtype)
        with pytest.raises(ValueError) as fast_error:
            canonical_wire(torch.ones(3), i, 9, name="x")
        monkeypatch.setenv(fast_merge.FAST_MERGE_ENV, "0")
        with pytest.raises(ValueError) as torch_error:
            canonical_wire(torch.ones(3), i, 9, name="x")
        monkeypatch.delenv(fast_merge.FAST_MERGE_ENV)
        assert str(fast_error.value) == str(torch_error.value)
        assert str(fast_error.value).startswith("x: indices range [") and "numel=9" in str(fast_error.value)
    # above 2**31 elements the wire keeps int64 indices: the torch path
    big = torch.tensor([2**33, 5], dtype=torch.int64)
    got = canonical_wire(torch.tensor([1.0, 2.0]), big, 2**34)
    assert got[1].dtype == torch.int64 and got[1].tolist() == [5, 2**33] and got[0].tolist() == [2.0, 1.0]


@pytest.mark.timeout(120)
def test_many_merges_in_one_call_equal_the_torch_path_pair_by_pair() -> None:
    """``numba_merge_many`` (one level of the simulator's gTop-k) against
    ``merge_sparse_torch`` of each pair: 200 groups of 1-40 pairs of unequal lengths, ties,
    +-0.0 and inf; a group with a pair the kernel declines (not ascending, a NaN sum) or
    int64 indices is None, so callers merge pair by pair."""
    from gtopk_lab.compression.fast_merge_many import numba_merge_many

    rng = np.random.default_rng(29)
    pairs_checked = 0
    for group in range(200):
        k = int(rng.integers(1, 120))
        pairs = []
        while len(pairs) < int(rng.integers(1, 41)):
            ops = _operands(rng, int(rng.integers(0, 10_000)))
            if ops[1].dtype == torch.int32:
                pairs.append(ops)
        got = numba_merge_many(pairs, k)
        assert got is not None and len(got) == len(pairs)
        for ops, out in zip(pairs, got):
            assert _same(out, merge_sparse_torch(*ops, k)), (group, ops, k)
            pairs_checked += 1
    assert pairs_checked > 1000
    ok = _operands(np.random.default_rng(1), 1)
    v, i = torch.tensor([1.0, 2.0]), torch.tensor([5, 3], dtype=torch.int32)  # not ascending
    assert numba_merge_many([ok, (v, i, v, i)], 1) is None
    nan = (torch.tensor([np.inf]), torch.tensor([0], dtype=torch.int32),
           torch.tensor([-np.inf]), torch.tensor([0], dtype=torch.int32))
    assert numba_merge_many([ok, nan], 1) is None
    wide = tuple(t.to(torch.int64) if t.dtype == torch.int32 else t for t in ok)
    assert numba_merge_many([ok, wide], 1) is None


@pytest.mark.timeout(120)
def test_a_whole_reduction_in_one_call_equals_the_torch_path_level_by_level() -> None:
    """``numba_reduce_levels`` (every level of the simulator's gTop-k reduction) against a
    reduction written here: for half = 1, 2, 4, ...: ``vec[s] = merge_sparse_torch(vec[s],
    vec[s + half])`` for s = 0, 2 half, ... with s + half < n, every merge's result kept and
    dropped in that order; n = 2 .. 33 vectors of unequal lengths, ties, +-0.0 and inf."""
    from gtopk_lab.compression.fast_merge_many import numba_reduce_levels, reduction_levels

    rng = np.random.default_rng(31)
    for trial in range(120):
        n, k = int(rng.integers(2, 34)), int(rng.integers(1, 90))
        vectors: list[tuple[torch.Tensor, torch.Tensor]] = []
        while len(vectors) < n:
            ops = _operands(rng, int(rng.integers(0, 10_000)))
            if ops[1].dtype == torch.int32:
                vectors.append((ops[0], ops[1]))
        want, vec, half = [], list(vectors), 1
        while half < n:
            for s in range(0, n - half, 2 * half):
                out = merge_sparse_torch(*vec[s], *vec[s + half], k)
                want.append(out)
                vec[s] = (out[0], out[1])
            half *= 2
        # the operands as the caller's one concatenation (packed) on every other trial
        packed = ((torch.cat([v for v, _ in vectors]), torch.cat([i for _, i in vectors]))
                  if trial % 2 else None)
        got = numba_reduce_levels(vectors, k, packed=packed)
        assert got is not None and len(got) == n - 1 == len(want)
        assert [len(level) for level in reduction_levels(n)] == [
            len(range(0, n - h, 2 * h)) for h in (2 ** r for r in range((n - 1).bit_length()))]
        for j, (g, w) in enumerate(zip(got, want)):
            assert _same(g, w), (trial, j, n, k)
    ok = _operands(np.random.default_rng(1), 1)[:2]
    v, i = torch.tensor([1.0, 2.0]), torch.tensor([5, 3], dtype=torch.int32)  # not ascending
    assert numba_reduce_levels([ok, ok, (v, i)], 1) is None
    assert numba_reduce_levels([ok, (ok[0], ok[1].to(torch.int64))], 1) is None
    assert numba_reduce_levels([ok], 1) is None
    # a packed pair that is not the vectors' concatenation (its length differs) is not read
    short = (ok[0][:-1], ok[1][:-1])
    assert all(_same(g, w) for g, w in zip(numba_reduce_levels([ok, ok, ok], 1, packed=short),
                                           numba_reduce_levels([ok, ok, ok], 1)))
