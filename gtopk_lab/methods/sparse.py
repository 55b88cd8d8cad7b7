"""Top-k S-SGD and gTop-k S-SGD: the sparse collectives that take each rank's selection, and
the methods built on them.

Collectives:

- ``allgather`` (aliases ``topk``, ``topk_allgather``, ``gaussiank``): every rank gathers
  every rank's (value, index) pairs and sums them, exact; O(kP) per rank;
- ``gtopk`` (alias ``gtopk_allreduce``): the global top-k of the sum, merged along a
  butterfly or a binomial tree (patterns ``butterfly`` | ``tree``); O(k log P).

Methods: ``topk`` (local top-k, allgather), ``gtopk`` (Shi et al., ICDCS'19: local top-k,
gTop-k merge), ``gaussiank`` (Gaussian threshold selection, allgather); all with error feedback.
"""

from __future__ import annotations

from typing import Any

from gtopk_lab.comm import inprocess, torch_dist
from gtopk_lab.methods import formulas as F
from gtopk_lab.methods.base import Collective, CommCall, Contribution, Method
from gtopk_lab.methods.registry import register_collective, register_method

__all__ = ["ALLGATHER", "GTOPK"]


@F.checked
def _allgather_time_s(net: Any, numel: int, k: int, workers: int, *, algorithm: str | None = None,
                      gamma_s_per_element: float = 0.0, host_cores: int | None = None,
                      exact_k: bool = False) -> float:
    return F.topk_allgather_time_s(net, numel, k, workers, gamma_s_per_element, host_cores=host_cores,
                                   counted=not exact_k)


@F.checked
def _gtopk_time_s(net: Any, numel: int, k: int, workers: int, *, algorithm: str | None = None,
                  gamma_s_per_element: float = 0.0, host_cores: int | None = None,
                  exact_k: bool = False) -> float:
    fn = F.gtopk_tree_time_s if algorithm == "tree" else F.gtopk_butterfly_time_s
    return fn(net, numel, k, workers, gamma_s_per_element, host_cores=host_cores, header=not exact_k)


def _pairs(contributions: list[Contribution]) -> tuple[list[Any], list[Any]]:
    return [c.values for c in contributions], [c.indices for c in contributions]


def _exact_count(call: CommCall) -> int | None:
    return call.k if call.exact_k else None


ALLGATHER = register_collective(Collective(
    name="allgather", aliases=("topk", "topk_allgather", "gaussiank"),
    run=lambda c, call: torch_dist.topk_allgather(c.values, c.indices, call.numel, group=call.group,
                                                  exact_count=_exact_count(call)),
    simulate=lambda cs, call: inprocess.sim_topk_allgather(*_pairs(cs), call.numel,
                                                           exact_count=_exact_count(call)),
    time_s=_allgather_time_s, bytes_per_rank=F.allgather_bytes_per_rank,
    description="allgather of every rank's pairs, summed (exact; O(kP) per rank)"))

GTOPK = register_collective(Collective(
    name="gtopk", aliases=("gtopk_allreduce",), algorithms=("butterfly", "tree"), lossless=False,
    run=lambda c, call: torch_dist.gtopk_allreduce(c.values, c.indices, call.numel, call.k, group=call.group,
                                                   algorithm=call.algorithm, exact_k=call.exact_k),
    simulate=lambda cs, call: inprocess.sim_gtopk_allreduce(*_pairs(cs), call.numel, call.k,
                                                            algorithm=call.algorithm, exact_k=call.exact_k),
    time_s=_gtopk_time_s, bytes_per_rank=F.gtopk_bytes_per_rank,
    description="global top-k of the sum, merged along a butterfly or binomial tree (O(k log P))"))

register_method(Method(name="topk", selector="topk", collective="allgather", color="#EF553B",
                       description="Top-k S-SGD: local top-k, allgather, error feedback"))
register_method(Method(name="gtopk", selector="topk", collective="gtopk", color="#00CC96",
                       description="gTop-k S-SGD (Shi et al., ICDCS'19): global top-k merge, error feedback",
                       departures=("the butterfly pattern by default (the paper's tree under preset='paper')",
                                   "the mass-conserving residual rule by default (the reference's under "
                                   "preset='paper')")))
register_method(Method(name="gaussiank", selector="gaussiank", collective="allgather", color="#AB63FA",
                       paper_selector="gaussiank-paper",
                       description="GaussianK-SGD: Gaussian threshold selection, allgather, error feedback",
                       departures=("the count-refitting selector by default (the reference's rule, "
                                   "gaussiank-paper, under preset='paper')",)))
