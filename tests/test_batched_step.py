"""The simulator's batched steps (gtopk_lab.training.batched_step): the row-wise top-k against
per-row ``torch.topk`` (ties included), the batched memory update against the residual rules
written out here rank by rank, the refusals, and what a simulated run's summary says."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gtopk_lab.comm.inprocess import sim_gtopk_allreduce, sim_topk_allgather
from gtopk_lab.compression.fast_topk_rows import numba_rows_topk, rows_topk_applies
from gtopk_lab.config import RunConfig
from gtopk_lab.methods import get_method
from gtopk_lab.training.batched_step import BatchedSteps, batched_step_refusal, batched_topk
from gtopk_lab.training.simulator import simulate
from gtopk_lab.training.step import RankStep
from gtopk_lab.training.step_settings import StepSettings


def _rows(kind: str, world: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "normal":
        return torch.randn(world, d, generator=gen)
    if kind == "ties":  # few distinct magnitudes: most of the k-th largest |x| is a tie
        return torch.randint(-3, 4, (world, d), generator=gen).float()
    return torch.zeros(world, d)  # every entry ties


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["normal", "ties", "zeros"])
@pytest.mark.parametrize(("world", "d", "k"), [(64, 5210, 52), (8, 1000, 10), (4, 100, 30), (3, 50, 50),
                                               (5, 40, 1), (2, 70_000, 700)])
def test_batched_topk_selects_what_torch_topk_selects_on_each_row(kind: str, world: int, d: int, k: int) -> None:
    x = _rows(kind, world, d, seed=d + k)
    values, indices = batched_topk(x, k)
    assert values.shape == indices.shape == (world, k) and indices.dtype == torch.int32
    for r in range(world):  # oracle: one rank's own exact top-k of |x| (k = d: every index)
        own = torch.arange(d) if k == d else torch.topk(x[r].abs(), k, sorted=False).indices
        got = indices[r].long()
        assert torch.equal(got.sort().values, own.sort().values), (kind, r)  # same set, same ties
        assert torch.equal(values[r], x[r][got])


def _stable_top(row: np.ndarray, k: int) -> tuple[np.ndarray | None, bool]:
    """Oracle for the row kernel: (the k indices of largest |x|, ascending; None for a NaN) and
    whether that set is unique (no magnitude equal to the k-th largest is left out)."""
    mag = np.abs(row.astype(np.float64))
    if np.isnan(mag).any():
        return None, False
    order = np.argsort(-mag, kind="stable")
    kth = mag[order[k - 1]]
    unique = k == row.size or mag[order[k]] != kth
    return np.sort(order[:k]), bool(unique)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("world", "d", "k"), [(6, 1023, 7), (6, 1024, 1), (6, 1025, 1024), (4, 5710, 57),
                                               (3, 3000, 2999), (3, 40_000, 400)])
def test_the_row_kernel_returns_each_unique_top_k_set_and_flags_ties_and_nan(world: int, d: int, k: int) -> None:
    gen = torch.Generator().manual_seed(d)
    x = torch.randn(world, d, generator=gen) * torch.logspace(-3, 3, world).unsqueeze(1)
    x[1] = torch.where(x[1] > 0, 1.0, -1.0)  # one magnitude: a tie across any cut (k < d)
    x[0, ::7] = x[0, 3]  # ties away from the cut (unless one lands on it: the oracle says which)
    x[2, 5] = float("inf")
    if world > 3:
        x[3, d // 2] = float("nan")
    values, indices, ok = numba_rows_topk(x, k)
    assert values.shape == indices.shape == (world, k) and indices.dtype == torch.int64
    flags = [_stable_top(x[r].numpy(), k)[1] for r in range(world)]
    assert flags[0] and not flags[1]  # both paths are exercised
    for r in range(world):
        want, unique = _stable_top(x[r].numpy(), k)
        assert bool(ok[r]) == unique, r
        if unique:
            assert np.array_equal(indices[r].numpy(), want), r
            assert torch.equal(values[r].view(torch.int32), x[r][indices[r]].view(torch.int32)), r
    assert rows_topk_applies(x, k) and not rows_topk_applies(x, d) and not rows_topk_applies(x.double(), k)


@pytest.mark.timeout(10)
def test_batched_topk_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match=r"^acc has shape \(5,\): expected \[P, d\]$"):
        batched_topk(torch.zeros(5), 1)
    with pytest.raises(ValueError, match="k=6 is invalid"):
        batched_topk(torch.zeros(2, 5), 6)


def _steps(method: str, world: int, d: int, rule: str) -> list[RankStep]:
    settings = StepSettings(get_method(method), world=world, residual_rule=rule)
    return [RankStep(settings, d, torch.device("cpu"), rank=r) for r in range(world)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rule", ["mass", "paper"])
@pytest.mark.parametrize(("method", "world"), [("gtopk", 6), ("gtopk", 8), ("topk", 5)])
def test_batched_memory_update_follows_the_residual_rule_on_every_rank(method: str, world: int, rule: str) -> None:
    d, k = 300, 12
    steps = _steps(method, world, d, rule)
    batched = BatchedSteps(steps)
    gen = torch.Generator().manual_seed(world)
    start = [torch.randn(d, generator=gen) * 0.1 for _ in range(world)]
    for memory, residual in zip((s.memory for s in steps), start):
        memory.residual = residual.clone()
    # ties between ranks' magnitudes, so that merges drop entries
    grads = torch.randint(-4, 5, (world, d), generator=gen).float()
    round_ = batched.begin(grads, k)
    values = [c.values for c in round_.contributions]
    indices = [c.indices for c in round_.contributions]
    results = (sim_gtopk_allreduce(values, indices, d, k, exact_k=True) if method == "gtopk"
               else sim_topk_allgather(values, indices, d, exact_count=k))
    batched.update_memories(round_, results)
    update = batched.update(round_, results)
    dropped_any = False
    for r in range(world):  # oracle: the rules of compression/residual.py, one rank at a time
        acc = grads[r] + start[r]
        own = torch.topk(acc.abs(), k, sorted=False).indices
        mine = round_.contributions[r].indices.long()  # the same set (its order is the kernel's)
        assert torch.equal(mine.sort().values, own.sort().values)
        assert torch.equal(round_.contributions[r].values, acc[mine])
        expected = acc.clone()
        global_set = set(results[r].indices.tolist())
        for i in own.tolist():
            if rule == "mass" or i in global_set:
                expected[i] = 0.0
        drops = results[r].stats.dropped_indices
        if rule == "mass" and drops is not None:
            for i, v in zip(drops.tolist(), results[r].stats.dropped_values.tolist()):
                expected[i] += v
                dropped_any = True
        assert torch.equal(steps[r].memory.residual, expected), r
    assert dropped_any or rule == "paper" or method == "topk"
    total = torch.zeros(d)
    total[results[0].indices.long()] = results[0].values
    assert torch.equal(update, total / world)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("method", "fields", "reason"), [
    ("gaussiank", {}, "selector 'gaussiank_select' has no row-wise form that selects exactly what one rank's "
                      "call selects"),
    ("ef21", {}, "method 'ef21' keeps its own memory (EF21Memory): its update runs rank by rank"),
    ("powersgd", {}, "method 'powersgd' keeps its own memory (LowRankErrorFeedback): its update runs rank by rank"),
    ("gtopk", {"momentum_correction": True, "momentum": 0.9},
     "momentum correction (DGC) keeps a velocity per rank: not batched"),
    ("gtopk", {"grad_clip": 1.0, "grad_clip_mode": "local"},
     "grad_clip_mode='local' clips each rank by its own norm: not batched"),
])
def test_methods_that_cannot_batch_their_steps_say_why(method: str, fields: dict, reason: str) -> None:
    step = RankStep(StepSettings(get_method(method), world=4, **fields), 100, torch.device("cpu"))
    assert batched_step_refusal(step) == reason
    with pytest.raises(ValueError, match="^BatchedSteps is invalid for this run: "):
        BatchedSteps([step])
    gtopk = RankStep(StepSettings(get_method("gtopk"), world=4), 100, torch.device("cpu"))
    assert batched_step_refusal(gtopk, "cuda:0") == ("device 'cuda:0': the row-wise top-k is checked against "
                                                     "each rank's on CPU only")
    for ok in ("dense", "topk", "gtopk", "oktopk-exact"):
        assert batched_step_refusal(RankStep(StepSettings(get_method(ok), world=4), 100, torch.device("cpu"))) is None


@pytest.mark.timeout(60)
def test_a_simulated_run_says_what_ran_batched_and_charges_every_rank_alike() -> None:
    base = dict(workers=4, model="mlp", dataset="mnist1d", train_samples=4 * 8 * 3, test_samples=16, batch_size=8,
                epochs=1, max_iterations=3, density=0.05, simulator={"batched": "on"})
    run = simulate(RunConfig(method="gtopk", **base))
    summary = run.summary
    assert summary["batched_steps"] is True and summary["batched_steps_refusal"] is None
    assert summary["selection_s_attribution"] == "one_rank_call"
    iterations = {r["iteration"] for r in run.rows if r["kind"] == "iter"}
    assert len(iterations) >= 2
    for it in iterations:  # rank 0's own selection call, charged to every rank alike
        selections = {r["selection_s"] for r in run.rows if r["kind"] == "iter" and r["iteration"] == it}
        assert len(selections) == 1 and selections.pop() > 0
    other = simulate(RunConfig(method="gaussiank", **base)).summary
    assert other["batched_ranks"] is True and other["batched_steps"] is False
    assert other["selection_s_attribution"] == "per_rank" and other["batched_steps_refusal"].startswith("selector")
    off = simulate(RunConfig(method="gtopk", **{**base, "simulator": {"batched": "off"}})).summary
    assert off["batched_steps"] is False and off["batched_steps_refusal"] == "the gradients are not batched"


@pytest.mark.timeout(120)
def test_a_batched_simulated_run_resumes_from_its_checkpoint_to_the_same_weights(tmp_path) -> None:
    config = RunConfig(method="gtopk", workers=4, model="mlp", dataset="synthetic", train_samples=256,
                       test_samples=32, epochs=3, batch_size=16, density=0.05, momentum=0.9, checkpoint=True,
                       simulator={"batched": "on"}, extra={"return_weights": True})
    whole = simulate(config)
    assert whole.summary["batched_steps"] is True
    folder = str(tmp_path / "checkpoints")
    simulate(config.replace(epochs=1), checkpoint_dir=folder)  # "interrupted" after epoch 1 of 3
    resumed = simulate(config, checkpoint_dir=folder, resume_from=folder)
    assert min(r["iteration"] for r in resumed.rows if r["kind"] == "iter") > 0
    assert torch.equal(whole.final_weights, resumed.final_weights)


def test_drop_pieces_add_up_to_the_coalesced_drops() -> None:
    """``CommStats.drop_pieces``: the pending parts unsummed; added into a dense vector they
    give what the coalesced ``dropped_values`` / ``dropped_indices`` give (oracle: a dense sum
    written here)."""
    from gtopk_lab.comm.stats import CommStats

    gen = torch.Generator().manual_seed(3)
    parts = [(torch.randn(5, generator=gen), torch.tensor([1, 4, 7, 9, 12])),
             (torch.randn(3, generator=gen), torch.tensor([4, 9, 30]))]
    want = torch.zeros(40)
    for v, i in parts:
        for value, index in zip(v.tolist(), i.tolist()):
            want[index] += value
    stats = CommStats(collective="gtopk_allreduce", algorithm="tree", dropped_parts=parts)
    pieces = stats.drop_pieces()
    assert len(pieces) == 2  # not summed by asking
    got = torch.zeros(40)
    for v, i in pieces:
        got.index_add_(0, i, v)
    assert torch.allclose(got, want)
    coalesced = torch.zeros(40).index_add_(0, stats.dropped_indices.long(), stats.dropped_values)
    assert torch.allclose(coalesced, want)
    assert len(stats.drop_pieces()) == 1  # after a read: the one coalesced piece
    assert CommStats(collective="topk_allgather", algorithm="ring").drop_pieces() == []
