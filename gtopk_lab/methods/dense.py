"""S-SGD: the dense allreduce collective and the ``dense`` method, the baseline of every
scaling efficiency.

- collective ``allreduce`` (aliases ``dense``, ``dense_allreduce``): the backend's allreduce
  of the whole buffer on real ranks (gloo's ring for large tensors), the sum in rank order
  between virtual ranks; bytes and time are the ring's, ``2 (P-1) (alpha + beta 4d/P)``;
- method ``dense``: no selection, no memory.
"""

from __future__ import annotations

from typing import Any

from gtopk_lab.comm import inprocess, torch_dist
from gtopk_lab.methods import formulas as F
from gtopk_lab.methods.base import Collective, Method
from gtopk_lab.methods.registry import register_collective, register_method
from gtopk_lab.network.formulas import dense_ring_allreduce_time_s

__all__ = ["BASELINE_METHOD", "ALLREDUCE"]

#: The method every scaling efficiency is measured against (at P = 1, on the same network).
BASELINE_METHOD = "dense"


@F.checked
def _dense_time_s(net: Any, numel: int, k: int, workers: int, *, algorithm: str | None = None,
                  gamma_s_per_element: float = 0.0, host_cores: int | None = None,
                  exact_k: bool = False) -> float:
    return dense_ring_allreduce_time_s(net, numel, k, workers)


ALLREDUCE = register_collective(Collective(
    name="allreduce", input="dense", aliases=("dense", "dense_allreduce"),
    run=lambda c, call: torch_dist.dense_allreduce(c.acc, group=call.group),
    simulate=lambda cs, call: inprocess.sim_dense_allreduce([c.acc for c in cs]),
    time_s=_dense_time_s, bytes_per_rank=F.dense_bytes_per_rank,
    description="dense ring allreduce of the whole buffer (library call)"))

register_method(Method(name=BASELINE_METHOD, selector=None, collective="allreduce", memory=None, color="#636EFA",
                       description="S-SGD: dense allreduce of the gradient"))
