"""Test-only methods of every shape the registry must carry, registered as a plugin would be
(``GTOPK_LAB_METHODS=lab_test_methods``). None of them is a real method; each proves a hook:

- ``test-ring``: a user collective written once as a per-rank tensor program (a ring
  allgather of the selections, summed), run by both drivers;
- ``test-cltk``: a rotating leader (``call.iteration % P``) picks the top-k indices of its
  ``acc`` and every rank adds its values there (CLT-k-shaped: dense input, per-call state);
- ``test-layerwise``: per-layer top-k from ``call.layout`` (PowerSGD-shaped: needs the
  parameter layout, no selector, no residual memory);
- ``test-ef21``: a custom memory that compresses g - g_i and keeps the running mean through
  ``aggregate`` (EF21-shaped: ``memory`` is a factory, the collective must be lossless);
- ``test-diloco``: H = 2 local SGD steps, then an outer SGD step on the averaged
  pseudo-gradient (DiLoCo-shaped: ``sync_every`` and ``outer_optimizer``);
- ``test-diloco-h1``: H = 1 with the outer SGD of lr 1 (equals dense data-parallel SGD).
"""

from __future__ import annotations

import torch

from gtopk_lab.methods import Method, program_collective, register_method
from gtopk_lab.methods.registry import available_methods


def _ring_sum(rank, world, values, indices):
    """Pass every rank's pairs once around the ring; return the sparse sum (rank order)."""
    parts = {rank: (values, indices)}
    send_v, send_i = values, indices
    for step in range(1, world):
        src = (rank - step) % world
        yield ("send", (rank + 1) % world, send_v)
        yield ("send", (rank + 1) % world, send_i)
        got_v = yield ("recv", (rank - 1) % world, None)
        got_i = yield ("recv", (rank - 1) % world, None)
        parts[src] = (got_v, got_i)
        send_v, send_i = got_v, got_i
    v = torch.cat([parts[r][0] for r in range(world)])
    i = torch.cat([parts[r][1] for r in range(world)]).long()
    uniq, inverse = torch.unique(i, return_inverse=True)
    out = torch.zeros(uniq.numel(), dtype=v.dtype).index_add_(0, inverse, v)
    return out, uniq.to(torch.int32)


def ring_program(rank, world, contribution, call):
    return (yield from _ring_sum(rank, world, contribution.values.contiguous(),
                                 contribution.indices.to(torch.int32).contiguous()))


def cltk_program(rank, world, contribution, call):
    leader = call.iteration % world
    if rank == leader:
        idx = torch.topk(contribution.acc.abs(), call.k, sorted=False).indices.sort().values.to(torch.int32)
    else:
        idx = torch.empty(call.k, dtype=torch.int32)
    # the leader's indices travel around the ring, then the values are ring-summed
    for step in range(world - 1):
        holder = (leader + step) % world
        if rank == holder:
            yield ("send", (rank + 1) % world, idx)
        elif rank == (holder + 1) % world:
            idx = yield ("recv", holder, None)
    return (yield from _ring_sum(rank, world, contribution.acc[idx.long()].contiguous(), idx))


def layerwise_program(rank, world, contribution, call):
    picks, offset = [], 0
    for shape in call.layout:
        n = int(torch.Size(shape).numel())
        k_layer = max(1, call.k * n // call.numel)
        layer = contribution.acc[offset:offset + n]
        picks.append(torch.topk(layer.abs(), min(k_layer, n), sorted=False).indices + offset)
        offset += n
    idx = torch.cat(picks).sort().values.to(torch.int32)
    return (yield from _ring_sum(rank, world, contribution.acc[idx.long()].contiguous(), idx))


class EF21Memory:
    """g_i (this rank's estimate) and the running sum of all estimates; sends C(g - g_i)."""

    def __init__(self, numel, rule, device):
        self.estimate = torch.zeros(numel, device=device)
        self.total = torch.zeros(numel, device=device)

    def compensate(self, g):
        return g.reshape(-1) - self.estimate

    def update(self, acc, values, indices, result):
        self.estimate[indices.long()] += values

    def aggregate(self, dense):
        self.total += dense
        return self.total.clone()

    def state_dict(self):
        return {"estimate": self.estimate.clone(), "total": self.total.clone()}

    def load_state_dict(self, state):
        self.estimate, self.total = state["estimate"].clone(), state["total"].clone()


def _outer_sgd(params, config):
    return torch.optim.SGD(params, lr=1.0)


def register() -> None:
    if "test-ring" in available_methods():
        return
    ring = program_collective("test-ring-gather", ring_program, lossless=True,
                              bytes_per_rank=lambda n, k, p, m=8, a=None: float((p - 1) * k * m))
    register_method(Method(name="test-ring", selector="topk", collective=ring,
                           description="test: ring allgather written as one tensor program"))
    register_method(Method(name="test-cltk", selector=None, memory=None,
                           collective=program_collective("test-cltk", cltk_program, input="dense"),
                           description="test: rotating leader's indices, values summed"))
    register_method(Method(name="test-layerwise", selector=None, memory=None,
                           collective=program_collective("test-layerwise", layerwise_program, input="dense"),
                           description="test: per-layer top-k from the parameter layout"))
    register_method(Method(name="test-ef21", selector="topk", collective="allgather", memory=EF21Memory,
                           requires_lossless=True, description="test: EF21-shaped custom memory"))
    register_method(Method(name="test-diloco", selector=None, collective="allreduce", memory=None,
                           sync_every=2, outer_optimizer=_outer_sgd,
                           description="test: 2 local SGD steps, outer SGD on the mean pseudo-gradient"))
    register_method(Method(name="test-diloco-h1", selector=None, collective="allreduce", memory=None,
                           sync_every=1, outer_optimizer=_outer_sgd,
                           description="test: DiLoCo-shaped with H = 1"))


register()
