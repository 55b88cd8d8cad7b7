"""Tests of gtopk_lab.comm.inprocess: in-process collectives equal the real gloo ones.

The real results come from the one 8-rank gloo job of tests/test_collectives.py (cached per
session), so the bitwise comparison for every P = 1..8 costs no extra spawn.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gtopk_lab.collectives import gtopk_program
from gtopk_lab.comm.inprocess import (
    run_programs, sim_dense_allreduce, sim_gtopk_allreduce, sim_topk_allgather,
)
from gtopk_lab.comm.recorder import Recorder
from gtopk_lab.comm.wire import TENSORS
from gtopk_lab.comm.schedules import butterfly_schedule, sparse_schedule, tree_schedule

from test_collectives import EXACT_K_FAMILIES, FAMILIES, K, MAX_P, NUMEL, make_input, real_results


def _same_stats(a, b) -> None:
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    for key in ("merge_cpu_s", "dropped_values", "dropped_indices"):
        da.pop(key), db.pop(key)
    assert da == db
    for attr in ("dropped_values", "dropped_indices"):
        x, y = getattr(a, attr), getattr(b, attr)
        assert (x is None and y is None) or torch.equal(x, y)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sim_equals_real_gloo_bitwise() -> None:
    real = real_results()
    for p in range(1, MAX_P + 1):
        for fam in FAMILIES:
            inputs = [make_input(fam, p, r) for r in range(p)]
            vals, idxs = [v for v, _ in inputs], [i for _, i in inputs]
            sims = {f"{fam}/{algo}": sim_gtopk_allreduce(vals, idxs, NUMEL, K, algo)
                    for algo in ("butterfly", "tree")}
            sims[f"{fam}/allgather"] = sim_topk_allgather(vals, idxs, NUMEL)
            if fam in EXACT_K_FAMILIES:
                for algo in ("butterfly", "tree"):
                    sims[f"{fam}/{algo}/exact"] = sim_gtopk_allreduce(vals, idxs, NUMEL, K, algo, exact_k=True)
                sims[f"{fam}/allgather/exact"] = sim_topk_allgather(vals, idxs, NUMEL, exact_count=K)
            for key, sim in sims.items():
                for r in range(p):
                    got = real[r][p][key]
                    assert torch.equal(sim[r].values, got.values), (p, key, r)
                    assert torch.equal(sim[r].indices, got.indices), (p, key, r)
                    _same_stats(sim[r].stats, got.stats)
        dense = [torch.arange(NUMEL, dtype=torch.float32) * (r + 1) for r in range(p)]
        for r, res in enumerate(sim_dense_allreduce(dense)):
            assert torch.equal(res.values, real[r][p]["dense"].values)
            assert res.values is dense[r]  # in place
            _same_stats(res.stats, real[r][p]["dense"].stats)


@pytest.mark.timeout(30)
def test_schedules_are_consistent_for_all_world_sizes() -> None:
    """Every send has a matching recv in the same order; exchanges are symmetric."""
    for algo in ("butterfly", "tree"):
        for p in range(1, 33):
            scheds = [sparse_schedule(algo, r, p) for r in range(p)]
            # each rank is charged for drops only where it merges
            for r, steps in enumerate(scheds):
                for s in steps:
                    assert 0 <= s.peer < p and s.peer != r
                    assert not s.charge_drops or s.merge
            # the i-th message r sends to q is the i-th one q expects from r
            for r in range(p):
                for q in range(p):
                    out = [s.op for s in scheds[r] if s.peer == q and s.op != "recv"]
                    inn = [s.op for s in scheds[q] if s.peer == r and s.op != "send"]
                    assert len(out) == len(inn), (algo, p, r, q)
            for r, steps in enumerate(scheds):
                for s in steps:
                    if s.op == "exchange":
                        assert any(t.op == "exchange" and t.peer == r for t in scheds[s.peer])
            # P vectors become one through P - 1 distinct merges (in a butterfly round both
            # partners compute the same merge); each has exactly one rank charged its drops
            n_charged = sum(s.charge_drops for steps in scheds for s in steps)
            assert n_charged == p - 1, (algo, p, n_charged)
    assert [s.op for s in butterfly_schedule(0, 8)] == ["exchange"] * 3
    assert [s.op for s in tree_schedule(0, 8)] == ["recv"] * 3 + ["send"] * 3
    with pytest.raises(ValueError, match="algorithm='ring'"):
        sparse_schedule("ring", 0, 2)
    with pytest.raises(ValueError, match="rank=4"):
        butterfly_schedule(4, 4)


@pytest.mark.timeout(60)
def test_sim_runs_large_world_sizes_and_matches_formulas() -> None:
    """P = 32 in one process: every rank identical, butterfly bytes = log2(P) (8 + 8k)."""
    p, numel, k = 32, 5000, 50
    gen = torch.Generator().manual_seed(0)
    picks = [torch.topk(torch.randn(numel, generator=gen).abs(), k) for _ in range(p)]
    vals = [pk.values for pk in picks]
    idxs = [pk.indices for pk in picks]
    res = sim_gtopk_allreduce(vals, idxs, numel, k, "butterfly")
    assert all(torch.equal(r.values, res[0].values) for r in res)
    assert all(r.stats.bytes_sent == 5 * (8 + 8 * k) for r in res)
    ag = sim_topk_allgather(vals, idxs, numel)
    assert ag[0].stats.bytes_sent == (p - 1) * 8 + (p - 1) * 8 * k


@pytest.mark.timeout(30)
def test_sim_errors() -> None:
    v, i = torch.ones(3), torch.arange(3)
    with pytest.raises(ValueError, match="values_list has 2 ranks but indices_list has 1"):
        sim_gtopk_allreduce([v, v], [i], 10, 2)
    with pytest.raises(ValueError, match="k=11"):
        sim_gtopk_allreduce([v], [i], 10, 11)
    with pytest.raises(ValueError, match="rank 1 values/indices"):
        sim_topk_allgather([v, v], [i, i + 10], 10)
    # from three ranks on the range is checked over all ranks at once: the error still names one
    bad = r"^rank 3 values/indices: indices range \[-1, 1\] is invalid: expected indices in \[0, 10\)"
    with pytest.raises(ValueError, match=bad):
        sim_gtopk_allreduce([v] * 5, [i, i, i + 7, i - 1, i], 10, 2)
    with pytest.raises(ValueError, match=r"^rank 2 values/indices: indices range \[8, 10\]"):
        sim_topk_allgather([v] * 4, [i, i, i + 8, i], 10)
    with pytest.raises(ValueError, match="empty"):
        sim_dense_allreduce([])
    with pytest.raises(ValueError, match="exact_k=True is invalid here: virtual rank 1 selected 2"):
        sim_gtopk_allreduce([v, v[:2]], [i, i[:2]], 10, 3, exact_k=True)
    with pytest.raises(TypeError, match="exact_k="):
        sim_gtopk_allreduce([v], [i], 10, 3, exact_k=1)  # type: ignore[arg-type]

    def stuck() -> object:  # a program waiting for a message nobody sends
        yield ("recv", 1, None)

    def idle() -> object:
        return None
        yield  # pragma: no cover

    with pytest.raises(RuntimeError, match="deadlocked"):
        run_programs([Recorder(TENSORS, r, 2).wrap(program) for r, program in enumerate((stuck(), idle()))])
    assert gtopk_program  # re-exported for the simulator


@pytest.mark.timeout(30)
def test_drops_of_several_merges_are_summed_on_first_read_only() -> None:
    """Rank 0 owns the drops of every butterfly round: they stay parts until read, then
    read as the canonical sum of the parts (what the mass residual rule adds)."""
    from gtopk_lab.compression.merge import coalesce_sparse

    p = 4
    inputs = [make_input("randn", p, r) for r in range(p)]
    res = sim_gtopk_allreduce([v for v, _ in inputs], [i for _, i in inputs], NUMEL, K, "butterfly")
    st = res[0].stats
    parts = st.dropped_parts
    assert parts is not None and len(parts) == 2  # log2(4) merges charged to rank 0
    expected = coalesce_sparse(torch.cat([v for v, _ in parts]), torch.cat([i for _, i in parts]))
    st.drops_to(torch.device("cpu"))  # moving keeps them parts
    assert st.dropped_parts is not None
    assert torch.equal(st.dropped_values, expected[0]) and torch.equal(st.dropped_indices, expected[1])
    assert st.dropped_parts is None
    assert res[1].stats.dropped_parts is None and res[1].stats.dropped_values.numel() == 0
