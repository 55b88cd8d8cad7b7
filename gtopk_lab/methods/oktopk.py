"""Ok-Topk (Li & Hoefler, PPoPP'22): its collectives and methods.

Collectives:

- ``oktopk`` (alias ``oktopk_faithful``): Ok-Topk as its reference code runs it
  (:mod:`gtopk_lab.comm.oktopk`): thresholds re-evaluated every tau calls and reused in
  between, boundaries from the ranks' selection quantiles, dense warm-up; patterns ``plain``
  (the reference's Allgatherv) and ``balanced`` (the paper's balanced allgather); O(k) per
  rank. :func:`oktopk_collective` builds variants with other tau, tau_r or warm-up;
- ``oktopk-exact``: the project's earlier Ok-Topk-style allreduce: exact global top-k every
  call, histogram-balanced regions (O(kP) on layer-clustered selections).

Methods: ``oktopk``, ``oktopk-balanced``, ``oktopk-exact``. Under the ``paper`` preset
``oktopk`` and ``oktopk-balanced`` start with the reference's dense warm-up
(:func:`oktopk_preset_options`: 512 iterations, 128 for language models).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from gtopk_lab.comm import oktopk
from gtopk_lab.comm.stats import CollectiveResult
from gtopk_lab.compression.merge import index_dtype
from gtopk_lab.methods import formulas as F
from gtopk_lab.methods.base import Collective, CommCall, Contribution, Method
from gtopk_lab.methods.registry import register_collective, register_method

__all__ = ["oktopk_collective", "oktopk_preset_options", "OKTOPK_SELECTOR", "OKTOPK_PAPER_WARMUP",
           "OKTOPK_DEPARTURES", "OKTOPK_EXACT", "OKTOPK"]


@F.checked
def _oktopk_exact_time_s(net: Any, numel: int, k: int, workers: int, *, algorithm: str | None = None,
                         gamma_s_per_element: float = 0.0, host_cores: int | None = None,
                         exact_k: bool = False) -> float:
    return F.oktopk_exact_time_s(net, numel, k, workers, gamma_s_per_element)


def _pairs(contributions: list[Contribution]) -> tuple[list[Any], list[Any]]:
    return [c.values for c in contributions], [c.indices for c in contributions]


OKTOPK_EXACT = register_collective(Collective(
    name="oktopk-exact", aliases=("oktopk_allreduce", "oktopk_exact"), lossless=False, make_state=oktopk.OkTopkState,
    run=lambda c, call: oktopk.oktopk_allreduce(c.values, c.indices, call.numel, call.k, group=call.group,
                                                state=call.state),
    simulate=lambda cs, call: oktopk.sim_oktopk_allreduce(*_pairs(cs), call.numel, call.k, state=call.state),
    time_s=_oktopk_exact_time_s, bytes_per_rank=F.oktopk_exact_bytes_per_rank,
    description="Ok-Topk-style, exact: histogram-balanced reduce-scatter + exact threshold + allgather"))


def _selected_by_collective(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ok-Topk's placeholder selection: its thresholds are collective state, so the
    collective selects (and hands its selection back into the Contribution)."""
    return x[:0], torch.empty(0, dtype=index_dtype(x.numel()), device=x.device)


def oktopk_collective(name: str, *, tau: int = 32, tau_r: int = 64, warmup: int = 0,
                      aliases: tuple[str, ...] = (), description: str = "") -> Collective:
    """An Ok-Topk :class:`Collective` with its own schedule (re-evaluation period ``tau``,
    repartition period ``tau_r``, ``warmup`` dense calls) and the formulas that follow it.

    Patterns: ``plain`` | ``balanced`` (the allgather). Use it with
    ``Method(name, collective=oktopk_collective(name, warmup=512), selector=OKTOPK_SELECTOR,
    algorithm="plain")``: Ok-Topk selects inside the collective, by its thresholds.
    """
    make_state = functools.partial(oktopk.OkTopkFaithfulState, tau=tau, tau_r=tau_r, warmup=warmup)
    make_state()  # validate the schedule now, not at the first call

    def run(c: Contribution, call: CommCall) -> CollectiveResult:
        result, selection = oktopk.oktopk_faithful_allreduce(c.acc, call.k, group=call.group, state=call.state,
                                                             allgather=call.algorithm or "plain")
        # the residual memory and DGC's masking read S_i from the Contribution
        c.values, c.indices = selection
        return result

    def simulate(cs: list[Contribution], call: CommCall) -> list[CollectiveResult]:
        outs = oktopk.sim_oktopk_faithful_allreduce([c.acc for c in cs], call.k, state=call.state,
                                                    allgather=call.algorithm or "plain")
        for c, (_result, selection) in zip(cs, outs):
            c.values, c.indices = selection
        return [result for result, _selection in outs]

    @F.checked
    def time_s(net: Any, numel: int, k: int, workers: int, *, algorithm: str | None = None,
               gamma_s_per_element: float = 0.0, host_cores: int | None = None, exact_k: bool = False) -> float:
        return F.oktopk_time_s(net, numel, k, workers, gamma_s_per_element, allgather=algorithm or "plain",
                               tau=tau, tau_r=tau_r)

    def bytes_per_rank(numel: int, k: int, workers: int, pair_bytes: int = 8, algorithm: str | None = None) -> float:
        return F.oktopk_bytes_per_rank(numel, k, workers, pair_bytes, algorithm, tau=tau)

    return Collective(name=name, run=run, simulate=simulate, time_s=time_s, bytes_per_rank=bytes_per_rank,
                      algorithms=oktopk.ALLGATHER_MODES, lossless=False, make_state=make_state, aliases=aliases,
                      description=description or f"Ok-Topk: thresholds re-evaluated every {tau} calls, regions "
                                                 f"every {tau_r}, {warmup} dense warm-up calls (O(k))")


#: Ok-Topk's dense warm-up under the ``paper`` preset, in iterations: the reference code's
#: 512 for VGG-16 on CIFAR-10 and 128 for the 2-layer LSTM on PTB. Language models
#: (``lstm``, ``gpt``, ``gpt_tiny``) take the LSTM's; every other model (VGG-16, ResNet-20 and
#: the MNIST-1D / digits classifiers) takes VGG-16's, the reference's only CNN.
OKTOPK_PAPER_WARMUP: dict[str, int] = {"lstm": 128, "gpt": 128, "gpt_tiny": 128}
OKTOPK_PAPER_WARMUP_DEFAULT = 512


def oktopk_preset_options(preset: str, model: str) -> dict[str, int]:
    """The collective options of Ok-Topk methods under ``preset`` for ``model``: under
    ``paper`` the reference's warm-up (:data:`OKTOPK_PAPER_WARMUP`), under others none."""
    if preset != "paper":
        return {}
    return {"warmup": OKTOPK_PAPER_WARMUP.get(model, OKTOPK_PAPER_WARMUP_DEFAULT)}


#: the selector of Ok-Topk methods (a placeholder: the collective selects)
OKTOPK_SELECTOR = _selected_by_collective
OKTOPK_SELECTOR.__name__ = "oktopk-threshold"  # what `gtopk-lab methods` shows

OKTOPK = register_collective(oktopk_collective(
    "oktopk", aliases=("oktopk_faithful",),
    description="Ok-Topk (reference): reused thresholds, quantile regions, sparse reduce-scatter + allgather (O(k))"))

#: Where the Ok-Topk methods depart from the reference code (docs/beyond_papers.md, 1a).
OKTOPK_DEPARTURES: tuple[str, ...] = (
    "selects |x| >= t on non-zero entries (the reference: > t)",
    "no dense warm-up outside preset='paper' (under it the reference's 512 calls, 128 for language models)",
    "the tau / tau_r schedule counts from the end of the warm-up",
)
register_method(Method(name="oktopk", selector=OKTOPK_SELECTOR, collective="oktopk", algorithm="plain",
                       preset_options=oktopk_preset_options,
                       description="Ok-Topk (Li & Hoefler, PPoPP'22) as its reference code: thresholds reused "
                                   "between re-evaluations, plain allgather",
                       departures=OKTOPK_DEPARTURES))
register_method(Method(name="oktopk-balanced", selector=OKTOPK_SELECTOR, collective="oktopk", algorithm="balanced",
                       preset_options=oktopk_preset_options,
                       description="Ok-Topk with the paper's balanced allgather", departures=OKTOPK_DEPARTURES))
register_method(Method(name="oktopk-exact", selector="topk", collective="oktopk-exact",
                       description="Ok-Topk-style, exact global top-k every call (the project's earlier oktopk)",
                       departures=("exact global top-k every call and histogram-balanced regions (the paper "
                                   "estimates thresholds and balances by selection quantiles)",)))
