"""PowerSGD: rank-r low-rank compression per layer, with error feedback and warm start.

Source: Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", NeurIPS 2019 (arXiv:1905.13727), in the form of PyTorch's DDP
communication hook ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``
(tests/test_powersgd.py checks that this method gives that hook's numbers on the same
gradients, on a real gloo group).

One iteration on rank i of P (the layout is the parameters' shapes in flat-buffer order,
``CommCall.layout``; a parameter of shape (n, ...) is the matrix (n, m), m = numel / n):

1. ``M_i = g_i + e_i`` (the error feedback memory, :class:`LowRankErrorFeedback`).
2. Split the layers: a matrix is compressed with rank ``r_l = min(n, m, r)`` when
   ``(n + m) r_l * min_compression_rate < n m`` (torch's ``min_compression_rate`` rule);
   the others (biases, small matrices) are sent dense.
3. Q per compressed layer (m x r_l): on the first call, and on every call without warm
   start, standard normal from a private ``torch.Generator`` seeded with the next draw of
   ``numpy.random.RandomState(seed).randint(10**9)`` (the hook's recipe with its
   ``random_seed``; identical on every rank; layers drawn grouped by matrix shape, as the
   hook does); with warm start, the mean Q of the previous call. Q is orthonormalised.
4. ``P_l = M_l Q_l``; one allreduce (sum) of the dense layers and all P_l together.
5. ``P^_l`` = orthonormalised P_l (Gram-Schmidt for r_l <= 2, QR otherwise, as the hook).
6. ``Q_l = M_l^T P^_l``; one allreduce (sum) of all Q_l.
7. The aggregate G (the sum over ranks the step divides by P): dense layers as summed,
   compressed ones ``P^_l (sum_j Q_l,j)^T``; Q / P is kept for the next warm start.
8. ``e_i = M_i - G / P`` (also on the dense layers, where it is ``M_i`` minus the mean:
   the hook's error feedback; the sum over ranks of that part is zero).

Both allreduces are :func:`gtopk_lab.comm.dense.allreduce_program` (recursive
halving + doubling), so real ranks and the simulator run the same per-rank program and agree
bitwise, and every rank holds the same bits. (The hook sends the dense layers in a third
allreduce of its own; packing them with P saves one allreduce's latency, same sums.)

Cost per iteration and rank, ``U`` = dense elements, ``C_P = sum_l n_l r_l``,
``C_Q = sum_l m_l r_l``: compute ``O(sum_l n_l m_l r_l)`` (two matmuls per layer, charged to
the virtual clock as the rank's compression, ``CommStats.compress_cpu_s``, like a selection) and ``O(sum_l (n_l + m_l) r_l^2)``
orthonormalisation; communication two allreduces of ``U + C_P`` and ``C_Q`` floats, i.e.
about ``2 (P-1)/P * 4 (U + C_P + C_Q)`` bytes and ``4 log2 P`` messages
(:func:`powersgd_time_s`, :func:`powersgd_bytes_per_rank`).

Options (``RunConfig.method_options``, declared in ``Method.options``, checked when the config
is built):

- ``powersgd_rank`` (int >= 1, default 1, torch's default; the paper's image experiments
  mostly use 2): the rank r;
- ``powersgd_min_compression_rate`` (number >= 0, default 2, torch's): step 2's threshold;
- ``powersgd_warm_start`` (bool, default true): reuse Q between iterations;
- ``powersgd_seed`` (int >= 0, default 0, torch's ``random_seed``): the seed of step 3.

There is no ``start_powerSGD_iter`` (vanilla allreduce first): compression starts at
iteration 0, so the method is compared as itself. Error feedback is always on (torch's
``use_error_feedback=True``); a variant without it is
``Method(name=..., selector=None, collective="powersgd", memory=None)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gtopk_lab.comm.dense import allreduce_bytes_per_rank, allreduce_program, allreduce_time_s
from gtopk_lab.comm.stats import CollectiveResult, merge_cpu_clock
from gtopk_lab.comm.tensor_programs import run_tensor_program, simulate_tensor_programs
from gtopk_lab.methods.base import Collective, CommCall, Contribution, Method
# (the plan's names are re-exported: this module is the method's public face)
from gtopk_lab.methods.powersgd_plan import (OPTION_PREFIX, LayerPlan, PowerSGDOptions, layer_plan,
                                             orthonormalize, powersgd_options)
from gtopk_lab.methods.registry import register_collective, register_method
from gtopk_lab.network.formulas import check_sizes
from gtopk_lab.network.model import NetworkModel

__all__ = ["PowerSGDOptions", "powersgd_options", "LayerPlan", "layer_plan", "orthonormalize",
           "PowerSGDState", "LowRankErrorFeedback", "powersgd_program", "powersgd_time_s",
           "powersgd_bytes_per_rank", "OPTION_PREFIX"]

#: The hook draws each seed as ``RandomState.randint(SEED_BOUND)``.
SEED_BOUND = 1_000_000_000


# =========================================================================== state and memory
@dataclass
class PowerSGDState:
    """What PowerSGD carries between calls on one rank (identical on every rank).

    ``q``: the mean Q of the last call, one ``(m, r)`` tensor per compressed layer (warm
    start; None before the first call); ``layout``: the layout it belongs to (a new layout
    starts afresh); ``seed``/``seeds_drawn``: the seed RNG of step 3 and how many seeds it
    has given (checkpoints keep these integers; the RNG is rebuilt from them).
    """

    q: list[torch.Tensor] | None = None
    layout: tuple[tuple[int, ...], ...] | None = None
    seed: int = 0
    seeds_drawn: int = 0

    def next_seed(self, seed: int) -> int:
        """The next draw of ``numpy.random.RandomState(seed).randint(10**9)`` (a private RNG,
        never numpy's global one). A new ``seed`` restarts the sequence."""
        if seed != self.seed:
            self.seed, self.seeds_drawn = seed, 0
        # the RNG object is a cache outside the dataclass fields (dataclasses.asdict, which
        # checkpoints use, leaves it out); after a restore it is rebuilt by replaying the draws
        rng, drawn = self.__dict__.get("_rng", (None, -1))
        if rng is None or drawn != self.seeds_drawn:
            rng = np.random.RandomState(self.seed)
            for _ in range(self.seeds_drawn):
                rng.randint(SEED_BOUND)
        value = int(rng.randint(SEED_BOUND))
        self.seeds_drawn += 1
        self.__dict__["_rng"] = (rng, self.seeds_drawn)
        return value


class LowRankErrorFeedback:
    """PowerSGD's error feedback on one rank: ``compensate(g) = g + e``, then
    ``e = acc - G / P`` with G the aggregate (sum over the P ranks) of the call.

    ``needs_world``: the step passes ``world=P`` (the error is against the applied mean).
    """

    needs_world = True

    def __init__(self, numel: int, rule: str = "mass", device: torch.device | str | None = None, *,
                 world: int = 1) -> None:
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"world={world!r} is invalid: expected an integer >= 1")
        self.world = world
        # named like ErrorFeedback's buffer so per-parameter stores (the DDP hook) can keep it
        self.residual = torch.zeros(numel, dtype=torch.float32, device=device)

    def compensate(self, g: torch.Tensor) -> torch.Tensor:
        return g.reshape(-1).to(self.residual.dtype) + self.residual

    def update(self, acc: torch.Tensor, values: Any, indices: Any, result: CollectiveResult) -> None:
        self.residual = acc - result.values.reshape(-1).to(acc.device) / self.world

    def state_dict(self) -> dict[str, Any]:
        return {"residual": self.residual.detach().cpu().clone()}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.residual = saved["residual"].to(self.residual.device).clone()


# =========================================================================== the program
@dataclass
class _Outcome:
    """What one rank's program hands back besides the aggregate: its new mean Q and the
    CPU seconds of its local compression work."""

    q_mean: list[torch.Tensor] = field(default_factory=list)
    cpu_s: float = 0.0


def _start_qs(state: PowerSGDState, plan: LayerPlan, options: PowerSGDOptions,
              device: torch.device) -> list[torch.Tensor]:
    """Step 3: the orthonormal Q of every compressed layer for this call (layout order).

    Called once per call and group state (the simulator's virtual ranks share one), so the
    seed RNG advances once per call on every real rank and in the simulator alike."""
    if state.layout != plan.layout:
        state.q, state.layout = None, plan.layout
    if options.warm_start and state.q is not None:
        return [orthonormalize(q.to(device).unsqueeze(0))[0] for q in state.q]
    gen = torch.Generator().manual_seed(state.next_seed(options.seed))
    qs: list[torch.Tensor | None] = [None] * len(plan.compressed)
    for j in plan.draw_order:  # CPU draws, then moved: the same numbers on every device
        _, _, m, r = plan.compressed[j]
        qs[j] = orthonormalize(torch.randn(1, m, r, generator=gen))[0].to(device)
    return [q for q in qs if q is not None]


def powersgd_program(rank: int, world: int, acc: torch.Tensor, plan: LayerPlan, qs: Sequence[torch.Tensor],
                     outcome: _Outcome) -> Generator[Any, Any, torch.Tensor]:
    """Steps 4-7 on one rank as a tensor program: returns the aggregate G (sum over ranks).

    ``acc`` is ``M_i`` (flat), ``qs`` the orthonormal Q of step 3 (read only: the
    simulator's ranks share them); the new mean Q and the compute time go to ``outcome``.
    """
    t0 = merge_cpu_clock()
    flat = acc.reshape(-1)
    mats = [flat[o:o + n * m].view(1, n, m) for o, n, m, _ in plan.compressed]
    ps = [torch.bmm(mat, q.unsqueeze(0)) for mat, q in zip(mats, qs)]
    first = torch.cat([flat[o:o + size] for o, size in plan.dense] + [p.reshape(-1) for p in ps])
    cpu = merge_cpu_clock() - t0
    # step 4 (every rank has the same plan, so all skip an empty allreduce together)
    summed = (yield from allreduce_program(rank, world, first)) if first.numel() else first
    t0 = merge_cpu_clock()
    u = plan.dense_numel
    p_hats, q_local, at = [], [], u
    for mat, (_, n, _, r) in zip(mats, plan.compressed):
        p_hat = orthonormalize(summed[at:at + n * r].view(1, n, r))  # step 5
        p_hats.append(p_hat)
        q_local.append(torch.bmm(mat.transpose(1, 2), p_hat).reshape(-1))  # step 6
        at += n * r
    second = torch.cat(q_local) if q_local else flat.new_empty(0)
    cpu += merge_cpu_clock() - t0
    q_sum = (yield from allreduce_program(rank, world, second)) if second.numel() else second
    t0 = merge_cpu_clock()
    out = torch.empty_like(flat)  # step 7
    at = 0
    for o, size in plan.dense:
        out[o:o + size] = summed[at:at + size]
        at += size
    at = 0
    for p_hat, (o, n, m, r) in zip(p_hats, plan.compressed):
        q = q_sum[at:at + m * r].view(1, m, r)
        out[o:o + n * m] = torch.bmm(p_hat, q.transpose(1, 2)).reshape(-1)
        outcome.q_mean.append((q / world)[0].clone())
        at += m * r
    outcome.cpu_s = cpu + merge_cpu_clock() - t0
    return out


def _prepared(call: CommCall) -> tuple[LayerPlan, PowerSGDOptions]:
    options = powersgd_options(call.options)
    plan = layer_plan(call.layout, options.rank, options.min_compression_rate, numel=call.numel)
    if call.state is None:
        raise ValueError("call.state is None: the powersgd collective keeps its Q in the state that "
                         "Collective.make_state builds (RankStep does this)")
    return plan, options


def _finish(result: CollectiveResult, state: PowerSGDState, outcome: _Outcome) -> CollectiveResult:
    state.q = outcome.q_mean  # step 7's Q / P, for the next warm start
    result.stats.compress_cpu_s = outcome.cpu_s  # the rank's own compression (step 3's work, done here)
    return result


def _run(contribution: Contribution, call: CommCall) -> CollectiveResult:
    """Real rank (torch.distributed): step 3, the program, the state update."""
    plan, options = _prepared(call)
    qs = _start_qs(call.state, plan, options, contribution.acc.device)
    outcome = _Outcome()
    result = run_tensor_program(lambda r, w: powersgd_program(r, w, contribution.acc, plan, qs, outcome),
                                "powersgd", call.group, like=contribution.acc)
    return _finish(result, call.state, outcome)


def _simulate(contributions: list[Contribution], call: CommCall) -> list[CollectiveResult]:
    """P virtual ranks: step 3 once for the group's one state, the same program per rank."""
    plan, options = _prepared(call)
    qs = _start_qs(call.state, plan, options, contributions[0].acc.device)
    outcomes = [_Outcome() for _ in contributions]
    results = simulate_tensor_programs(
        lambda r, w: powersgd_program(r, w, contributions[r].acc, plan, qs, outcomes[r]), "powersgd",
        len(contributions))
    for result, outcome in zip(results[1:], outcomes[1:]):
        result.stats.compress_cpu_s = outcome.cpu_s
    _finish(results[0], call.state, outcomes[0])  # every rank's new Q is the same
    return results


# =========================================================================== formulas
def _plan_for(layout: Sequence[Sequence[int]] | None, rank: int, min_compression_rate: float,
              numel: int) -> LayerPlan:
    if layout is None:
        raise ValueError("layout=None is invalid for powersgd: its traffic depends on the parameters' "
                         "shapes; pass layout=(shape, ...) (Replica.layout) and optionally rank=, "
                         "min_compression_rate=")
    return layer_plan(layout, rank, min_compression_rate, numel=numel)


def powersgd_time_s(net: NetworkModel, numel: int, k: int, workers: int, *, algorithm: str | None = None,
                    gamma_s_per_element: float = 0.0, host_cores: int | None = None, exact_k: bool = False,
                    layout: Sequence[Sequence[int]] | None = None, rank: int = 1,
                    min_compression_rate: float = 2.0) -> float:
    """Alpha-beta time of one PowerSGD call: two allreduces (:func:`allreduce_time_s`), of
    the ``U + C_P`` dense-layer and P elements, then of the ``C_Q`` Q elements (see the module
    docstring). ``layout`` is required (``ValueError`` without it); ``k`` is ignored;
    ``gamma`` unused (the matmuls are compute, measured)."""
    check_sizes(numel, k, workers)
    plan = _plan_for(layout, rank, min_compression_rate, numel)
    return (allreduce_time_s(net, plan.dense_numel + plan.p_numel, workers)
            + allreduce_time_s(net, plan.q_numel, workers))


def powersgd_bytes_per_rank(numel: int, k: int, workers: int, pair_bytes: int = 8, algorithm: str | None = None,
                            *, layout: Sequence[Sequence[int]] | None = None, rank: int = 1,
                            min_compression_rate: float = 2.0) -> float:
    """Payload bytes one rank sends per call: :func:`allreduce_bytes_per_rank` of
    ``U + C_P`` and of ``C_Q`` elements, about ``2 (P-1)/P * 4 (U + C_P + C_Q)``;
    ``layout`` required, ``k`` and ``pair_bytes`` ignored."""
    plan = _plan_for(layout, rank, min_compression_rate, numel)
    return (allreduce_bytes_per_rank(plan.dense_numel + plan.p_numel, workers)
            + allreduce_bytes_per_rank(plan.q_numel, workers))


def powersgd_formula_inputs(options: Mapping[str, Any], layout: Sequence[Sequence[int]]) -> dict[str, Any]:
    """The formulas' keywords for a run (``Collective.formula_inputs``): the parameter shapes,
    the rank and the compression threshold of its ``method_options``."""
    parsed = powersgd_options(options)
    return {"layout": [[int(n) for n in shape] for shape in layout], "rank": parsed.rank,
            "min_compression_rate": parsed.min_compression_rate}


# =========================================================================== registration
POWERSGD = register_collective(Collective(
    name="powersgd", input="dense", lossless=False, make_state=PowerSGDState, run=_run, simulate=_simulate,
    compresses=True, formula_inputs=powersgd_formula_inputs,
    time_s=powersgd_time_s, bytes_per_rank=powersgd_bytes_per_rank,
    description="PowerSGD: per-layer rank-r P/Q allreduces (needs the parameter layout)"))

register_method(Method(
    name="powersgd", selector=None, collective="powersgd", memory=LowRankErrorFeedback, color="#FECB52",
    check_options=powersgd_options,
    # declared, so RunConfig.method_options knows the names (powersgd_options checks the values)
    options={f"{OPTION_PREFIX}{f.name}": f.default for f in dataclasses.fields(PowerSGDOptions)},
    description="PowerSGD (Vogels et al., NeurIPS'19): rank-r per layer, error feedback, warm start",
    departures=("rank 1 by default (torch's hook; the paper's image runs mostly use 2)",
                "compression from iteration 0 (no start_powerSGD_iter)",
                "the dense layers ride in P's allreduce (torch's hook sends them in a third)")))
