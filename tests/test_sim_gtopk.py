"""The simulator's gTop-k with each merge made once (gtopk_lab.comm.sim_gtopk) against the
per-rank programs it replaces (every CommStats field but the measured merge CPU) and against
an oracle written here: dense arithmetic merges along the butterfly / tree pattern."""

from __future__ import annotations

import pytest
import torch

from gtopk_lab.comm.inprocess import sim_gtopk_allreduce
from gtopk_lab.comm.stats import CollectiveResult


def _selections(world: int, numel: int, k: int, seed: int, ties: bool, vary: bool = False) -> tuple[list, list]:
    """One selection per rank: k pairs each, or (``vary``) 1 .. 2k of them, as a threshold
    selector sends, so that messages differ in size."""
    gen = torch.Generator().manual_seed(seed)
    values, indices = [], []
    for _ in range(world):
        n = int(torch.randint(1, 2 * k + 1, (1,), generator=gen)) if vary else k
        idx = torch.randperm(numel, generator=gen)[:n].to(torch.int32)
        # integer values: sums are exact and magnitudes tie often (the tie rule decides)
        v = (torch.randint(-5, 6, (n,), generator=gen).float() if ties
             else torch.randn(n, generator=gen))
        values.append(v)
        indices.append(idx)
    return values, indices


def _fields(result: CollectiveResult) -> dict:
    s = result.stats
    parts = s.dropped_parts
    return {"values": result.values.tolist(), "indices": result.indices.tolist(),
            "dtypes": (result.values.dtype, result.indices.dtype),
            "collective": s.collective, "algorithm": s.algorithm, "bytes_sent": s.bytes_sent,
            "bytes_recv": s.bytes_recv, "messages": s.messages, "rounds": s.rounds, "steps": list(s.steps),
            "merged_elements": s.merged_elements, "library_estimate": s.library_estimate,
            "parts": None if parts is None else [(v.tolist(), i.tolist()) for v, i in parts],
            "dropped": (s.dropped_values.tolist(), s.dropped_indices.tolist())}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm", ["butterfly", "tree"])
@pytest.mark.parametrize("exact_k", [True, False])
def test_shared_merges_equal_the_per_rank_programs(algorithm: str, exact_k: bool) -> None:
    numel, k = 400, 16
    for world in [*range(1, 18), 32, 64]:
        for ties in (False, True):
            values, indices = _selections(world, numel, k, seed=world, ties=ties, vary=not exact_k)
            fast = sim_gtopk_allreduce(values, indices, numel, k, algorithm=algorithm, exact_k=exact_k)
            slow = sim_gtopk_allreduce(values, indices, numel, k, algorithm=algorithm, exact_k=exact_k,
                                       programs=True)
            assert len(fast) == len(slow) == world
            for r in range(world):
                assert _fields(fast[r]) == _fields(slow[r]), (algorithm, world, ties, r)


def _oracle_merge(a: tuple[dict, ...], b: tuple[dict, ...], k: int) -> tuple[dict, dict]:
    """Sum of two sparse vectors ({index: value}), keep the k largest |value| (ties to the
    lower index); returns (kept, dropped)."""
    total = dict(a[0])
    for i, v in b[0].items():
        total[i] = total.get(i, 0.0) + v
    order = sorted(total, key=lambda i: (-abs(total[i]), i))
    kept = {i: total[i] for i in order[:k]}
    dropped = {i: total[i] for i in order[k:]}
    return kept, dropped


def _oracle(world: int, values: list, indices: list, k: int, algorithm: str) -> tuple[dict, list[dict]]:
    """The global result and each rank's charged drops, summed: the pattern of the schedules'
    docstrings, merges made on dicts (lower rank's operand first)."""
    vec = [({int(i): float(v) for i, v in zip(ix, vs)},) for vs, ix in zip(values, indices)]
    drops: list[dict] = [{} for _ in range(world)]

    def merge(lo: int, hi: int) -> None:
        kept, dropped = _oracle_merge(vec[lo], vec[hi], k)
        vec[lo] = (kept,)
        for i, v in dropped.items():
            drops[lo][i] = drops[lo].get(i, 0.0) + v

    if world == 1:  # no partner: the rank's own selection, k kept
        kept, dropped = _oracle_merge(vec[0], ({},), k)
        return kept, [dropped]
    if algorithm == "butterfly":
        m = 1 << (world.bit_length() - 1)
        for j in range(world - m):
            merge(j, m + j)
        span = m
    else:
        span = world
    half = 1
    while half < span:
        for start in range(0, span - half, 2 * half):
            merge(start, start + half)
        half *= 2
    return vec[0][0], drops


@pytest.mark.timeout(60)
@pytest.mark.parametrize("algorithm", ["butterfly", "tree"])
def test_shared_merges_give_the_patterns_global_top_k_and_charge_each_drop_once(algorithm: str) -> None:
    numel, k = 300, 10
    for world in (1, 2, 3, 5, 6, 8, 11, 16):
        values, indices = _selections(world, numel, k, seed=100 + world, ties=True)
        results = sim_gtopk_allreduce(values, indices, numel, k, algorithm=algorithm, exact_k=True)
        kept, drops = _oracle(world, values, indices, k, algorithm)
        for r, res in enumerate(results):
            got = dict(zip(res.indices.tolist(), res.values.tolist()))
            assert got == kept and res.indices.tolist() == sorted(kept), (world, r)
            charged = dict(zip(res.stats.dropped_indices.tolist(), res.stats.dropped_values.tolist()))
            assert charged == drops[r], (world, r)
        # mass: the result plus every charged drop is the sum of the inputs
        total: dict[int, float] = {}
        for vs, ix in zip(values, indices):
            for i, v in zip(ix.tolist(), vs.tolist()):
                total[i] = total.get(i, 0.0) + v
        back = dict(kept)
        for d in drops:
            for i, v in d.items():
                back[i] = back.get(i, 0.0) + v
        assert {i: v for i, v in back.items() if v != 0} == {i: v for i, v in total.items() if v != 0}
