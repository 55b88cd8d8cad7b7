"""LinkPacer: every round lasts its modelled time; merges come after the paced wire time."""

from __future__ import annotations

import time

import pytest
import torch

from gtopk_lab.network import pacing as pacing_module
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.network.pacing import LinkPacer, active_pacer, pacing

NET = NetworkModel.from_strings("10Mbps", "2ms")  # 2 ms + 0.8 us per byte


@pytest.mark.timeout(30)
def test_round_lasts_alpha_plus_beta_of_the_larger_direction() -> None:
    pacer = LinkPacer(NET)
    t0 = time.perf_counter()
    pacer.begin_round()
    pacer.end_round(1_000, 5_000)  # 2 ms + 5000 * 8 / 10e6 s = 6 ms
    elapsed = time.perf_counter() - t0
    assert elapsed >= 0.006
    # it slept what was left of the 6 ms, no more (whatever the load did to the wake-up)
    assert pacer.rounds == 1 and 0.004 < pacer.slept_s <= 0.006


@pytest.mark.timeout(30)
def test_work_inside_the_round_is_not_paced_twice() -> None:
    pacer = LinkPacer(NET)
    pacer.begin_round()
    time.sleep(0.010)  # the real transfer took longer than its 2.8 ms model
    pacer.end_round(100, 100)
    assert pacer.slept_s == 0.0 and pacer.rounds == 1


@pytest.mark.timeout(30)
def test_end_without_begin_is_a_noop_and_steps_are_paced_as_a_whole() -> None:
    pacer = LinkPacer(NET)
    pacer.end_round(10**9, 0)  # simulator-driven program: nothing began a round
    assert pacer.rounds == 0 and pacer.slept_s == 0.0
    start = time.perf_counter()
    pacer.pace_steps(start, [(1_000, 1_000), (1_000, 1_000)])  # 2 x (2 ms + 0.8 ms)
    assert time.perf_counter() - start >= 0.0056 and pacer.rounds == 2


@pytest.mark.timeout(30)
def test_context_installs_and_restores_the_pacer() -> None:
    assert active_pacer() is None
    with pacing(NET) as outer:
        assert active_pacer() is outer
        with pacing(NetworkModel.from_strings("1Gbps")) as inner:
            assert active_pacer() is inner
        assert active_pacer() is outer
    assert active_pacer() is None
    with pytest.raises(TypeError, match="network="):
        LinkPacer("1Gbps")  # type: ignore[arg-type]


# --- real gloo ranks ------------------------------------------------------------------------------
def _paced_rank(rank: int, world: int, numel: int, k: int, algorithm: str) -> dict:
    from gtopk_lab.collectives import gtopk_allreduce, topk_allgather
    from gtopk_lab.network.clock import VirtualClock

    net = NetworkModel.from_strings("100Mbps")
    clock = VirtualClock(net, throttle=True)
    gen = torch.Generator().manual_seed(3 + rank)
    idx = torch.randperm(numel, generator=gen)[:k].sort().values.to(torch.int32)
    vals = torch.randn(k, generator=gen)
    if algorithm == "allgather":
        call, args, kwargs = topk_allgather, (vals, idx, numel), {}
    else:
        call, args, kwargs = gtopk_allreduce, (vals, idx, numel, k), {"algorithm": algorithm}
    clock.collective(call, *args, **kwargs)  # warm-up
    t0 = time.perf_counter()
    result = clock.collective(call, *args, **kwargs)
    wall = time.perf_counter() - t0
    return {"wall": wall, "rank_model": clock.last_rank_model_s, "merge_cpu": result.stats.merge_cpu_s,
            "model": net.steps_time_s(result.stats.steps)}


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm", ["butterfly", "tree", "allgather"])
def test_merges_run_after_the_paced_rounds(algorithm: str) -> None:
    """Per-round pacing: wall >= alpha-beta of this rank's rounds + its own merge CPU
    (the allgather's assembly of the gathered pairs likewise comes after its wire time).

    A per-call sleep would give only max(alpha-beta, real), hiding the merge inside the
    emulated wire time; on a real link the merge needs the round's data first.
    """
    from gtopk_lab.comm.launch import run_gloo

    numel, k = 2_000_000, 100_000  # one round of 800 kB: 64 ms at 100 Mbps; merges of 200k
    for row in run_gloo(_paced_rank, 2, numel, k, algorithm, timeout_s=90):
        assert row["rank_model"] == pytest.approx(row["model"]) and row["model"] >= 0.064
        # merge CPU time <= its wall time; 1 ms slack for timer granularity
        assert row["wall"] >= row["rank_model"] + row["merge_cpu"] - 1e-3
        assert row["wall"] < row["rank_model"] + 10.0  # generous: the box is shared


class _FakeClock:
    """``time`` for pacing.py on a clock the test moves: sleeps advance it and are logged."""

    def __init__(self) -> None:
        self.now, self.slept = 100.0, []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.mark.timeout(30)
def test_throttled_call_tops_up_to_the_steps_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from gtopk_lab.collectives import CollectiveResult, CommStats
    from gtopk_lab.network.pacing import throttled_call

    stats = CommStats("x", "ring", steps=[(10_000, 0), (0, 10_000)])  # 2 x (2 ms + 8 ms)
    t0 = time.perf_counter()
    result, model_s, slept_s = throttled_call(NET, lambda: CollectiveResult(torch.zeros(1), None, stats))
    assert time.perf_counter() - t0 >= 0.020 and model_s == pytest.approx(0.020)
    assert 0.0 <= slept_s <= model_s and result.stats is stats
    # the top-up is the model minus what the call took: on a clock the test drives, a call
    # of 3 ms sleeps 17 ms (on the real clock the call's own time depends on the load)
    fake = _FakeClock()
    monkeypatch.setattr(pacing_module, "time", fake)

    def call_of_3_ms() -> CollectiveResult:
        fake.now += 0.003
        return CollectiveResult(torch.zeros(1), None, stats)

    _, model_s, slept_s = throttled_call(NET, call_of_3_ms)
    assert fake.slept == [pytest.approx(0.017)] and slept_s == pytest.approx(0.017)
    assert fake.now == pytest.approx(100.0 + model_s)
    with pytest.raises(TypeError, match="expected a CollectiveResult"):
        throttled_call(NET, lambda: 42)
