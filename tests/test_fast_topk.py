"""Tests of the ``topk-fast`` selector (gtopk_lab.compression.fast_topk).

The oracle is independent of the implementation: numpy ``lexsort`` on (-|x|, index) in
float64 (exact for fp32/fp16/bf16), first k indices, ascending.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings

import numpy as np
import pytest
import torch

import gtopk_lab.compression.fast_topk as ft
import gtopk_lab.compression.fast_topk_kernels as kern
from gtopk_lab.compression.merge import index_dtype
from gtopk_lab.compression.selection import get_selector, selects_exactly_k

pytestmark = pytest.mark.timeout(60)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
needs_numba = pytest.mark.skipif(not ft.HAVE_NUMBA, reason="numba is not installed")


def oracle(x: torch.Tensor, k: int) -> np.ndarray:
    """Indices of a stable sort on (-|x|, index), first k, ascending."""
    mag = np.abs(x.detach().cpu().double().numpy())
    order = np.lexsort((np.arange(mag.size), -mag))
    return np.sort(order[:k])


@pytest.fixture(scope="module", autouse=True)
def warm_up() -> None:
    """numba compiles each kernel on first use (seconds): once per module, not per test."""
    if not ft.HAVE_NUMBA:
        return
    for dtype in DTYPES:
        for n, k in ((3000, 2), (3000, 1000)):  # grouped and per-entry histograms
            ft.numba_select(torch.randn(n).to(dtype), k)


def _check_against_oracle(x: torch.Tensor, k: int, select=ft.fast_topk_select) -> None:
    values, idx = select(x, k)
    assert idx.dtype == index_dtype(x.numel())
    assert idx.numel() == k
    np.testing.assert_array_equal(idx.numpy(), oracle(x, k))
    assert values.dtype == x.dtype
    expected = x[idx.long()]
    assert torch.equal(values, expected)
    assert torch.equal(torch.signbit(values), torch.signbit(expected))  # signed values, -0.0 kept


def _both_paths(x: torch.Tensor, k: int) -> None:
    _check_against_oracle(x, k)
    _check_against_oracle(x, k, ft.torch_select)


def _inputs(n: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    normal = torch.randn(n, generator=gen)
    return {
        "normal": normal,
        "shifted_negative": normal * 1e-3 - 5.0,
        "cauchy": torch.distributions.Cauchy(0.0, 1.0).sample((n,)),
        "student_t2": torch.distributions.StudentT(2.0).sample((n,)),
        "all_equal": torch.full((n,), -1.5),
        "two_values": torch.where(torch.rand(n, generator=gen) < 0.3, 2.0, -1.0),
        "many_zeros": normal * (torch.rand(n, generator=gen) < 0.01),
        "all_zeros": torch.zeros(n),
        "signed_zeros": torch.where(torch.rand(n, generator=gen) < 0.5, 0.0, -0.0),
        "tiny_and_huge": normal * torch.where(torch.rand(n, generator=gen) < 0.5, 1e-30, 1e30),
        "integers": torch.randint(-3, 4, (n,), generator=gen).float(),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 1023, 1024, 1025, 5000, 70_001])
def test_matches_stable_sort_oracle(dtype: torch.dtype, n: int) -> None:
    for name, x in _inputs(n, seed=n).items():
        x = x.to(dtype)
        for k in sorted({1, 2, max(1, n // 1000), max(1, n // 64), n // 64 + 1, n // 3, n - 1, n}):
            if 1 <= k <= n:
                try:
                    _both_paths(x, k)
                except AssertionError as exc:
                    raise AssertionError(f"{name} dtype={dtype} n={n} k={k}") from exc


def test_one_million_heavy_tails() -> None:
    n = 1_000_000
    for name, x in _inputs(n, seed=1).items():
        if name in ("normal", "cauchy", "many_zeros", "two_values"):
            for k in (1, 1000, 20_000):
                _check_against_oracle(x, k)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_k_around_histogram_bin_edges(dtype: torch.dtype) -> None:
    """k one below, at and one above the count of entries at or above a bin edge."""
    n = 200_000
    x = torch.randn(n, generator=torch.Generator().manual_seed(3)).to(dtype)
    bits = x.view(torch.int32 if dtype == torch.float32 else torch.int16).long()
    key = bits & (0x7FFFFFFF if dtype == torch.float32 else 0x7FFF)
    shift = 16 if dtype == torch.float32 else 0
    bins = key >> shift
    top = torch.sort(torch.unique(bins), descending=True).values
    for b in top[[0, 1, 3, 10, 30]].tolist():
        count = int((bins >= b).sum())
        for k in (count - 1, count, count + 1):
            if 1 <= k <= n:
                _check_against_oracle(x, k)
    # exact powers of two sit on the edges of fp32 bins; put them in shared and split groups
    x = torch.zeros(n)
    x[::7] = 1.0
    x[::29] = -2.0
    x[5::1024] = 4.0
    for k in (1, 195, 196, 197, 6896, 6897, 6898, 28_571, 28_572, 28_573, 35_000):
        _check_against_oracle(x.to(dtype), k)


def test_ties_broken_by_lowest_index_and_signed_zeros() -> None:
    """All-equal input: the first k indices (torch.topk's tie order is unspecified)."""
    for dtype in DTYPES:
        x = torch.full((100_000,), 0.25, dtype=dtype)
        x[::2] *= -1
        _, idx = ft.fast_topk_select(x, 777)
        assert torch.equal(idx.long(), torch.arange(777))
        # -0.0 and 0.0 have equal magnitude: a tie, broken by index
        z = torch.tensor([0.0, -0.0, 0.0, -0.0, 1.0], dtype=dtype)
        values, idx = ft.fast_topk_select(z, 3)
        assert idx.tolist() == [0, 1, 4]
        assert torch.signbit(values).tolist() == [False, True, False]


def test_registered_and_exact_k() -> None:
    sel = get_selector("topk-fast")
    assert selects_exactly_k("topk-fast")
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    values, idx = sel(x, 10)
    np.testing.assert_array_equal(idx.numpy(), oracle(x, 10))
    assert torch.equal(values, x[idx.long()])
    # same set as exactk-threshold and torch.topk on tie-free data
    _, ref = get_selector("exactk-threshold")(x, 10)
    assert torch.equal(torch.sort(ref.long()).values, idx.long())


def test_input_not_modified_and_strided_and_grad() -> None:
    base = torch.randn(20_000, generator=torch.Generator().manual_seed(5))
    x = base[::2]  # non-contiguous
    before = base.clone()
    _check_against_oracle(x, 50)
    assert torch.equal(base, before)
    y = torch.randn(5000, requires_grad=True)
    values, idx = ft.fast_topk_select(y, 5)
    np.testing.assert_array_equal(idx.numpy(), oracle(y, 5))


def test_errors() -> None:
    for select in (ft.fast_topk_select, ft.torch_select):
        with pytest.raises(ValueError, match="k=0"):
            select(torch.randn(10), 0)
        with pytest.raises(ValueError, match="k=11.*numel=10"):
            select(torch.randn(10), 11)
        with pytest.raises(ValueError, match="1-D"):
            select(torch.randn(3, 3), 2)
        with pytest.raises(TypeError, match="floating"):
            select(torch.arange(10), 2)


def test_other_dtypes_use_the_torch_path() -> None:
    x = torch.randn(5000, dtype=torch.float64)
    x[100:200] = 7.0  # ties
    for k in (1, 150, 4999):
        _check_against_oracle(x, k)
    if ft.HAVE_NUMBA:
        with pytest.raises(TypeError, match="float64"):
            ft.numba_select(x, 3)


def _fresh_copy(module, name: str):
    spec = importlib.util.spec_from_file_location(name, module.__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fallback_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh copy of the module imported while numba is unimportable uses torch only."""
    monkeypatch.setitem(sys.modules, "numba", None)
    kernels = _fresh_copy(kern, "fast_topk_kernels_without_numba")
    monkeypatch.setitem(sys.modules, kern.__name__, kernels)
    monkeypatch.setattr(sys.modules["gtopk_lab.compression"], "fast_topk_kernels", kernels)
    mod = _fresh_copy(ft, "fast_topk_without_numba")
    assert not mod.HAVE_NUMBA
    x = torch.randn(30_000, generator=torch.Generator().manual_seed(2)).to(torch.float16)
    for k in (1, 30, 29_999):
        _check_against_oracle(x, k, mod.fast_topk_select)
    with pytest.raises(RuntimeError, match="needs numba"):
        mod.numba_select(x, 3)


@needs_numba
def test_no_writable_numba_cache_compiles_without_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no cache locator (read-only source tree and cache dirs) numba raises at
    decoration; kern.jit warns and compiles uncached instead."""
    import numba.core.config

    # a locator that only applies to IPython cells: none is found, as when nothing is writable
    monkeypatch.setattr(numba.core.config, "CACHE_LOCATOR_CLASSES", "IPythonCacheLocator")

    def twice(a: int) -> int:
        return 2 * a

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = kern.jit(twice)
    assert any("cache unavailable" in str(w.message) for w in caught)
    assert fn(21) == 42


@needs_numba
def test_numba_and_torch_paths_agree_on_group_layouts() -> None:
    """Groups are strided (lane l of a 1024-entry chunk): hits in one group, in many groups,
    and in the tail after the last full chunk."""
    n = 3 * 1024 + 100
    for pos in ([0, 64, 128], [5, 6, 7, 8], [3 * 1024 + 1, 3 * 1024 + 99], [1023, 1024, 2047]):
        x = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 1e-3
        x[pos] = 10.0
        for k in (1, len(pos), len(pos) + 1, n // 64):
            _check_against_oracle(x, k, ft.numba_select)
            _check_against_oracle(x, k, ft.torch_select)


def key_oracle(x: torch.Tensor, k: int) -> np.ndarray:
    """Indices of a stable sort on (-key, index), key = the bit pattern without its sign:
    |x| order with NaN above +inf, the numba path's documented NaN rule."""
    if x.dtype == torch.float32:
        key = x.view(torch.int32).numpy().astype(np.int64) & 0x7FFFFFFF
    else:
        key = x.view(torch.int16).numpy().astype(np.int64) & 0x7FFF
    order = np.lexsort((np.arange(key.size), -key))
    return np.sort(order[:k])


def _layered(n: int, seed: int) -> torch.Tensor:
    """A gradient-like vector: layers of very different scales and sizes (a small layer
    of large entries can sit inside one sample block, or between two)."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [7, 300, 5000, 40_000, 1000, n // 2]
    parts, scale = [], 1.0
    for size in sizes:
        parts.append(torch.randn(size, generator=gen) * scale)
        scale *= 1e-2 if scale > 1e-3 else 1e4
    parts.append(torch.randn(n - sum(sizes), generator=gen) * 1e-3)
    return torch.cat(parts)


@needs_numba
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sampled_threshold_path_on_large_adversarial_inputs(dtype: torch.dtype) -> None:
    """Sizes above _SAMPLE_MIN_NUMEL take the sampled threshold (step 1); the result is
    the stable-sort oracle's whatever the sample saw."""
    n = ft._SAMPLE_MIN_NUMEL * 2 + 12_345
    gen = torch.Generator().manual_seed(11)
    normal = torch.randn(n, generator=gen)
    spikes = torch.zeros(n)
    spikes[(torch.arange(50) * 997 + 3) % n] = 5.0  # few, isolated, tied
    inputs = {
        "layered": _layered(n, 4),
        "spikes_on_zeros": spikes,
        "spikes_on_noise": normal * 1e-3 + spikes,
        "ascending": torch.linspace(-1.0, 1.0, n),
        "all_equal": torch.full((n,), 3.0),
        "signed_zeros": torch.where(torch.rand(n, generator=gen) < 0.5, 0.0, -0.0),
        "denormals": normal * 1e-41,
        "infinities": torch.where(torch.rand(n, generator=gen) < 1e-3, float("inf"), 1.0) * normal.sign(),
        "integers": torch.randint(-3, 4, (n,), generator=gen).float(),
    }
    for name, x in inputs.items():
        x = x.to(dtype)
        for k in (1, 7, n // 1000, n // 64):
            try:
                _check_against_oracle(x, k)
            except AssertionError as exc:
                raise AssertionError(f"{name} dtype={dtype} k={k}") from exc


@needs_numba
def test_large_block_of_big_entries_between_sample_blocks() -> None:
    """Big entries in the gaps between sample blocks: the sample sets T far too low, the
    candidates overflow their buffer and the threshold rises (step 2) until k remain."""
    n = 1 << 20
    x = torch.randn(n, generator=torch.Generator().manual_seed(6)) * 1e-3
    block, k = ft._SAMPLE_BLOCK, 1000
    fraction = min(ft._SAMPLE_MAX_FRACTION, ft._SAMPLE_HITS / k)
    nblocks = max(1, round(n * fraction / block))
    sampled = torch.zeros(n, dtype=torch.bool)
    for s in range(nblocks):
        base = (s * (n - block) // max(nblocks - 1, 1)) & ~31
        sampled[base:base + block] = True
    x[n // 4:][~sampled[n // 4:]] = 2.0  # ~700k ties above everything the sample saw
    for k_ in (1, k, 300_000):
        _check_against_oracle(x, k_)


@needs_numba
def test_compaction_raises_its_threshold_when_the_buffer_fills() -> None:
    """compact() from T = 0 (every entry a candidate) with room for k + 3 chunks: it keeps
    the k first of the stable order each time the buffer fills; the result is the oracle's."""
    gen = torch.Generator().manual_seed(8)
    for x in (torch.randn(100_003, generator=gen), torch.full((50_000,), 1.0),
              torch.randint(0, 5, (70_001,), generator=gen).float()):
        u, mask, _ = ft._key_view(x)
        for k in (1, 100, 5000):
            idx = np.empty(k + 3 * kern.CHUNK, np.int32)
            key = np.empty(idx.size, np.uint32)
            c, _ = kern.compact(u, mask, 0, k, idx, key)
            assert k <= c <= idx.size - kern.CHUNK
            assert np.all(np.diff(idx[:c]) > 0)  # index order kept through the raises
            out, out_key = np.empty(k, np.int32), np.empty(k, np.uint32)
            assert kern.keep_first(idx, key, c, k, out, out_key)[0] == k
            np.testing.assert_array_equal(out, oracle(x, k))


@needs_numba
def test_threshold_too_high_falls_back_to_the_exact_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample that aims above every entry leaves fewer than k candidates (step 3)."""
    monkeypatch.setattr(ft, "_SAMPLE_SIGMAS", -1e9)
    x = torch.randn(ft._SAMPLE_MIN_NUMEL + 5, generator=torch.Generator().manual_seed(9))
    u, mask, shift = ft._key_view(x)
    assert ft._sampled_threshold(u, mask, shift, 300)[0] > int(u.max() & mask)
    for k in (1, 300, 4000):
        _check_against_oracle(x, k)


@needs_numba
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_ranks_above_infinity(dtype: torch.dtype) -> None:
    for n in (5000, ft._SAMPLE_MIN_NUMEL + 1):
        x = torch.randn(n, generator=torch.Generator().manual_seed(n))
        x[[10, n // 2, n - 1]] = float("nan")
        x[[11, 12]] = float("-inf")
        x[13] = float("inf")
        x = x.to(dtype)
        for k in (1, 3, 5, 6, n // 100):
            np.testing.assert_array_equal(ft.numba_select(x, k)[1].numpy(), key_oracle(x, k))


@needs_numba
def test_int64_index_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs of 2**31 entries or more take int64 index buffers (too large to allocate in a
    test): the same kernels compiled for int64 indices give the oracle's set."""
    monkeypatch.setattr(ft, "index_dtype", lambda numel: torch.int64)
    x = torch.randn(ft._SAMPLE_MIN_NUMEL + 77, generator=torch.Generator().manual_seed(10))
    for k in (1, 500, 20_000):
        values, idx = ft.numba_select(x, k)
        assert idx.dtype == torch.int64
        np.testing.assert_array_equal(idx.numpy(), oracle(x, k))
        assert torch.equal(values, x[idx])


@needs_numba
def test_k_equal_numel_and_tiny_sizes() -> None:
    for n in (1, 2, 3):
        x = torch.tensor([-0.0, 0.0, -1.0][:n])
        for k in range(1, n + 1):
            _check_against_oracle(x, k, ft.numba_select)
    x = torch.randn(ft._SAMPLE_MIN_NUMEL + 3)
    _check_against_oracle(x, x.numel(), ft.numba_select)
    _check_against_oracle(x, x.numel() - 1, ft.numba_select)
