"""gTop-k's exact-k hot path over the project's links (gtopk_lab.comm.gtopk_links): on real
gloo ranks it returns what the general path (the per-rank program under the recorder and
the same links) returns, bitwise, with every CommStats field the same, for both algorithms,
folds included (P = 3), on shared memory and on TCP, and on the inputs that leave the
kernels: int64 or already-ascending indices, a merge whose sum is NaN (kept, k of them, so no
rank breaks exact-k's promise and leaves its peers waiting), a bad index (the same one-line
error). The drops are checked against an oracle written here: kept + dropped is the
sum of the inputs."""

from __future__ import annotations

import math

import pytest
import torch

from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.comm.shm_ring import shm_supported

NUMEL, K = 50_000, 300

FIELDS = ("collective", "algorithm", "bytes_sent", "bytes_recv", "messages", "rounds", "steps", "peers",
          "merged_elements", "library_estimate")


def _selection(rank: int, case: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s exact-k selection for ``case`` (values, indices; unsorted unless the
    case says so). Overlapping supports so that merges add and drop."""
    g = torch.Generator().manual_seed(31 + rank)
    idx = torch.randperm(NUMEL // 10, generator=g)[:K] * 10 + (rank % 3)
    if case == "overlap":
        idx = torch.randperm(2 * K, generator=g)[:K]
    vals = torch.randn(K, generator=g)
    if case == "int64":
        return vals, idx.long()
    if case == "ascending":
        order = idx.argsort()
        return vals[order], idx[order].int()
    if case == "nan" and rank == 0:
        vals[0] = float("nan")
    if case == "grad":
        vals = vals.requires_grad_()
    return vals, idx.int()


def _call(case: str, algorithm: str, lean: bool) -> tuple:
    from gtopk_lab.comm import torch_dist
    from gtopk_lab.comm.gtopk_links import applies

    from gtopk_lab.comm.gtopk_links import gtopk_over_links

    rank = torch.distributed.get_rank()
    taken: list[int] = []

    def counted(*args):
        taken.append(1)
        return gtopk_over_links(*args)

    torch_dist.over_links_applies = applies if lean else (lambda *a: False)  # type: ignore[assignment]
    torch_dist.gtopk_over_links = counted  # type: ignore[assignment]
    values, indices = _selection(rank, case)
    try:
        r = torch_dist.gtopk_allreduce(values, indices, NUMEL, K, algorithm=algorithm, exact_k=True)
    except ValueError as exc:
        return ("error", str(exc))
    st = r.stats
    return (r.values, r.indices, st.dropped_values, st.dropped_indices,
            {f: getattr(st, f) for f in FIELDS}, st.merge_cpu_s, len(taken))


def _job(rank: int, world: int, cases: list[str]) -> dict:
    from gtopk_lab.comm.gtopk_links import applies
    from gtopk_lab.comm.transport_choice import transport_for, transport_kind
    from gtopk_lab.comm.wire import sparse_wire

    out: dict = {"kind": transport_kind(),
                 "applies": applies(transport_for(None, torch.device("cpu"), sparse_wire(torch.float32, torch.int32, K,
                                                                                          True)),
                                    *_selection(rank, "plain"), NUMEL, True, world)}
    for case in cases:
        for algorithm in _algorithms(case, world):
            for lean in (True, False):
                out[case, algorithm, lean] = _call(case, algorithm, lean)
    bad_v, bad_i = _selection(rank, "plain")
    bad_i[3] = NUMEL + 5  # on every rank: a rank that raises sends nothing its peers would wait for
    try:
        from gtopk_lab.comm.torch_dist import gtopk_allreduce
        gtopk_allreduce(bad_v, bad_i, NUMEL, K, exact_k=True)
        out["bad"] = None
    except ValueError as exc:
        out["bad"] = str(exc)
    return out


def _algorithms(case: str, world: int) -> tuple[str, ...]:
    return ("butterfly", "tree")


def _same(a, b, what: str) -> None:
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, what
        bits = (lambda t: t.view(torch.int32)) if a.dtype == torch.float32 else (lambda t: t)
        assert torch.equal(bits(a.detach()), bits(b.detach())), what
    else:
        assert a == b, what


CASES = ["plain", "overlap", "int64", "ascending", "nan", "grad"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world,shm,tcp", [(2, "1", "1"), (3, "1", "1"), (4, "1", "1"), (3, "0", "1")])
def test_the_hot_path_is_the_general_path_bitwise_with_the_same_stats(
        world: int, shm: str, tcp: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if shm == "1" and not shm_supported():
        pytest.skip("shared memory rings need Linux x86-64 and /dev/shm")
    monkeypatch.setenv("GTOPK_LAB_SHM", shm)
    monkeypatch.setenv("GTOPK_LAB_TCP", tcp)
    runs = run_gloo(_job, world, CASES, timeout_s=150.0)
    for rank, out in enumerate(runs):
        assert out["kind"] == ("shm" if shm == "1" else "tcp") and out["applies"], out["kind"]
        for case in CASES:
            for algorithm in _algorithms(case, world):
                lean, general = out[case, algorithm, True], out[case, algorithm, False]
                what = f"rank {rank} {case} {algorithm}"
                assert lean[0] != "error" and general[0] != "error", (what, lean, general)
                for a, b in zip(lean[:5], general[:5]):
                    _same(a, b, what)
                assert lean[5] >= 0.0 and (lean[6], general[6]) == (1, 0), what  # which path ran
        assert out["bad"] is not None and f"[0, {NUMEL})" in out["bad"], out["bad"]
    # the oracle: kept + dropped over all ranks = the sum of the inputs, per index
    for case in ("plain", "overlap", "int64", "ascending"):
        for algorithm in ("butterfly", "tree"):
            total = torch.zeros(NUMEL, dtype=torch.float64)
            for rank in range(world):
                v, i = _selection(rank, case)
                total.index_add_(0, i.long(), v.double())
            got = torch.zeros(NUMEL, dtype=torch.float64)
            kept_v, kept_i = runs[0][case, algorithm, True][:2]
            got.index_add_(0, kept_i.long(), kept_v.double())
            for rank in range(world):
                dv, di = runs[rank][case, algorithm, True][2:4]
                got.index_add_(0, di.long(), dv.double())
            assert torch.allclose(got, total, atol=1e-4), (case, algorithm)
            assert kept_i.numel() == K and bool((kept_i[1:] > kept_i[:-1]).all())
    for algorithm in ("butterfly", "tree"):  # a NaN sum is kept (it ranks with +inf), k of them
        for out in runs:
            kept = out["nan", algorithm, True][0]
            assert kept.numel() == K and any(math.isnan(x) for x in kept.tolist()), algorithm


def _not_applied_job(rank: int, world: int) -> list[bool]:
    from gtopk_lab.comm.gtopk_links import applies
    from gtopk_lab.comm.profiling import profiling
    from gtopk_lab.comm.transport_choice import transport_for
    from gtopk_lab.comm.wire import sparse_wire

    v, i = _selection(rank, "plain")
    cpu = torch.device("cpu")
    wire = sparse_wire(torch.float32, torch.int32, K, True)
    links = transport_for(None, cpu, wire)
    with profiling() as prof:
        profiled = transport_for(None, cpu, wire, profile=prof)
    return [applies(links, v, i, NUMEL, True, world), applies(links, v, i, NUMEL, False, world),
            applies(links, v.double(), i, NUMEL, True, world), applies(links, v, i.short(), NUMEL, True, world),
            applies(profiled, v, i, NUMEL, True, world), applies(links, v, i, 2**31, True, world),
            applies(links, v, i, NUMEL, True, 1)]


@pytest.mark.timeout(120)
def test_the_hot_path_declines_what_the_general_path_alone_serves() -> None:
    """Counts instead of exact k, other dtypes, a profile, indices beyond int32, one rank."""
    for flags in run_gloo(_not_applied_job, 2, timeout_s=90.0):
        assert flags == [True, False, False, False, False, False, False]
