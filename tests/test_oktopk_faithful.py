"""Ok-Topk as the reference runs it (method ``oktopk``; gtopk_lab.comm.oktopk): equal to a port
of the reference allreducer written here (70 calls, tau = 32, tau_r = 64, plain and balanced,
P = 4 and 8, the VGG and the LSTM script's bands, the reference's residual rule), balance on
layer-clustered gradients, the re-evaluation schedule, the dense warm-up, real gloo ranks ==
in-process bitwise == the port, mass conservation with the mass rule, and the cost formula
against measured steps.

The oracles are written here from the reference code's behaviour and the algorithm's
definition (who receives which pairs, which calls re-evaluate), not read from the
implementation's bookkeeping.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pickle

import pytest
import torch
import torch.distributed as dist

from gtopk_lab.comm.oktopk import schedule as oktopk_schedule
from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.comm.oktopk import (
    OkTopkFaithfulState, OkTopkState, oktopk_faithful_allreduce, sim_oktopk_allreduce,
    sim_oktopk_faithful_allreduce,
)
from gtopk_lab.compression.residual import ErrorFeedback
from gtopk_lab.compression.selection import get_selector
from gtopk_lab.config import RunConfig
from gtopk_lab.methods import CommCall, Contribution, get_method
from gtopk_lab.methods import formulas as F
from gtopk_lab.network.model import NetworkModel

PAIR = 8  # fp32 value + int32 index


# --------------------------------------------------------------------------- a port of the reference
#: The reference scripts' factors (Shigangli/Ok-Topk: VGG/allreducer.py, LSTM/allreducer.py and
#: their compression.py, the ``oktopk`` branch), as its integer and float comparisons read:
#: raise a reused local threshold by 1.03 while more than ``raise`` entries pass; after the
#: selection divide the local one by 1.012 below ``local_low``, multiply above ``local_high``;
#: after the allgather divide the global one by ``global_div`` below ``global_low`` and
#: multiply it by 1.008 above ``global_high``.
SCRIPTS = {
    "vgg": dict(raise_=lambda k: 4 * k // 3, local_low=lambda k: 2 * k / 3, local_high=lambda k: 5 * k / 4,
                global_low=lambda k: 2 * k / 3, global_high=lambda k: 4 * k / 3, global_div=1.008),
    "lstm": dict(raise_=lambda k: 3 * k // 2, local_low=lambda k: 3 * k / 4, local_high=lambda k: 5 * k / 4,
                 global_low=lambda k: 3 * k / 4, global_high=lambda k: 5 * k / 4, global_div=1.01),
}


class ReferenceOkTopk:
    """The reference allreducer's Ok-Topk for P ranks in one process (MPI's Allreduce, Alltoall
    and Allgatherv as sums and concatenations over the ranks), read from the reference code.

    Departures, the ones the project documents (comm/oktopk/schedule.py): selections take
    ``|x| >= t`` on non-zero entries (the reference's ``|x| > t``); the schedule counts from the
    end of the warm-up. Sums over ranks run in rank order (the reference adds in the order its
    messages arrive). ``events`` counts each threshold move, so a test can see they happened.
    """

    def __init__(self, world: int, numel: int, k: int, tau: int = 32, tau_r: int = 64, warmup: int = 0,
                 script: str = "vgg") -> None:
        self.p, self.numel, self.k, self.tau, self.tau_r, self.warmup = world, numel, k, tau, tau_r, warmup
        self.f = SCRIPTS[script]
        self.counter = 0
        self.local = [0.0] * world
        self.global_ = 0.0
        self.offsets = [q * numel // world for q in range(world)]
        self.events: dict[str, int] = {}

    def _event(self, name: str) -> None:
        self.events[name] = self.events.get(name, 0) + 1

    @staticmethod
    def _select(x: torch.Tensor, t: float) -> torch.Tensor:
        return torch.nonzero((x.abs() >= t) & (x != 0)).flatten()

    def call(self, accs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
        """One call on the ranks' compensated buffers: (values, indices, per-rank selections);
        a warm-up call returns the dense sum, indices None and every index as selected."""
        p, k, f = self.p, self.k, self.f
        c = self.counter - self.warmup
        self.counter += 1
        if c < 0:
            total = accs[0].clone()
            for a in accs[1:]:
                total = total + a
            return total, None, [torch.arange(self.numel)] * p
        for r, acc in enumerate(accs):  # local threshold: exact every tau calls, else raised
            if c % self.tau == 0:
                self.local[r] = float(torch.topk(acc.abs(), k).values[-1])
            else:
                t = self.local[r]
                for _ in range(5):
                    if self._select(acc, t).numel() > f["raise_"](k):
                        t *= 1.03
                        self._event("local raise")
                    else:
                        break
                self.local[r] = t
        thresholds = list(self.local)
        sels = [self._select(acc, t) for acc, t in zip(accs, thresholds)]
        if c % self.tau_r == 0:  # region repartition: the mean of the ranks' selection quantiles
            assert all(s.numel() > 0 for s in sels), "the reference indexes an empty selection here"
            picks = [s[torch.arange(1, p) * (s.numel() // p)] for s in sels]
            self.offsets = [0] + (sum(picks) // p).tolist()
        for r, s in enumerate(sels):  # after the selection: the local band
            if s.numel() < f["local_low"](k):
                self.local[r] /= 1.012
                self._event("local down")
            elif s.numel() > f["local_high"](k):
                self.local[r] *= 1.012
                self._event("local up")
        # sparse reduce-scatter: region q's sum of every rank's selected entries, in rank order
        ends = self.offsets[1:] + [self.numel]
        reduced = torch.zeros(self.numel)
        for acc, s in zip(accs, sels):
            reduced[s] += acc[s]
        if c % self.tau == 0:  # gather every region's non-zero sums, exact global top-k
            union = torch.nonzero(reduced).flatten()
            top = torch.topk(reduced[union].abs(), min(k, union.numel()))
            self.global_ = float(top.values[-1])
            kept = torch.sort(union[top.indices]).values
        else:  # each region keeps its sums above the global threshold; then the global band
            kept = torch.cat([lo + self._select(reduced[lo:hi], self.global_)
                              for lo, hi in zip(self.offsets, ends)])
            if kept.numel() < f["global_low"](k):
                self.global_ /= f["global_div"]
                self._event("global down")
            elif kept.numel() > f["global_high"](k):
                self.global_ *= 1.008
                self._event("global up")
        return reduced[kept], kept, sels

    @staticmethod
    def residual(acc: torch.Tensor, selection: torch.Tensor, indices: torch.Tensor | None) -> torch.Tensor:
        """The reference's rule: acc with the rank's selected entries that are in the result zeroed."""
        out = acc.clone()
        if indices is None:
            return torch.zeros_like(acc)
        out[selection[torch.isin(selection, indices)]] = 0.0
        return out


def drifting(p: int, rank: int, call: int, numel: int) -> torch.Tensor:
    """A gradient whose scale drifts over the calls (so the counts leave their bands), with
    its large entries clustered in a block that moves (so the regions are repartitioned)."""
    gen = torch.Generator().manual_seed(100_000 * p + 1000 * call + rank)
    scale = (1.0 + 0.7 * math.sin(call / 5)) * (1 + 0.1 * rank)
    g = 0.05 * scale * torch.randn(numel, generator=gen)
    start = (numel // 7 * (call // 20)) % (numel // 2)
    g[start:start + numel // 10] += scale * torch.randn(numel // 10, generator=gen)
    return g


@pytest.mark.timeout(120)
@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("model,script", [("cnn", "vgg"), ("lstm", "lstm")])
def test_oktopk_equals_a_port_of_the_reference_allreducer(p: int, model: str, script: str) -> None:
    """70 calls of method oktopk and oktopk-balanced, as a run configures them (its default
    residual rule, the model's bands), with error feedback, against the port: equal index sets,
    values, selections, thresholds and region boundaries at every call."""
    numel, k, calls = 20_000, 200, 70
    config = RunConfig(method="oktopk", model=model, dataset="synthetic")
    assert config.residual_rule == "paper"  # the reference's rule is the method's default
    options = config.collective_options or {}
    ref = ReferenceOkTopk(p, numel, k, tau=32, tau_r=64, script=script)
    ref_residual = [torch.zeros(numel) for _ in range(p)]
    runs = {}
    for name in ("oktopk", "oktopk-balanced"):
        method = get_method(name)
        runs[name] = (method, method.comm.make_state(**options),
                      [ErrorFeedback(numel, rule=config.residual_rule) for _ in range(p)])
    assert runs["oktopk"][1].bands == script
    for c in range(calls):
        grads = [drifting(p, r, c, numel) for r in range(p)]
        accs = [g + e for g, e in zip(grads, ref_residual)]
        want_v, want_i, want_sels = ref.call(accs)
        ref_residual = [ref.residual(a, s, want_i) for a, s in zip(accs, want_sels)]
        for name, (method, state, memories) in runs.items():
            contributions = [Contribution(gradient=g, acc=m.compensate(g)) for g, m in zip(grads, memories)]
            call = CommCall(numel=numel, k=k, algorithm=method.algorithm, state=state, iteration=c)
            results = method.comm.simulate(contributions, call)
            for r, (m, con, res) in enumerate(zip(memories, contributions, results)):
                assert torch.equal(con.indices.long(), want_sels[r]), (name, c, r)
                assert torch.equal(res.indices.long(), want_i) and torch.equal(res.values, want_v), (name, c, r)
                m.update(con.acc, con.values, con.indices, res)
                assert torch.equal(m.residual, ref_residual[r]), (name, c, r)
            buf = state.buffers[numel]
            assert buf.local_thresholds == ref.local and buf.global_threshold == ref.global_, (name, c)
            assert buf.boundaries == ref.offsets + [numel], (name, c)
    # the data moved every threshold the way the script says, so each rule was compared
    assert set(ref.events) == {"local raise", "local down", "local up", "global down", "global up"}, ref.events


def clustered(p: int, rank: int, call: int, numel: int = 200_000, block: tuple[int, int] = (123_457, 2000)
              ) -> torch.Tensor:
    """Layer-clustered buffer: small noise everywhere, the large entries in one block."""
    gen = torch.Generator().manual_seed(1000 * call + 10 * p + rank)
    acc = 0.01 * torch.randn(numel, generator=gen)
    start, size = block
    acc[start:start + size] += torch.randn(size, generator=gen)
    return acc


def received_pairs(phases: dict[str, dict[str, int]], names: tuple[str, ...]) -> int:
    return sum((phases[n]["recv"] - 8 * phases[n]["recv_msgs"]) // PAIR for n in names if n in phases)


def region_counts(indices: torch.Tensor, bounds: list[int]) -> list[int]:
    """How many of ``indices`` fall in each region [b_q, b_{q+1})."""
    i = indices.to(torch.int64)
    return [int(((i >= bounds[q]) & (i < bounds[q + 1])).sum()) for q in range(len(bounds) - 1)]


def check_balance(accs: list[torch.Tensor], k: int, mode: str) -> dict[str, float]:
    """Two calls (re-evaluation, then reuse) of Ok-Topk and one of oktopk-exact; asserts the
    received volume of every rank against the oracle and the bound; returns max recv / k.

    The selections S_s and the regions R_q are the port's (:class:`ReferenceOkTopk`), so the
    oracle does not read the implementation's boundaries.

    Bound. Rank q receives in the reduce-scatter sum_{s != q} |S_s ∩ R_q|; the averaged
    quantile boundaries put about |S_s| / P of every rank's selection in each region, so
    that is about (P-1)/P n_sel (n_sel the mean selection). In the allgather every rank
    receives every other block once: n_kept - (own block), about (P-1)/P n_kept. So the
    busiest rank receives about (P-1)/P (n_sel + n_kept) ~ 2 (P-1)/P k; we allow 1.2x for
    the quantiles' granularity and the spread of selection sizes.
    """
    p = len(accs)
    numel = accs[0].numel()
    state = OkTopkFaithfulState()
    ref = ReferenceOkTopk(p, numel, k)  # the selections and regions the reference would have
    ratios: dict[str, float] = {}
    for call, kind in enumerate(("reevaluate", "reuse")):
        scaled = [a * (1 + 0.01 * call) for a in accs]
        outs = sim_oktopk_faithful_allreduce(scaled, k, state=state, allgather=mode)
        _, kept, sels = ref.call(scaled)
        bounds = ref.offsets + [numel]
        assert state.last["kind"] == kind
        result = outs[0][0]
        assert torch.equal(result.indices.long(), kept)
        for other, _ in outs[1:]:  # identical on every rank
            assert torch.equal(other.values, result.values) and torch.equal(other.indices, result.indices)
        for (_, (_, impl)), want in zip(outs, sels):
            assert torch.equal(impl.long(), want)
        n_sel = sum(s.numel() for s in sels) / p
        n_kept = result.indices.numel()
        per_region = [region_counts(s, bounds) for s in sels]
        kept_in = region_counts(result.indices, bounds)
        gather = "reevaluation" if kind == "reevaluate" else "allgather"
        recv = []
        for q in range(p):
            rs_oracle = sum(per_region[s][q] for s in range(p) if s != q)
            assert received_pairs(state.phases[q], ("reduce_scatter",)) == rs_oracle
            if mode == "plain" and kind == "reuse":
                assert received_pairs(state.phases[q], (gather,)) == n_kept - kept_in[q]
            recv.append(received_pairs(state.phases[q], ("reduce_scatter", gather, "balance")))
        bound = 1.2 * (p - 1) / p * (n_sel + n_kept)
        if kind == "reuse":
            assert max(recv) <= bound, (mode, p, max(recv), bound)
        ratios[f"{mode}/{kind}"] = max(recv) / k
    # oktopk-exact on the same selections: the histogram cannot split the block
    values, indices = zip(*[get_selector("topk")(a, k) for a in accs])
    exact_state = OkTopkState()
    sim_oktopk_allreduce(list(values), list(indices), numel, k, state=exact_state)
    per_region = [region_counts(i, exact_state.boundaries) for i in indices]
    owner_rs = max(sum(per_region[s][q] for s in range(p) if s != q) for q in range(p))
    # O(kP) at one or two ranks (the block may straddle a bin edge), beyond Ok-Topk's bound
    assert owner_rs >= 0.5 * (p - 1) * k
    assert owner_rs > 1.2 * 2 * (p - 1) / p * k
    ratios["exact/reduce_scatter"] = owner_rs / k
    return ratios


@pytest.mark.timeout(120)
@pytest.mark.parametrize("p", [4, 8])
def test_balanced_on_layer_clustered_gradients(p: int) -> None:
    """P ranks, d = 200k, k = 2000, the large entries of every rank in one 2000-element block."""
    accs = [clustered(p, r, 0) for r in range(p)]
    for mode in ("plain", "balanced"):
        ratios = check_balance(accs, 2000, mode)
        print(p, ratios)
        assert ratios[f"{mode}/reuse"] <= 1.2 * 2 * (p - 1) / p * 1.1


@pytest.mark.timeout(120)
def test_balanced_on_a_real_models_gradient() -> None:
    """The gradients of an MLP's backward pass (the output layer's entries are the large ones)."""
    p = 8
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(400, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10))
    accs = []
    for r in range(p):
        gen = torch.Generator().manual_seed(r)
        x, y = torch.randn(32, 400, generator=gen), torch.randint(0, 10, (32,), generator=gen)
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        accs.append(torch.cat([q.grad.reshape(-1) for q in model.parameters()]).clone())
    k = accs[0].numel() // 100
    ratios = check_balance(accs, k, "plain")
    print(ratios)


def _counting(monkeypatch: pytest.MonkeyPatch, name: str, counts: dict[str, int]) -> None:
    original = getattr(oktopk_schedule, name)

    def counted(*args, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        return original(*args, **kwargs)

    monkeypatch.setattr(oktopk_schedule, name, counted)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("warmup", [0, 5])
def test_thresholds_re_evaluated_exactly_every_tau_and_reused_between(monkeypatch: pytest.MonkeyPatch,
                                                                      warmup: int) -> None:
    """Which calls evaluate exactly (one top-k per rank and of the union) and which reuse; the
    reused values themselves are the port's (test_oktopk_equals_a_port_of_the_reference_allreducer)."""
    p, numel, k, calls, tau, tau_r = 4, 4000, 40, 100, 32, 64
    counts: dict[str, int] = {}
    for name in ("kth_largest_magnitude", "global_topk", "quantile_boundaries"):
        _counting(monkeypatch, name, counts)
    state = OkTopkFaithfulState(tau=tau, tau_r=tau_r, warmup=warmup)
    gen = torch.Generator().manual_seed(1)
    kinds = []
    for c in range(calls):
        accs = [torch.randn(numel, generator=gen) * (1 + 0.3 * r) for r in range(p)]
        sim_oktopk_faithful_allreduce(accs, k, state=state)
        kinds.append(state.last["kind"])
    sparse = [c - warmup for c in range(calls) if c >= warmup]
    reevaluations = sum(s % tau == 0 for s in sparse)
    assert kinds == ["warmup"] * warmup + ["reevaluate" if s % tau == 0 else "reuse" for s in sparse]
    assert counts["kth_largest_magnitude"] == p * reevaluations  # one exact top-k per rank
    assert counts["global_topk"] == p * reevaluations            # every rank selects from U
    assert counts["quantile_boundaries"] == p * sum(s % tau_r == 0 for s in sparse)


@pytest.mark.timeout(60)
def test_warmup_calls_are_a_dense_allreduce() -> None:
    p, numel, k = 3, 1001, 10
    state = OkTopkFaithfulState(warmup=3)
    assert state.describe()["oktopk_warmup_iterations"] == 3
    gen = torch.Generator().manual_seed(2)
    for call in range(4):
        # integer-valued: any summation order is exact, so the oracle is the plain sum
        accs = [torch.randint(-50, 50, (numel,), generator=gen).float() for _ in range(p)]
        outs = sim_oktopk_faithful_allreduce(accs, k, state=state)
        result = outs[0][0]
        if call < 3:
            assert result.indices is None and result.stats.collective == "dense_allreduce"
            assert torch.equal(result.values, sum(accs))
            # a ring: 2 (P-1) rounds of about d/P floats each way
            assert result.stats.rounds == 2 * (p - 1)
            assert abs(result.stats.bytes_sent - 2 * (p - 1) * (4 * numel / p + 8)) <= 2 * (p - 1) * 4
            for r, (_res, (sv, si)) in enumerate(outs):  # everything was applied: nothing stays behind
                assert torch.equal(si.long(), torch.arange(numel)) and torch.equal(sv, accs[r])
        else:
            assert result.indices is not None and result.stats.collective == "oktopk_allreduce"
            assert state.last == {"numel": numel, "call": 3, "kind": "reevaluate", "repartition": True}


@pytest.mark.timeout(90)
def test_training_run_with_a_warmup_variant() -> None:
    """A method built with oktopk_collective(warmup=2) runs dense for 2 iterations in training."""
    from gtopk_lab.config import RunConfig
    from gtopk_lab.methods import Method, register_method, unregister_method
    from gtopk_lab.methods.oktopk import OKTOPK_SELECTOR, oktopk_collective
    from gtopk_lab.training.simulator import simulate

    register_method(Method(name="oktopk-test-warmup", selector=OKTOPK_SELECTOR, algorithm="plain",
                           collective=oktopk_collective("oktopk-test-warmup", warmup=2)), replace=True)
    try:
        cfg = RunConfig(method="oktopk-test-warmup", workers=2, model="mlp", density=0.02, max_iterations=4,
                        train_samples=64, test_samples=32, batch_size=8, bandwidth="1GbE")
        run = simulate(cfg)
        rows = [r for r in run.rows if r["kind"] == "iter" and r["rank"] == 0]
        numel = run.summary["numel"]
    finally:
        unregister_method("oktopk-test-warmup")
    dense_bytes = 2 * (2 - 1) * (4 * numel / 2 + 8)
    assert [r["bytes_sent"] for r in rows[:2]] == pytest.approx([dense_bytes] * 2, abs=8)
    assert all(r["bytes_sent"] < dense_bytes / 5 for r in rows[2:])


# --------------------------------------------------------------------------- real gloo ranks
CALLS, TAU, TAU_R, WARMUP, NUMEL, K = 7, 2, 3, 1, 3000, 30


def real_input(p: int, rank: int, call: int) -> torch.Tensor:
    """A shared cluster (large after summing) plus rank-specific entries: kept blocks are
    imbalanced, so the balanced allgather moves data."""
    gen = torch.Generator().manual_seed(100 * p + 10 * call + rank)
    acc = 0.1 * torch.randn(NUMEL, generator=gen)
    acc[100:130] += 3.0 + torch.rand(30, generator=gen)
    own = torch.randperm(NUMEL, generator=gen)[:20]
    acc[own] += 2.0 * torch.randn(20, generator=gen)
    return acc


def _gloo_job(rank: int, world: int) -> dict:
    out: dict = {}
    for p in (2, 4):
        group = dist.new_group(list(range(p)))  # every rank takes part in new_group
        if rank >= p:
            continue
        for mode in ("plain", "balanced"):
            state = OkTopkFaithfulState(tau=TAU, tau_r=TAU_R, warmup=WARMUP)
            calls = []
            for call in range(CALLS):
                res, sel = oktopk_faithful_allreduce(real_input(p, rank, call), K, group=None if p == world else group,
                                                     state=state, allgather=mode)
                calls.append((res, sel))
            out[(p, mode)] = (calls, dataclasses.asdict(state))
    dist.barrier()
    return out


@functools.lru_cache(maxsize=1)
def _gloo_results() -> list[dict]:
    return run_gloo(_gloo_job, 4, timeout_s=120)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("p", [2, 4])
def test_real_gloo_ranks_equal_in_process_bitwise_and_the_port(p: int) -> None:
    results = _gloo_results()
    for mode in ("plain", "balanced"):
        state = OkTopkFaithfulState(tau=TAU, tau_r=TAU_R, warmup=WARMUP)
        ref = ReferenceOkTopk(p, NUMEL, K, tau=TAU, tau_r=TAU_R, warmup=WARMUP)
        moved = 0
        for call in range(CALLS):
            accs = [real_input(p, r, call) for r in range(p)]
            sim = sim_oktopk_faithful_allreduce(accs, K, state=state, allgather=mode)
            want_v, want_i, want_sels = ref.call(accs)
            real0 = results[0][(p, mode)][0][call][0]
            if want_i is None:  # warm-up: the ring adds in another order than the port
                torch.testing.assert_close(real0.values, want_v, rtol=1e-6, atol=1e-6)
            else:  # the real ranks are the reference's algorithm too
                assert torch.equal(real0.indices.long(), want_i) and torch.equal(real0.values, want_v)
                for r in range(p):
                    assert torch.equal(results[r][(p, mode)][0][call][1][1].long(), want_sels[r])
            moved += sum(received_pairs(ph, ("balance",)) for ph in state.phases)
            for r in range(p):
                (got, (gv, gi)), (want, (wv, wi)) = results[r][(p, mode)][0][call], sim[r]
                assert torch.equal(got.values, want.values)
                assert (got.indices is None) == (want.indices is None)
                if got.indices is not None:
                    assert torch.equal(got.indices, want.indices)
                    assert torch.equal(got.indices, sim[0][0].indices)  # identical on every rank
                    assert torch.equal(got.stats.dropped_values, want.stats.dropped_values)
                    assert torch.equal(got.stats.dropped_indices, want.stats.dropped_indices)
                a, b = got.stats, want.stats
                assert (a.collective, a.algorithm, a.bytes_sent, a.bytes_recv, a.messages, a.rounds, a.steps) == \
                       (b.collective, b.algorithm, b.bytes_sent, b.bytes_recv, b.messages, b.rounds, b.steps)
                assert torch.equal(gv, wv) and torch.equal(gi, wi)
        for r in range(p):  # the states agree: each real rank holds its own local threshold
            real_state = results[r][(p, mode)][1]
            real_buf, sim_buf = real_state["buffers"][NUMEL], dataclasses.asdict(state)["buffers"][NUMEL]
            assert real_buf["boundaries"] == sim_buf["boundaries"]
            assert real_buf["global_threshold"] == sim_buf["global_threshold"]
            assert real_buf["local_thresholds"][r] == sim_buf["local_thresholds"][r]
        if mode == "balanced":
            assert moved > 0  # the data balancing was exercised


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["plain", "balanced"])
def test_mass_conserved_with_the_mass_rule(mode: str) -> None:
    """Error feedback "mass": sum_i residual_i + G == sum_i acc_i at every call (warm-up included)."""
    p = 3
    memories = [ErrorFeedback(NUMEL, rule="mass") for _ in range(p)]
    state = OkTopkFaithfulState(tau=3, tau_r=4, warmup=1)
    for call in range(8):
        accs = [m.compensate(real_input(p, r, call)) for r, m in enumerate(memories)]
        outs = sim_oktopk_faithful_allreduce(accs, K, state=state, allgather=mode)
        for m, acc, (res, (sv, si)) in zip(memories, accs, outs):
            m.update(acc, sv, si, res)
        G = torch.zeros(NUMEL)
        res = outs[0][0]
        if res.indices is None:
            G += res.values
        else:
            G[res.indices.long()] = res.values
        torch.testing.assert_close(sum(m.residual for m in memories) + G, sum(accs), rtol=0, atol=1e-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["plain", "balanced"])
def test_formula_follows_the_measured_steps(mode: str) -> None:
    """Uniform selections, P = 8: the per-phase formulas predict the modelled time of the steps."""
    p, numel, k = 8, 100_000, 1000
    gen = torch.Generator().manual_seed(4)
    accs = [torch.randn(numel, generator=gen) for _ in range(p)]
    state = OkTopkFaithfulState()
    net = NetworkModel.from_strings("1GbE")
    for kind in ("reevaluate", "reuse"):
        outs = sim_oktopk_faithful_allreduce(accs, k, state=state, allgather=mode)
        assert state.last["kind"] == kind
        measured = max(net.steps_time_s(res.stats.steps) for res, _ in outs)
        n_kept = outs[0][0].indices.numel()
        union = sum(int(r.stats.dropped_indices.numel()) for r, _ in outs) + n_kept
        ph = F.oktopk_phase_times_s(net, numel, k, p, allgather=mode, kept=n_kept, union=union)
        predicted = ph["reduce_scatter"] + (ph["reevaluation"] + ph["repartition"] if kind == "reevaluate"
                                            else ph["allgather"])
        print(mode, kind, f"measured {measured * 1e3:.3f} ms, formula {predicted * 1e3:.3f} ms")
        assert measured == pytest.approx(predicted, rel=0.05), (kind, measured, predicted)
    amortised = F.oktopk_time_s(net, numel, k, p, allgather=mode)
    assert ph["reduce_scatter"] < amortised < ph["reduce_scatter"] + ph["reevaluation"]
    lower = F.sparse_allreduce_lower_bound_time_s(net, numel, k, p)
    assert lower < amortised <= F.oktopk_paper_bound_time_s(net, numel, k, p)


@pytest.mark.timeout(30)
def test_state_validation_checkpoint_and_registry() -> None:
    from gtopk_lab.methods import get_method

    with pytest.raises(ValueError, match="tau=0"):
        OkTopkFaithfulState(tau=0)
    with pytest.raises(TypeError, match="warmup"):
        OkTopkFaithfulState(warmup=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="allgather='ring'"):
        sim_oktopk_faithful_allreduce([torch.randn(10)], 2, allgather="ring")
    with pytest.raises(TypeError, match="OkTopkFaithfulState"):
        sim_oktopk_faithful_allreduce([torch.randn(10)], 2, state=OkTopkState())  # type: ignore[arg-type]
    state = OkTopkFaithfulState(tau=4)
    for _ in range(3):
        sim_oktopk_faithful_allreduce([torch.randn(500), torch.randn(500)], 5, state=state)
    # a checkpoint stores dataclasses.asdict and rebuilds with the constructor (RankStep)
    again = OkTopkFaithfulState(**dataclasses.asdict(state))
    assert again == state and pickle.loads(pickle.dumps(state)) == state
    # a re-evaluation on buffers with fewer than k non-zeros keeps no 0 threshold (it would
    # pass every entry for tau calls): the next call evaluates again
    zero = OkTopkFaithfulState(tau=8)
    sim_oktopk_faithful_allreduce([torch.zeros(500), torch.zeros(500)], 5, state=zero)
    assert zero.buffers[500].global_threshold is None and zero.buffers[500].local_thresholds == [None, None]
    (res, _), _ = sim_oktopk_faithful_allreduce([torch.randn(500), torch.randn(500)], 5, state=zero)
    assert zero.last["kind"] == "reevaluate" and res.indices.numel() == 5
    # P = 1 runs the same program without messages
    (res, _sel), = sim_oktopk_faithful_allreduce([torch.randn(500)], 5)
    assert res.indices.numel() == 5 and res.stats.steps == []
    # registry: the default is the reference's algorithm, the earlier one stays available
    assert get_method("oktopk").comm.name == "oktopk" and get_method("oktopk").algorithm == "plain"
    assert get_method("oktopk-balanced").algorithm == "balanced"
    assert get_method("oktopk-exact").comm.make_state is OkTopkState
    assert get_method("oktopk").comm.algorithms == ("plain", "balanced")
    # the reference's residual rule by default, the mass rule when a run names it
    assert [get_method(m).config_defaults.get("residual_rule") for m in ("oktopk", "oktopk-balanced",
                                                                         "oktopk-exact")] == ["paper", "paper", None]
    assert RunConfig(method="oktopk", residual_rule="mass").residual_rule == "mass"
    assert RunConfig(method="oktopk-exact").residual_rule == "mass"
    with pytest.raises(ValueError, match="bands='rnn' is invalid: expected one of vgg, lstm"):
        OkTopkFaithfulState(bands="rnn")
    assert OkTopkFaithfulState(bands="lstm").describe()["oktopk_bands"] == "lstm"
