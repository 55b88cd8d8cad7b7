"""The communication rounds both Ok-Topk variants are built from, on uint8 messages.

Every message is one buffer (:data:`gtopk_lab.comm.wire.BYTES`): an 8-byte int64 length,
then the payload bytes; sparse pairs are n values then n indices (``m`` = 8 bytes per pair
below 2**31 elements), count vectors are int32/int64. ``bytes_sent`` counts both parts.

Rounds (each a generator of the requests of :mod:`gtopk_lab.comm.recorder`, every request
named by its phase so the recorder keeps bytes per phase):

- :func:`allreduce_sum` — sum an integer vector of c bytes by recursive doubling (fold/unfold
  for any P): ``L`` rounds of ``alpha + (h + c) beta``, L = :func:`allreduce_rounds`;
- :func:`bruck_allgather` — every rank gets every rank's block in ceil(log2 P) rounds; in
  round j rank r sends the blocks it holds (its own and the next 2^j - 1) to rank r - 2^j
  and receives from r + 2^j (one ``sendrecv``). Each rank receives every other block
  exactly once; the owner of a block sends it in every round, so an imbalanced block costs
  its owner ``ceil(log2 P) * n_max * m beta``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import torch

from gtopk_lab.comm.schedules import butterfly_schedule

__all__ = ["Request", "Block", "as_bytes", "pairs_from_bytes", "allreduce_sum", "bruck_allgather",
           "allreduce_rounds", "bruck_rounds", "magnitude_keys"]

Request = tuple
#: one sparse block (values, indices)
Block = tuple[torch.Tensor, torch.Tensor]


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


def allreduce_sum(rank: int, world: int, vec: torch.Tensor, phase: str
                  ) -> Generator[Request, torch.Tensor | None, torch.Tensor]:
    """Sum an integer vector over ranks by recursive doubling (schedules.butterfly_schedule)."""
    for step in butterfly_schedule(rank, world):
        mine = as_bytes(vec)
        if step.op == "send":
            yield ("send", step.peer, mine, phase)
            continue
        theirs_b = yield (step.op, step.peer, mine if step.op == "exchange" else None, phase)
        assert theirs_b is not None
        theirs = theirs_b.clone().view(vec.dtype)
        vec = vec + theirs if step.merge else theirs
    return vec


def bruck_allgather(rank: int, world: int, own: Block,
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
        theirs = yield ("sendrecv", ((rank - d) % world, (rank + d) % world), payload, phase)
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
