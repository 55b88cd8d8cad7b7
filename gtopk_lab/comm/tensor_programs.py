"""Drivers for user-written collective programs whose messages are plain tensors.

A tensor program is one rank's algorithm as a generator that yields
``("send", peer, tensor)`` (resumed with None), ``("recv", peer, None)`` or
``("exchange", peer, tensor)`` (both resumed with the peer's tensor) and returns its
result: a ``(values, indices)`` pair (sparse sum), a dense tensor, or a
:class:`~gtopk_lab.comm.stats.CollectiveResult` whose stats carry what the recorder cannot
see (entries the program dropped and charged to this rank, merge CPU time); the recorder
fills in bytes, messages and rounds. Two drivers run it:

1. :func:`run_tensor_program` on a real rank: each message is a 16-byte header (element
   count, dtype code) then the tensor's bytes, over torch.distributed isend/irecv;
2. :func:`simulate_tensor_programs` for P virtual ranks in one process
   (:func:`gtopk_lab.comm.inprocess.run_programs`).

Both wrap the program in the same recorder, so ``CommStats`` (one step per request,
``bytes = 16 + tensor bytes`` each way) and results agree by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import torch
import torch.distributed as dist

from gtopk_lab.comm.inprocess import run_programs
from gtopk_lab.comm.programs import drive
from gtopk_lab.comm.stats import CollectiveResult, CommStats
from gtopk_lab.comm.torch_dist import comm_device, global_rank, rank_world

__all__ = ["TENSOR_HEADER_BYTES", "run_tensor_program", "simulate_tensor_programs"]

#: Bytes of the (count, dtype) header before every tensor message.
TENSOR_HEADER_BYTES = 16
_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                    torch.int32, torch.int64, torch.uint8, torch.int8, torch.bool)

TensorProgram = Generator[tuple[str, int, "torch.Tensor | None"], "torch.Tensor | None", Any]


def _nbytes(t: torch.Tensor) -> int:
    return TENSOR_HEADER_BYTES + t.numel() * t.element_size()


def _recorded(program: TensorProgram, name: str) -> Generator[Any, Any, CollectiveResult]:
    """Run ``program``, recording one (sent, received) step per request; wrap its result."""
    steps: list[tuple[int, int]] = []
    messages = 0
    try:
        request = next(program)
        while True:
            op, peer, payload = request
            if op not in ("send", "recv", "exchange"):
                raise ValueError(f"request op={op!r} is invalid: expected send, recv or exchange")
            if op != "recv" and not isinstance(payload, torch.Tensor):
                raise TypeError(f"a {op} request carries {type(payload).__name__}: expected a torch.Tensor")
            reply = yield (op, peer, payload)
            sent = _nbytes(payload) if payload is not None and op != "recv" else 0
            recv = _nbytes(reply) if reply is not None else 0
            steps.append((sent, recv))
            messages += op != "recv"
            request = program.send(reply)
    except StopIteration as stop:
        out = stop.value
    stats = CommStats(collective=name, algorithm="program", bytes_sent=sum(s for s, _ in steps),
                      bytes_recv=sum(r for _, r in steps), messages=messages, rounds=len(steps),
                      steps=steps, dropped_values=None, dropped_indices=None)
    if isinstance(out, CollectiveResult):  # a lossy program reports its drops (mass rule)
        own = out.stats
        stats.dropped_values, stats.dropped_indices = own.dropped_values, own.dropped_indices
        stats.merge_cpu_s, stats.merged_elements = own.merge_cpu_s, own.merged_elements
        return CollectiveResult(out.values, out.indices, stats)
    if isinstance(out, torch.Tensor):
        return CollectiveResult(out, None, stats)
    values, indices = out
    return CollectiveResult(values, indices, stats)


class _TensorTransport:
    """Header (count, dtype code) then payload per message; sends complete at :meth:`finish`."""

    def __init__(self, group: Any, device: torch.device) -> None:
        self.group, self.device = group, device
        self.pending: list[tuple[Any, torch.Tensor]] = []

    def _send(self, peer: int, t: torch.Tensor) -> None:
        dst = global_rank(self.group, peer)
        t = t.detach().to(self.device).contiguous().reshape(-1)
        header = torch.tensor([t.numel(), _DTYPES.index(t.dtype)], dtype=torch.int64, device=self.device)
        self.pending.append((dist.isend(header, dst=dst, group=self.group), header))
        if t.numel():
            self.pending.append((dist.isend(t, dst=dst, group=self.group), t))

    def _recv(self, peer: int) -> torch.Tensor:
        src = global_rank(self.group, peer)
        header = torch.empty(2, dtype=torch.int64, device=self.device)
        dist.irecv(header, src=src, group=self.group).wait()
        n, code = (int(x) for x in header.tolist())
        buf = torch.empty(n, dtype=_DTYPES[code], device=self.device)
        if n:
            dist.irecv(buf, src=src, group=self.group).wait()
        return buf

    def run(self, op: str, peer: int, payload: torch.Tensor | None) -> torch.Tensor | None:
        if op in ("send", "exchange"):
            self._send(peer, payload)  # type: ignore[arg-type]
        return self._recv(peer) if op in ("recv", "exchange") else None

    def finish(self) -> None:
        for work, _buf in self.pending:
            work.wait()
        self.pending.clear()


def run_tensor_program(make_program: Callable[[int, int], TensorProgram], name: str,
                       group: Any = None, like: torch.Tensor | None = None) -> CollectiveResult:
    """Run ``make_program(rank, world)`` on this real rank (see the module docstring)."""
    rank, world = rank_world(group)
    device = comm_device(like, group) if like is not None else torch.device("cpu")
    transport = _TensorTransport(group, device)
    gen = _recorded(make_program(rank, world), name)
    try:
        return drive(gen, transport.run)
    finally:
        transport.finish()


def simulate_tensor_programs(make_program: Callable[[int, int], TensorProgram], name: str,
                             world: int) -> list[CollectiveResult]:
    """Run ``make_program(r, world)`` for every virtual rank r in this process."""
    return run_programs([_recorded(make_program(r, world), name) for r in range(world)])
