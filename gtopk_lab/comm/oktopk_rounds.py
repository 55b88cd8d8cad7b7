"""The communication rounds both Ok-Topk variants are built from, on uint8 messages.

Every message is an 8-byte int64 header (payload length in bytes) followed, if non-empty,
by one uint8 payload: sparse pairs are n values then n indices (``m`` = 8 bytes per pair
below 2**31 elements), count vectors are int32/int64. ``bytes_sent`` counts both parts.

Rounds (each is a generator of ``(op, peer, payload)`` requests, the protocol of
:func:`gtopk_lab.comm.programs.drive` and :func:`gtopk_lab.comm.inprocess.run_programs`):

- :func:`allreduce_sum` — sum an integer vector of c bytes by recursive doubling (fold/unfold
  for any P): ``L`` rounds of ``alpha + (h + c) beta``, L = :func:`allreduce_rounds`;
- :func:`sendrecv` — one round: send to one rank, receive from another;
- :func:`bruck_allgather` — every rank gets every rank's block in ceil(log2 P) rounds; in
  round j rank r sends the blocks it holds (its own and the next 2^j - 1) to rank r - 2^j.
  Each rank receives every other block exactly once; the owner of a block sends it in
  every round, so an imbalanced block costs its owner ``ceil(log2 P) * n_max * m beta``.

:class:`ByteTransport` carries the requests over torch.distributed (gloo: CPU buffers; NCCL:
the tensor's GPU) with sends completed only at the end, so that no round can deadlock.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import torch
import torch.distributed as dist

from gtopk_lab.comm.schedules import butterfly_schedule
from gtopk_lab.comm.stats import HEADER_BYTES
from gtopk_lab.comm.torch_dist import global_rank
from gtopk_lab.network.pacing import active_pacer

__all__ = ["Request", "Block", "Recorder", "ByteTransport", "as_bytes", "pairs_from_bytes", "allreduce_sum",
           "sendrecv", "bruck_allgather", "allreduce_rounds", "bruck_rounds", "magnitude_keys"]

Request = tuple[str, int, "torch.Tensor | None"]
#: one sparse block (values, indices)
Block = tuple[torch.Tensor, torch.Tensor]


class Recorder:
    """Per-round byte counts of one rank (``CommStats.steps``) and per-phase totals.

    ``phase_bytes``: bytes sent per phase (header included). ``phases``: per phase
    ``{"sent", "recv", "sent_msgs", "recv_msgs", "rounds"}`` (bytes with headers; one header
    per non-empty-or-empty message), so that payload pairs = (bytes - 8 msgs) / m.
    """

    def __init__(self) -> None:
        self.steps: list[tuple[int, int]] = []
        self.messages = 0
        self.cpu_s = 0.0
        self.merged = 0
        self.phase_bytes: dict[str, int] = {}
        self.phases: dict[str, dict[str, int]] = {}

    def step(self, sent: torch.Tensor | None, recv: torch.Tensor | None, phase: str) -> None:
        s = HEADER_BYTES + sent.numel() if sent is not None else 0
        r = HEADER_BYTES + recv.numel() if recv is not None else 0
        if sent is not None:
            self.messages += 2 if sent.numel() > 0 else 1
        self.steps.append((s, r))
        self.phase_bytes[phase] = self.phase_bytes.get(phase, 0) + s
        p = self.phases.setdefault(phase, {"sent": 0, "recv": 0, "sent_msgs": 0, "recv_msgs": 0, "rounds": 0})
        p["sent"] += s
        p["recv"] += r
        p["sent_msgs"] += sent is not None
        p["recv_msgs"] += recv is not None
        p["rounds"] += 1
        pacer = active_pacer()
        if pacer is not None:  # real transport under a throttled clock: the round ends here
            pacer.end_round(s, r)


def as_bytes(*tensors: torch.Tensor) -> torch.Tensor:
    """The tensors' bytes, concatenated (a fresh buffer: the caller may reuse its tensors)."""
    parts = [t.contiguous().view(-1).view(torch.uint8) for t in tensors if t.numel() > 0]
    if not parts:
        return torch.empty(0, dtype=torch.uint8, device=tensors[0].device)
    return torch.cat(parts) if len(parts) > 1 else parts[0].clone()


def pairs_from_bytes(buf: torch.Tensor, vdt: torch.dtype, idt: torch.dtype) -> Block:
    """Inverse of ``as_bytes(values, indices)``."""
    vs = torch.empty(0, dtype=vdt).element_size()
    isz = torch.empty(0, dtype=idt).element_size()
    n = buf.numel() // (vs + isz)
    if n == 0:
        return (torch.empty(0, dtype=vdt, device=buf.device), torch.empty(0, dtype=idt, device=buf.device))
    # clone: a slice at an unaligned offset cannot be viewed as a wider dtype
    return buf[: n * vs].clone().view(vdt), buf[n * vs:].clone().view(idt)


def allreduce_sum(rec: Recorder, rank: int, world: int, vec: torch.Tensor, phase: str
                  ) -> Generator[Request, torch.Tensor | None, torch.Tensor]:
    """Sum an integer vector over ranks by recursive doubling (schedules.butterfly_schedule)."""
    for step in butterfly_schedule(rank, world):
        mine = as_bytes(vec)
        if step.op == "send":
            yield ("send", step.peer, mine)
            rec.step(mine, None, phase)
            continue
        theirs_b = yield (step.op, step.peer, mine if step.op == "exchange" else None)
        assert theirs_b is not None
        rec.step(mine if step.op == "exchange" else None, theirs_b, phase)
        theirs = theirs_b.clone().view(vec.dtype)
        vec = vec + theirs if step.merge else theirs
    return vec


def sendrecv(rec: Recorder, dst: int, src: int, payload: torch.Tensor, phase: str
             ) -> Generator[Request, torch.Tensor | None, torch.Tensor]:
    """One round: send ``payload`` to ``dst`` and receive from ``src`` (may be the same rank)."""
    if dst == src:
        theirs = yield ("exchange", dst, payload)
    else:
        yield ("send", dst, payload)
        theirs = yield ("recv", src, None)
    assert theirs is not None
    rec.step(payload, theirs, phase)
    return theirs


def bruck_allgather(rec: Recorder, rank: int, world: int, own: Block,
                    split: Callable[[Block, list[int]], list[Block]], phase: str
                    ) -> Generator[Request, torch.Tensor | None, list[Block]]:
    """Every rank's block on every rank, in rank order (Bruck, any P).

    ``split(incoming, owners)`` cuts the concatenation of the blocks of ranks ``owners`` (in
    that order) back into blocks: by index range or by known sizes (the caller knows which).
    """
    vdt, idt = own[0].dtype, own[1].dtype
    held: list[Block] = [own]  # blocks of ranks rank, rank+1, ... (mod P)
    d = 1
    while d < world:
        count = min(d, world - d)
        payload = as_bytes(torch.cat([b[0] for b in held[:count]]), torch.cat([b[1] for b in held[:count]]))
        theirs = yield from sendrecv(rec, (rank - d) % world, (rank + d) % world, payload, phase)
        held.extend(split(pairs_from_bytes(theirs, vdt, idt), [(rank + d + j) % world for j in range(count)]))
        d *= 2
    # held[j] is rank (rank + j) mod P's block: rotate to rank order
    return held[world - rank:] + held[:world - rank] if rank else held


def allreduce_rounds(world_size: int) -> int:
    """Rounds of one recursive-doubling allreduce on the busiest rank (fold/unfold for any P)."""
    if world_size <= 1:
        return 0
    m = 1 << (world_size.bit_length() - 1)
    return (m.bit_length() - 1) + (2 if m != world_size else 0)


def bruck_rounds(world_size: int) -> int:
    """ceil(log2 P): rounds of :func:`bruck_allgather`."""
    return (world_size - 1).bit_length()


def magnitude_keys(values: torch.Tensor) -> torch.Tensor:
    """int64 keys monotone in |v| (the IEEE bit pattern of |v| as a signed integer)."""
    int_dtype = {8: torch.int64, 4: torch.int32, 2: torch.int16}[values.element_size()]
    return values.abs().contiguous().view(int_dtype).to(torch.int64)


class ByteTransport:
    """torch.distributed transport for uint8 messages with deferred send completion.

    Sends are posted (header, then payload) and only waited for at :meth:`finish`, so a
    round that sends to one peer and receives from another cannot deadlock: every rank posts
    its send before it blocks on its receive.
    """

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device) -> None:
        self.group, self.device = group, device
        self.pending: list[tuple[Any, torch.Tensor]] = []

    def _send(self, peer: int, buf: torch.Tensor) -> None:
        dst = global_rank(self.group, peer)
        header = torch.tensor([buf.numel()], dtype=torch.int64, device=self.device)
        self.pending.append((dist.isend(header, dst=dst, group=self.group), header))
        if buf.numel() > 0:
            buf = buf.to(self.device).contiguous()
            self.pending.append((dist.isend(buf, dst=dst, group=self.group), buf))

    def _recv(self, peer: int) -> torch.Tensor:
        src = global_rank(self.group, peer)
        header = torch.empty(1, dtype=torch.int64, device=self.device)
        dist.irecv(header, src=src, group=self.group).wait()
        n = int(header.item())
        buf = torch.empty(n, dtype=torch.uint8, device=self.device)
        if n > 0:
            dist.irecv(buf, src=src, group=self.group).wait()
        return buf

    def run(self, op: str, peer: int, payload: torch.Tensor | None) -> torch.Tensor | None:
        pacer = active_pacer()
        if pacer is not None:
            pacer.begin_round()
        if op in ("send", "exchange"):
            assert payload is not None
            self._send(peer, payload)
        if op in ("recv", "exchange"):
            return self._recv(peer)
        return None

    def finish(self) -> None:
        for work, _buf in self.pending:
            work.wait()
        self.pending.clear()
