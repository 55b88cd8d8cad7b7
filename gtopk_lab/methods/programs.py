"""Collectives written once as a per-rank program: :func:`program_collective`.

A user's collective is one generator per rank (the requests of
:mod:`gtopk_lab.comm.recorder`: ``send``, ``recv``, ``sendrecv``/``exchange``, payloads that
are tensors or tuples of tensors), and the platform gives it both drivers: real ranks over
torch.distributed and P virtual ranks in one process, recorded alike (one round per request,
:mod:`gtopk_lab.comm.tensor_programs`), so a simulated run is the real run, bitwise.

Example (a ring allgather of the selections, one ``sendrecv`` round per ring step, so
P - 1 rounds)::

    def ring(rank, world, contribution, call):
        mine = (contribution.values, contribution.indices)
        parts, travelling = {rank: mine}, mine
        for step in range(1, world):
            travelling = yield ("sendrecv", ((rank + 1) % world, (rank - 1) % world), travelling)
            parts[(rank - step) % world] = travelling
        ...
        return values, indices

    collective = program_collective("ring-gather", ring, time_s=..., bytes_per_rank=...)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gtopk_lab.comm.stats import CollectiveResult
from gtopk_lab.comm.tensor_programs import run_tensor_program, simulate_tensor_programs
from gtopk_lab.methods.base import Collective, CommCall, Contribution

__all__ = ["program_collective"]

Program = Callable[[int, int, Contribution, CommCall], Any]


def program_collective(name: str, program: Program, *, input: str = "sparse", **fields: Any) -> Collective:
    """A :class:`Collective` from one per-rank tensor program (both drivers for free).

    ``program(rank, world, contribution, call)`` is a generator of requests that returns the
    rank's aggregate: ``(values, indices)``, a dense tensor, or a ``CollectiveResult`` whose
    stats carry the entries it dropped and charges to this rank and its merge CPU time (see
    :mod:`gtopk_lab.comm.tensor_programs`). ``fields`` are the other :class:`Collective`
    fields (``time_s``, ``bytes_per_rank``, ``lossless``, ``needs_exact_k``, ...).
    """
    def run(contribution: Contribution, call: CommCall) -> CollectiveResult:
        return run_tensor_program(lambda r, w: program(r, w, contribution, call), name, call.group,
                                  like=contribution.acc)

    def simulate(contributions: list[Contribution], call: CommCall) -> list[CollectiveResult]:
        return simulate_tensor_programs(lambda r, w: program(r, w, contributions[r], call), name,
                                        len(contributions))

    return Collective(name=name, run=run, simulate=simulate, input=input, **fields)
