"""What gTop-k computes once per (shape, k, P) and reuses: schedules and wire formats.

A cached plan must never be a stale one: a call after a change of k, numel, algorithm or
group size gets what a fresh process (empty caches) gets, and the schedules equal ones
built in the test from the rules of docs/architecture.md (recursive doubling, binomial tree).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.comm.schedules import cached_schedule, sparse_schedule
from gtopk_lab.comm.wire import sparse_wire


def _butterfly_oracle(rank: int, world: int) -> list[tuple[str, int, bool]]:
    m = 1 << (world.bit_length() - 1)
    if rank >= m:
        return [("send", rank - m, False), ("recv", rank - m, False)]
    out = [("recv", rank + m, True)] if rank < world - m else []
    r = 1
    while r < m:
        out.append(("exchange", rank ^ r, True))
        r <<= 1
    if rank < world - m:
        out.append(("send", rank + m, False))
    return out


def _tree_oracle(rank: int, world: int) -> list[tuple[str, int, bool]]:
    levels, up, down = max(0, (world - 1).bit_length()), [], []
    for r in range(levels):
        half = 1 << r
        if rank % (2 * half) == half:
            up.append(("send", rank - half, False))
            break
        if rank % (2 * half) == 0 and rank + half < world:
            up.append(("recv", rank + half, True))
    for r in reversed(range(levels)):
        half = 1 << r
        if rank % (2 * half) == half:
            down.append(("recv", rank - half, False))
        elif rank % (2 * half) == 0 and rank + half < world:
            down.append(("send", rank + half, False))
    return up + down


@pytest.mark.timeout(30)
def test_cached_schedules_follow_every_change_of_rank_size_and_algorithm() -> None:
    oracles = {"butterfly": _butterfly_oracle, "tree": _tree_oracle}
    for _sweep in range(2):  # the second sweep reads the caches the first one filled
        for world in (1, 2, 3, 4, 5, 6, 7, 8, 9, 16):
            for rank in range(world):
                for algorithm, oracle in oracles.items():
                    got = [(s.op, s.peer, s.merge) for s in cached_schedule(algorithm, rank, world)]
                    assert got == oracle(rank, world), (algorithm, rank, world)
    fresh = sparse_schedule("butterfly", 0, 4)
    fresh.clear()  # a caller's list is its own: the cache is untouched
    assert [(s.op, s.peer) for s in sparse_schedule("butterfly", 0, 4)] == [("exchange", 1), ("exchange", 2)]
    with pytest.raises(ValueError, match="rank=True"):
        cached_schedule("butterfly", True, 2)  # equal to the cached rank 1, still refused
    with pytest.raises(ValueError, match="algorithm='ring'"):
        cached_schedule("ring", 0, 2)


@pytest.mark.timeout(30)
def test_cached_wire_formats_follow_k_dtypes_and_exact_k() -> None:
    for k in (1, 7, 1000, 7):
        exact = sparse_wire(torch.float32, torch.int32, k, True)
        assert exact.fixed_bytes == 8 * k and exact.header == 0
        counted = sparse_wire(torch.float32, torch.int32, k, False)
        assert counted.fixed_bytes is None and counted.header == 8
        wide = sparse_wire(torch.float64, torch.int64, k, True)
        assert wide.fixed_bytes == 16 * k and wide.dtypes == (torch.float64, torch.int64)


def _pair_oracle(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], numel: int,
                 k: int) -> tuple[np.ndarray, np.ndarray]:
    """P = 2 gTop-k is the exact top-k of the sum (float32 adds, a's value first)."""
    dense = np.zeros(numel, dtype=np.float32)
    dense[a[1]] = a[0]
    dense[b[1]] += b[0]
    support = np.union1d(a[1], b[1])
    keep = support[np.lexsort((support, -np.abs(dense[support])))[:k]]
    keep.sort()
    return dense[keep], keep


def _inputs(rank: int, numel: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng([7, rank, numel, k])
    idx = gen.choice(numel, size=k, replace=False)
    return gen.standard_normal(k).astype(np.float32), idx.astype(np.int64)


#: (numel, k, algorithm) in the order one group calls them: k, numel and algorithm change
_CALLS = [(20_000, 20, "butterfly"), (20_000, 33, "butterfly"), (50_000, 33, "butterfly"),
          (50_000, 33, "tree"), (20_000, 20, "tree"), (20_000, 20, "butterfly")]


def _changing_calls_job(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from gtopk_lab.comm.torch_dist import gtopk_allreduce

    def call(numel: int, k: int, algorithm: str, group=None) -> tuple[np.ndarray, np.ndarray]:
        v, i = _inputs(dist.get_rank(group) if group is not None else rank, numel, k)
        out = gtopk_allreduce(torch.from_numpy(v), torch.from_numpy(i), numel, k, group=group,
                              algorithm=algorithm, exact_k=True)
        return out.values.numpy().copy(), out.indices.numpy().astype(np.int64)

    warm = [call(*c) for c in _CALLS]
    pair = dist.new_group([0, 1])  # every rank joins the creation; only 0 and 1 call on it
    in_pair = [call(*c, group=pair) for c in _CALLS] if rank < 2 else []
    cached_schedule.cache_clear()
    sparse_wire.cache_clear()
    fresh = [call(*c) for c in _CALLS]
    return {"warm": warm, "fresh": fresh, "pair": in_pair}


@pytest.mark.timeout(240)
def test_a_changed_k_numel_algorithm_or_group_size_never_reuses_a_stale_plan() -> None:
    out = run_gloo(_changing_calls_job, 3, timeout_s=120.0)
    for rank, got in enumerate(out):
        for (numel, k, algorithm), warm, fresh in zip(_CALLS, got["warm"], got["fresh"]):
            assert warm[0].size == k and np.array_equal(warm[0].view(np.uint32), fresh[0].view(np.uint32))
            assert np.array_equal(warm[1], fresh[1]), (rank, numel, k, algorithm)
            assert np.array_equal(warm[0].view(np.uint32), out[0]["warm"][_CALLS.index((numel, k, algorithm))][0]
                                  .view(np.uint32))
    for j, (numel, k, _algorithm) in enumerate(_CALLS):  # P = 2 on the sub-group: the exact top-k of the sum
        want_v, want_i = _pair_oracle(_inputs(0, numel, k), _inputs(1, numel, k), numel, k)
        for rank in (0, 1):
            got_v, got_i = out[rank]["pair"][j]
            assert np.array_equal(got_i, want_i) and np.array_equal(got_v.view(np.uint32), want_v.view(np.uint32))
