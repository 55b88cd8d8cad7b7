"""CLT-k: ScaleCom's cyclic local top-k with low-pass filtered error feedback.

Source: Chen, Ni, Lu, Cui, Chen, Sun, Wang, Zhang, Gopalakrishnan, Agrawal et al.,
"ScaleCom: Scalable Sparsified Gradient Compression for Communication-Efficient Distributed
Training", NeurIPS 2020 (arXiv:2104.11125).

One iteration t on rank i of P (d parameters, k = density * d):

1. ``u_i = g_i + m_i``: the error-compensated gradient (``m_i`` the rank's memory);
2. the leader ``j = t mod P`` (rotating, so every rank's gradient leads in turn) picks the
   index set ``I = top-k(|u_j|)``, sorted ascending;
3. ``I`` goes from the leader to every rank along a binomial tree (ceil(log2 P) rounds of
   k indices);
4. every rank takes its own values ``u_i[I]`` and the ranks sum them with a ring allreduce
   of k floats (:func:`gtopk_lab.comm.dense.allreduce_program`, reduce-scatter + allgather,
   2(P-1) rounds of k/P floats): since every rank contributes at the *same* indices, the
   sparse sum is a plain dense allreduce of length k -- the commutativity that lets
   ScaleCom use a library allreduce;
5. the update applies ``G / P`` with ``G = sum_i u_i`` restricted to ``I``;
6. low-pass filtered error feedback: with the usual residual ``r_i = u_i - u_i|_I`` (u_i with
   the entries of I zeroed), ``m_i <- (1 - beta) m_i + beta r_i``.

   beta = 1 is classical error feedback (m_i = r_i). ScaleCom's filter smooths the memory
   over iterations so that the leader's indices stay representative of every rank's
   gradient. Default ``beta = 0.1`` (option ``lowpass_beta``): the paper uses a small filter
   coefficient in its experiments, but its exact value could not be checked offline when this
   was written, so 0.1 is this project's choice; set ``method_options={"lowpass_beta": 1.0}`` for
   plain EF.

Step 2's selection is the leader's step (the collective's ``input="leader"``,
:func:`cyclic_leader`): the run's selector (exact ``topk`` by default) on the leader only, timed
and charged on the virtual clock as every selecting method's selection is (measured, or the
calibrated ``selection_time_s`` on the leader; the other ranks wait for it at the collective).
Steps 3-4 are one per-rank tensor program (:func:`cltk_program`), run by both drivers of
:func:`~gtopk_lab.methods.programs.program_collective`, so real gloo ranks and the simulator
agree bitwise (the ring's summation order is fixed by the program, not by a library).

Cost per rank: O(d) for compensation and memory, the leader's O(d log k) top-k; bytes sent
``(P-1)/P * 4k`` (broadcast, mean over ranks) ``+ 2 (P-1)/P * 4k`` (ring allreduce), each
message behind a 16-byte tensor header; time
``ceil(log2 P) (a + 4k b) + 2 (P-1) (a + ceil(4k/P) b)`` (:func:`cltk_time_s`).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

import torch

from gtopk_lab.comm.dense import allreduce_program
from gtopk_lab.compression.merge import index_dtype
from gtopk_lab.methods.base import CommCall, Contribution, Method
from gtopk_lab.methods.programs import program_collective
from gtopk_lab.methods.registry import register_collective, register_method
from gtopk_lab.network.formulas import (
    DENSE_ELEMENT_BYTES, check_sizes, dense_ring_allreduce_time_s, log2_ceil, pair_bytes,
)

__all__ = ["cltk_program", "cyclic_leader", "tree_broadcast_program", "LowPassMemory",
           "cltk_time_s", "cltk_bytes_per_rank", "CLTK", "DEFAULT_LOWPASS_BETA"]

#: ScaleCom's low-pass filter coefficient beta (this project's default; see the module docstring).
DEFAULT_LOWPASS_BETA = 0.1

TensorRequests = Generator[tuple[str, int, "torch.Tensor | None"], "torch.Tensor | None", Any]


def tree_broadcast_program(rank: int, world: int, root: int, tensor: torch.Tensor | None) -> TensorRequests:
    """Binomial-tree broadcast of ``tensor`` from ``root``: ceil(log2 P) rounds; in round j the
    ranks at relative position < 2^j send to the one 2^j further. Returns the tensor."""
    rel = (rank - root) % world
    for j in range(log2_ceil(world)):
        bit = 1 << j
        if rel < bit and rel + bit < world:
            yield ("send", (rank + bit) % world, tensor)
        elif bit <= rel < 2 * bit:
            tensor = yield ("recv", (rank - bit) % world, None)
    assert tensor is not None
    return tensor


def cyclic_leader(iteration: int, world: int) -> int:
    """ScaleCom's leader of ``iteration``: ``iteration mod P`` (every rank leads in turn)."""
    return iteration % world


def cltk_program(rank: int, world: int, contribution: Contribution, call: CommCall) -> TensorRequests:
    """Steps 3-4 of the module docstring on one rank, from the leader's selection (step 2,
    ``contribution.indices`` on the leader); returns ``(sum over ranks of u_i[I], I)``."""
    acc = contribution.acc.reshape(-1)
    leader = cyclic_leader(call.iteration, world)
    idx: torch.Tensor | None = None
    if rank == leader:
        if contribution.indices is None:
            raise ValueError(f"contribution.indices=None is invalid on CLT-k's leader (rank {rank} at iteration "
                             f"{call.iteration}): expected the leader's selection (RankStep.prepare makes it)")
        idx = contribution.indices.sort().values.to(index_dtype(call.numel))
    idx = yield from tree_broadcast_program(rank, world, leader, idx)
    values = yield from allreduce_program(rank, world, acc[idx.long()].contiguous(), "ring")
    return values, idx


class LowPassMemory:
    """ScaleCom's memory m_i: ``compensate(g) = g + m``; ``update`` sets
    ``m <- (1 - beta) m + beta (u - u|_I)`` with I the leader's (applied) index set."""

    def __init__(self, numel: int, rule: str, device: torch.device | str | None,
                 options: Mapping[str, Any] | None = None) -> None:
        beta = float((options or {}).get("lowpass_beta", DEFAULT_LOWPASS_BETA))
        if not 0.0 < beta <= 1.0:
            raise ValueError(f"method_options lowpass_beta={beta!r} is invalid: expected a number in (0, 1]")
        self.beta = beta
        self.memory = torch.zeros(numel, device=device)

    def compensate(self, g: torch.Tensor) -> torch.Tensor:
        return g.reshape(-1) + self.memory

    def update(self, acc: torch.Tensor, values: Any, indices: Any, result: Any) -> None:
        residual = acc.reshape(-1).clone()
        residual[result.indices.long()] = 0.0
        self.memory = self.memory.mul_(1.0 - self.beta).add_(residual, alpha=self.beta)

    def state_dict(self) -> dict[str, Any]:
        return {"memory": self.memory.detach().cpu().clone(), "beta": self.beta}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.memory = state["memory"].to(self.memory.device).clone()


def _index_bytes(numel: int) -> int:
    return pair_bytes(numel) - DENSE_ELEMENT_BYTES


def cltk_time_s(net: Any, numel: int, k: int, workers: int, *, algorithm: str | None = None,
                gamma_s_per_element: float = 0.0, host_cores: int | None = None,
                exact_k: bool = False) -> float:
    """``ceil(log2 P) (a + c k b) + 2 (P-1) (a + ceil(4k/P) b)``: the binomial broadcast of k
    indices (c = 4 bytes each, 8 at d >= 2**31) on the critical path, then the ring
    allreduce of k fp32 values. Tensor headers (16 bytes) are left out; the leader's top-k is
    its step's selection, charged beside the collective as every method's selection is."""
    check_sizes(numel, k, workers)
    if workers == 1:
        return 0.0
    broadcast = log2_ceil(workers) * (net.latency_s + _index_bytes(numel) * k * net.beta_s_per_byte)
    return broadcast + dense_ring_allreduce_time_s(net, k, k, workers)


def cltk_bytes_per_rank(numel: int, k: int, workers: int, pair_bytes: int = 8,
                        algorithm: str | None = None) -> float:
    """Mean over ranks: ``(P-1)/P * c k`` (broadcast: P-1 messages of k indices) plus
    ``2 (P-1)/P * 4 k`` (ring allreduce of k floats); ``c = pair_bytes - 4``."""
    p = workers
    if p == 1:
        return 0.0
    return (p - 1) / p * (pair_bytes - DENSE_ELEMENT_BYTES) * k + 2.0 * (p - 1) / p * DENSE_ELEMENT_BYTES * k


CLTK = register_method(Method(
    name="clt-k", selector="topk", memory=LowPassMemory, options={"lowpass_beta": DEFAULT_LOWPASS_BETA},
    color="#19D3F3",
    collective=register_collective(program_collective(
        "cltk", cltk_program, input="leader", leader=cyclic_leader, lossless=True, time_s=cltk_time_s,
        bytes_per_rank=cltk_bytes_per_rank,
        description="CLT-k: the leader's top-k indices broadcast, then a k-long ring allreduce")),
    description="ScaleCom (Chen et al., NeurIPS'20): cyclic local top-k, low-pass filtered EF",
    departures=(f"low-pass beta = {DEFAULT_LOWPASS_BETA} is this project's choice",)))
