"""Ok-Topk (Li & Hoefler, PPoPP'22): its collectives and methods.

``oktopk`` is the reference code's algorithm (Shigangli/Ok-Topk, the VGG and LSTM
allreducers), per call on rank r of P (:mod:`gtopk_lab.comm.oktopk`):

1. local selection S_r: the entries of ``acc_r`` (gradient + residual) with ``|acc| >= t_r``;
   the local threshold t_r is the exact k-th largest |acc_r| every tau = 32 calls, else the
   previous one raised by 1.03 while too many entries pass it and moved by 1.012 when the
   selection leaves its band;
2. every tau_r = 64 calls the index space is repartitioned: region boundaries are the mean of
   the ranks' selection quantiles;
3. sparse reduce-scatter: rank q sums every rank's selection in region q;
4. every tau calls the global threshold is the exact k-th largest |v| of the gathered union,
   else rank q keeps its region's sums with ``|v| >= t_global`` (t_global moved by its
   factors when the kept count leaves its band), and the kept entries are allgathered:
   ``plain`` (the reference's Allgatherv; method ``oktopk``) or ``balanced`` (the paper's
   balanced allgather; method ``oktopk-balanced``);
5. error feedback, the reference's rule: rank r's residual is ``acc_r`` with the entries of
   S_r that are in the global result zeroed (``residual_rule="paper"``, the methods'
   default; ``residual_rule="mass"`` instead charges each region's owner the sums it did
   not keep, so ``sum_r residual_r + G == sum_r acc_r``).

Bands and factors: the VGG script's (local 2k/3 .. 5k/4, global ÷1.008 below 2k/3 and ×1.008
above 4k/3, raised while more than 4k/3 pass), and for language models (``lstm``, ``gpt``,
``gpt_tiny``) the LSTM script's (local 3k/4 .. 5k/4, global ÷1.01 below 3k/4 and ×1.008 above
5k/4, raised while more than 3k/2 pass). Dense warm-up: none by default; under the
``paper`` preset the reference's 512 calls (128 for language models).
Departures from the reference code are at edges it does not reach or crashes on
(:mod:`gtopk_lab.comm.oktopk.schedule`, docs/beyond_papers.md).

Also ``oktopk-exact``: the project's earlier Ok-Topk-style allreduce (exact global top-k
every call, histogram-balanced regions, mass rule). :func:`oktopk_collective` builds Ok-Topk
variants with another schedule.
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
           "OKTOPK_LANGUAGE_MODELS", "OKTOPK_DEPARTURES",
           "OKTOPK_EXACT", "OKTOPK"]


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

    Patterns: ``plain`` | ``balanced`` (the allgather). Its state takes ``bands`` ("vgg" |
    "lstm") and the schedule's fields as collective options. Use it with
    ``Method(name, collective=oktopk_collective(name, warmup=512), selector=OKTOPK_SELECTOR,
    algorithm="plain", config_defaults={"residual_rule": "paper"})``: Ok-Topk selects inside the collective, by its
    thresholds.
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
                      compresses=True,
                      description=description or f"Ok-Topk: thresholds re-evaluated every {tau} calls, regions "
                                                 f"every {tau_r}, {warmup} dense warm-up calls (O(k))")


#: Models whose Ok-Topk runs take the reference LSTM script's settings (bands, warm-up); every
#: other model (VGG-16, ResNet-20, the MNIST-1D / digits classifiers) takes VGG-16's, the
#: reference's only CNN.
OKTOPK_LANGUAGE_MODELS: tuple[str, ...] = ("lstm", "gpt", "gpt_tiny")
#: Ok-Topk's dense warm-up under the ``paper`` preset, in iterations: the reference code's
#: 512 for VGG-16 on CIFAR-10 and 128 for the 2-layer LSTM on PTB.
OKTOPK_PAPER_WARMUP: dict[str, int] = {"vgg": 512, "lstm": 128}


def oktopk_preset_options(preset: str | None, model: str) -> dict[str, Any]:
    """The collective options of Ok-Topk methods on ``model``: the LSTM script's bands for
    language models (:data:`OKTOPK_LANGUAGE_MODELS`, whatever the preset), and under the
    ``paper`` preset the reference's dense warm-up (:data:`OKTOPK_PAPER_WARMUP`)."""
    script = "lstm" if model in OKTOPK_LANGUAGE_MODELS else "vgg"
    options: dict[str, Any] = {"bands": script} if script != "vgg" else {}
    if preset == "paper":
        options["warmup"] = OKTOPK_PAPER_WARMUP[script]
    return options


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
register_method(Method(name="oktopk", selector=OKTOPK_SELECTOR, collective="oktopk", algorithm="plain", color="#FFA15A",
                       preset_options=oktopk_preset_options, config_defaults={"residual_rule": "paper"},
                       description="Ok-Topk (Li & Hoefler, PPoPP'22) as its reference code runs it: thresholds "
                                   "exact every 32 calls, reused between with the VGG script's factors (the LSTM "
                                   "script's for language models), index regions from selection quantiles every 64, "
                                   "plain Allgatherv, the reference's residual rule (residual_rule=mass: "
                                   "mass-conserving)",
                       departures=OKTOPK_DEPARTURES))
register_method(Method(name="oktopk-balanced", selector=OKTOPK_SELECTOR, collective="oktopk", algorithm="balanced",
                       family="oktopk",
                       preset_options=oktopk_preset_options, config_defaults={"residual_rule": "paper"},
                       description="Ok-Topk as oktopk (reference rule and factors), with the paper's balanced "
                                   "allgather", departures=OKTOPK_DEPARTURES))
register_method(Method(name="oktopk-exact", selector="topk", collective="oktopk-exact", family="oktopk",
                       description="Ok-Topk-style, exact global top-k every call (the project's earlier oktopk)",
                       departures=("exact global top-k every call and histogram-balanced regions (the paper "
                                   "estimates thresholds and balances by selection quantiles)",)))
