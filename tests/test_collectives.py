"""Real multi-process tests of gtopk_lab.collectives on gloo (127.0.0.1, free ports).

One spawned group of 8 ranks covers every world size P = 1..8: for each P the ranks
0..P-1 form a sub-group (``dist.new_group``) and run all collectives on several input
families; the parent checks many properties at once. This keeps the whole file at a few
spawns (torch import per process dominates on 2 cores).
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.distributed as dist

from gtopk_lab.collectives import (
    HEADER_BYTES, CollectiveResult, dense_allreduce, gtopk_allreduce, topk_allgather,
)
from gtopk_lab.compression.selection import get_selector
from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.comm.schedules import largest_power_of_two

NUMEL = 2000
K = 25
MAX_P = 8
#: input families: "randn" (distinct magnitudes), "ties" (integer values, many |v| ties),
#: "same" (identical on every rank), "gauss" (GaussianK: different counts per rank)
FAMILIES = ("randn", "ties", "same", "gauss")
#: families whose selections hold exactly K entries on every rank (exact_k=True allowed)
EXACT_K_FAMILIES = ("randn", "ties", "same")


def make_input(family: str, world_size: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic local selection of ``rank`` in a world of ``world_size`` (shared with sim tests)."""
    seed = 1000 * world_size + rank if family != "same" else 7
    gen = torch.Generator().manual_seed(seed)
    if family == "ties":
        x = torch.randint(-4, 5, (NUMEL,), generator=gen).float()
        x[x == 0] = 1.0
        perm = torch.randperm(NUMEL, generator=gen)[:K]
        return x[perm], perm.to(torch.int32)
    x = torch.randn(NUMEL, generator=gen)
    selector = get_selector("gaussiank" if family == "gauss" else "topk")
    return selector(x, K)


def _rank_job(rank: int, world_size: int) -> dict:
    out: dict = {"errors": {}}
    # --- validation (no communication needed) on the default group -----------------
    v, i = make_input("randn", world_size, rank)
    bad_calls = {
        "k0": lambda: gtopk_allreduce(v, i, NUMEL, 0),
        "k_big": lambda: gtopk_allreduce(v, i, NUMEL, NUMEL + 1),
        "len": lambda: gtopk_allreduce(v, i[:-1], NUMEL, K),
        "range": lambda: gtopk_allreduce(v, i + NUMEL, NUMEL, K),
        "algo": lambda: gtopk_allreduce(v, i, NUMEL, K, algorithm="ring"),
        "ag_range": lambda: topk_allgather(v, i - NUMEL, NUMEL),
        "exact_k_count": lambda: gtopk_allreduce(v[:-1], i[:-1], NUMEL, K, exact_k=True),
        "ag_exact_count": lambda: topk_allgather(v[:-1], i[:-1], NUMEL, exact_count=K),
    }
    for name, call in bad_calls.items():
        try:
            call()
            out["errors"][name] = None
        except ValueError as exc:
            out["errors"][name] = str(exc)
    # --- every P = 1..8 as a sub-group of ranks 0..P-1 -------------------------------
    for p in range(1, world_size + 1):
        group = dist.new_group(list(range(p)))  # collective over the default group
        if rank >= p:
            continue
        use = None if p == world_size else group  # also exercise group=None
        res: dict[str, CollectiveResult] = {}
        for fam in FAMILIES:
            v, i = make_input(fam, p, rank)
            res[f"{fam}/butterfly"] = gtopk_allreduce(v, i, NUMEL, K, group=use, algorithm="butterfly")
            res[f"{fam}/tree"] = gtopk_allreduce(v, i, NUMEL, K, group=use, algorithm="tree")
            res[f"{fam}/allgather"] = topk_allgather(v, i, NUMEL, group=use)
            if fam in EXACT_K_FAMILIES:  # header-free fixed-size messages
                for algo in ("butterfly", "tree"):
                    res[f"{fam}/{algo}/exact"] = gtopk_allreduce(v, i, NUMEL, K, group=use,
                                                                 algorithm=algo, exact_k=True)
                res[f"{fam}/allgather/exact"] = topk_allgather(v, i, NUMEL, group=use, exact_count=K)
        dense = torch.arange(NUMEL, dtype=torch.float32) * (rank + 1)
        res["dense"] = dense_allreduce(dense, group=use)
        out[p] = res
    dist.barrier()
    return out


@functools.lru_cache(maxsize=1)
def real_results() -> list[dict]:
    """Run the 8-rank job once per test session (shared with test_collectives_sim)."""
    return run_gloo(_rank_job, MAX_P, timeout_s=120.0)


def dense_of(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(NUMEL, dtype=values.dtype)
    out.index_add_(0, indices.long(), values)
    return out


def _pair_bytes(n: int) -> int:
    return HEADER_BYTES + 8 * n


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_collectives_all_world_sizes() -> None:
    results = real_results()
    for r in range(MAX_P):
        errs = results[r]["errors"]
        assert all(msg is not None for msg in errs.values()), errs
        assert "k=0" in errs["k0"] and "numel=2000" in errs["k_big"]
        assert "same length" in errs["len"] and "[0, 2000)" in errs["range"]
        assert "algorithm='ring'" in errs["algo"] and "butterfly" in errs["algo"]
    for p in range(1, MAX_P + 1):
        per_rank = [results[r][p] for r in range(p)]
        inputs = {fam: [make_input(fam, p, r) for r in range(p)] for fam in FAMILIES}
        for key, r0 in per_rank[0].items():
            # identical, canonical results on every rank
            for r in range(1, p):
                assert torch.equal(per_rank[r][key].values, r0.values), (p, key, r)
                if r0.indices is not None:
                    assert torch.equal(per_rank[r][key].indices, r0.indices), (p, key, r)
            if r0.indices is not None:
                assert r0.indices.dtype == torch.int32
                assert bool((r0.indices[1:] > r0.indices[:-1]).all()), (p, key)
        for fam in FAMILIES:
            vals = [v for v, _ in inputs[fam]]
            idxs = [i for _, i in inputs[fam]]
            exact_sum = sum(dense_of(v, i) for v, i in inputs[fam])
            # Top-k AllGather is the exact sparse sum (rank order) of all selections
            ag = per_rank[0][f"{fam}/allgather"]
            assert torch.equal(dense_of(ag.values, ag.indices), exact_sum), (p, fam)
            assert torch.equal(ag.indices.long(), torch.unique(torch.cat(idxs).long())), (p, fam)
            n_max = max(v.numel() for v in vals)
            for r in range(p):
                st = per_rank[r][f"{fam}/allgather"].stats
                assert st.dropped_values is None
                if p > 1:  # one host: shared-memory links, a ring: right neighbour out, left in
                    assert not st.library_estimate and st.peers == [((r + 1) % p, (r - 1) % p)] * st.rounds
                assert st.bytes_sent == (p - 1) * (HEADER_BYTES + 8 * n_max), (p, fam, st)
            for algo in ("butterfly", "tree"):
                key = f"{fam}/{algo}"
                g = per_rank[0][key]
                assert g.values.numel() <= K
                # mass: G + all drops (each charged once) == sum of all selections
                total = dense_of(g.values, g.indices)
                for r in range(p):
                    st = per_rank[r][key].stats
                    total += dense_of(st.dropped_values, st.dropped_indices)
                torch.testing.assert_close(total, exact_sum, rtol=1e-5, atol=1e-5)
                if fam == "same":  # identical inputs: P * topk(g), nothing dropped
                    ref_v, ref_i = coalesce_ref(vals[0], idxs[0])
                    assert torch.equal(g.indices, ref_i), (p, key)
                    torch.testing.assert_close(g.values, p * ref_v, rtol=1e-6, atol=0)
                    assert all(per_rank[r][key].stats.dropped_values.numel() == 0 for r in range(p))
                if p == 2 and fam != "gauss":  # exact global top-k of s_0 + s_1 (ties: lower index)
                    ref_i = topk_ref(exact_sum, torch.unique(torch.cat(idxs).long()), K)
                    assert torch.equal(g.indices.long(), ref_i), (key,)
                    assert torch.equal(g.values, exact_sum[ref_i]), (key,)
                if fam in ("randn", "ties", "same"):
                    check_sparse_bytes(algo, p, [per_rank[r][key].stats for r in range(p)])
        # dense allreduce: sum in place, ring byte count
        d = per_rank[0]["dense"]
        assert torch.equal(d.values, torch.arange(NUMEL, dtype=torch.float32) * (p * (p + 1) // 2))
        chunk = math.ceil(4 * NUMEL / p)
        assert d.stats.bytes_sent == (2 * (p - 1) * chunk if p > 1 else 0)
        assert d.stats.library_estimate and d.indices is None


def coalesce_ref(values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.argsort(indices.long())
    return values[order], indices[order]


def topk_ref(dense: torch.Tensor, support: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (ascending) of the k largest |dense| on ``support`` (ascending), ties -> lower index."""
    mags = dense[support].abs()
    order = sorted(range(support.numel()), key=lambda j: (-float(mags[j]), int(support[j])))
    return torch.sort(support[order[:k]]).values


def check_sparse_bytes(algo: str, p: int, stats: list) -> None:
    """Every message of an exact-k input carries k pairs: check bytes against the schedule."""
    msg = _pair_bytes(K)
    m = largest_power_of_two(p)
    extra = p - m
    log_m = int(math.log2(m))
    for r, st in enumerate(stats):
        assert not st.library_estimate
        assert st.bytes_sent == sum(s for s, _ in st.steps) and st.rounds == len(st.steps)
        assert st.messages == sum(1 for s, _ in st.steps if s > 0)  # one buffer per message
        if algo == "butterfly":
            if r >= m:
                assert st.steps == [(msg, 0), (0, msg)], (p, r, st.steps)
            else:
                fold = [(0, msg)] if r < extra else []
                unfold = [(msg, 0)] if r < extra else []
                assert st.steps == fold + [(msg, msg)] * log_m + unfold, (p, r, st.steps)
        else:
            levels = (p - 1).bit_length()
            if r == 0:  # root: receives one message per level, then sends one per level
                assert st.steps == [(0, msg)] * levels + [(msg, 0)] * levels, (p, st.steps)
            elif p > 1:  # every other rank sends one reduce message and receives one broadcast
                assert st.steps[0] == (0, msg) or st.steps.count((msg, 0)) >= 1
                assert st.steps.count((0, msg)) >= 1, (p, r, st.steps)
    # point-to-point: what is sent is received
    assert sum(st.bytes_sent for st in stats) == sum(st.bytes_recv for st in stats)


def _fail_rank(rank: int, world_size: int) -> None:
    if rank == 1:
        raise KeyError("rank one is broken")
    dist.barrier()


def _hang_rank(rank: int, world_size: int) -> None:
    import time
    time.sleep(600)


@pytest.mark.timeout(60)
def test_run_gloo_reports_failing_rank_traceback() -> None:
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 failed(.|\n)*rank one is broken"):
        run_gloo(_fail_rank, 2, timeout_s=20.0)


@pytest.mark.timeout(90)
def test_run_gloo_kills_on_timeout() -> None:
    with pytest.raises(RuntimeError, match="timed out"):
        run_gloo(_hang_rank, 1, timeout_s=1.0)


@pytest.mark.timeout(30)
def test_no_process_group_is_a_value_error() -> None:
    assert not dist.is_initialized()
    v, i = make_input("randn", 1, 0)
    with pytest.raises(ValueError, match="process group"):
        gtopk_allreduce(v, i, NUMEL, K)
    with pytest.raises(ValueError, match="process group"):
        dense_allreduce(torch.ones(3))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_exact_k_drops_the_header_and_nothing_else() -> None:
    """exact_k=True: same results and drops as the header protocol, 8 bytes less per message
    (one buffer per message either way), for every P = 1..8, both patterns; miscounts fail early."""
    real = real_results()
    for r in range(MAX_P):
        assert "exact_k" in real[r]["errors"]["exact_k_count"]
    for p in range(1, MAX_P + 1):
        for fam in EXACT_K_FAMILIES:
            for algo in ("butterfly", "tree"):
                for r in range(p):
                    hdr, exact = real[r][p][f"{fam}/{algo}"], real[r][p][f"{fam}/{algo}/exact"]
                    assert torch.equal(hdr.values, exact.values) and torch.equal(hdr.indices, exact.indices)
                    assert torch.equal(hdr.stats.dropped_values, exact.stats.dropped_values)
                    assert torch.equal(hdr.stats.dropped_indices, exact.stats.dropped_indices)
                    assert exact.stats.steps == [(s - HEADER_BYTES if s else 0, q - HEADER_BYTES if q else 0)
                                                 for s, q in hdr.stats.steps], (p, fam, algo, r)
                    assert all(s in (0, 8 * K) and q in (0, 8 * K) for s, q in exact.stats.steps)
                    sends = sum(1 for s, _ in exact.stats.steps if s)
                    assert exact.stats.messages == sends and hdr.stats.messages == sends
            for r in range(p):  # the allgather: same sum, no count allgather
                counted, exact = real[r][p][f"{fam}/allgather"], real[r][p][f"{fam}/allgather/exact"]
                assert torch.equal(counted.values, exact.values) and torch.equal(counted.indices, exact.indices)
                assert exact.stats.steps == counted.stats.steps[p - 1:], (p, fam, r)
                assert exact.stats.rounds == counted.stats.rounds - (p - 1)
    for r in range(MAX_P):
        assert f"exact_count={K}" in real[r]["errors"]["ag_exact_count"]


@pytest.mark.timeout(60)
def test_run_gloo_reports_a_failed_start_not_a_join_error() -> None:
    """An unpicklable fn fails in Process.start(); that error surfaces, nothing hangs."""
    import pickle

    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        run_gloo(lambda rank, world: None, 2, timeout_s=10.0)


@pytest.mark.timeout(30)
def test_master_store_listens_on_its_address_only() -> None:
    """The rendezvous store binds 127.0.0.1, not every interface as TCPStore alone does."""
    import socket
    from datetime import timedelta

    from gtopk_lab.comm.launch import master_store

    store = master_store("127.0.0.1", 1, timedelta(seconds=10))
    probe = socket.socket()
    try:  # the port is taken on 127.0.0.1 only: another loopback address can still bind it
        probe.bind(("127.0.0.2", store.port))  # EADDRINUSE if the store listened on every interface
    finally:
        probe.close()
    store.set("k", "v")
    assert store.get("k") == b"v"
