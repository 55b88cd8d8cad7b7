"""Drivers for user-written collective programs whose messages are tensors.

A tensor program is one rank's algorithm as a generator of the requests of
:mod:`gtopk_lab.comm.recorder` (``send``, ``recv``, ``sendrecv``/``exchange``) whose payloads
are tensors or tuples of tensors, and it returns its result: a ``(values, indices)`` pair
(sparse sum), a dense tensor, or a :class:`~gtopk_lab.comm.stats.CollectiveResult` whose
stats carry what the recorder cannot see (entries the program dropped and charged to this
rank, merge CPU time). The recorder fills in bytes, messages and rounds: one round per
request, each message ``16 + tensor bytes`` per tensor (:class:`gtopk_lab.comm.wire.TensorWire`).
Two drivers run it:

1. :func:`run_tensor_program` on a real rank, over a
   :class:`~gtopk_lab.comm.dist_transport.DistTransport` (one buffer per message);
2. :func:`simulate_tensor_programs` for P virtual ranks in one process
   (:func:`gtopk_lab.comm.transport.run_programs`).

Both run the program under the same recorder, so ``CommStats`` and results agree by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import torch

from gtopk_lab.comm.dist_transport import comm_device, rank_world
from gtopk_lab.comm.recorder import Recorder
from gtopk_lab.comm.stats import CollectiveResult
from gtopk_lab.comm.transport import drive, run_programs
from gtopk_lab.comm.transport_choice import transport_for
from gtopk_lab.comm.wire import TENSOR_HEADER_BYTES, TENSORS

__all__ = ["TENSOR_HEADER_BYTES", "TensorProgram", "run_tensor_program", "simulate_tensor_programs"]

TensorProgram = Generator[tuple[Any, ...], Any, Any]


def run_tensor_program(make_program: Callable[[int, int], TensorProgram], name: str,
                       group: Any = None, like: torch.Tensor | None = None) -> CollectiveResult:
    """Run ``make_program(rank, world)`` on this real rank (see the module docstring);
    messages go from ``like``'s device where the backend allows it (NCCL), else the CPU."""
    rank, world = rank_world(group)
    device = comm_device(like, group) if like is not None else torch.device("cpu")
    rec = Recorder(TENSORS, rank, world)
    out = drive(rec.wrap(make_program(rank, world)), transport_for(group, device, TENSORS))
    return rec.result(out, name)


def simulate_tensor_programs(make_program: Callable[[int, int], TensorProgram], name: str,
                             world: int) -> list[CollectiveResult]:
    """Run ``make_program(r, world)`` for every virtual rank r in this process."""
    recs = [Recorder(TENSORS, r, world) for r in range(world)]
    outs = run_programs([rec.wrap(make_program(r, world)) for r, rec in enumerate(recs)])
    return [rec.result(out, name) for rec, out in zip(recs, outs)]
