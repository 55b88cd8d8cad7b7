"""Top-k's allgather over this project's links (shared memory on one host, TCP between hosts).

:func:`~gtopk_lab.comm.torch_dist.topk_allgather` gathers every rank's (value, index) pairs.
On a CPU rank whose group has links (:func:`~gtopk_lab.comm.transport_choice.cpu_links`), it
gathers them here instead of with gloo's ``all_gather``, so that Top-k and gTop-k run on the
same transport: on the 200 Mbit/s testbed gloo's allgather took 1.3-1.7x the calibrated time
of its bytes (its three frames and thread hand-offs per message, issue 28), a gap no term of
the network model explained, while the links' rounds are the ones the link was calibrated on.

:func:`ring_allgather`, for rank r of P with blocks of b bytes (every rank's the same size):

1. right = r + 1, left = r - 1 (mod P); rank r holds block r;
2. for s = 0 .. P - 2: send block (r - s) mod P to the right (``links.send_arrays``: it
   returns at once, queued bytes move while this rank waits, so the ring cannot deadlock),
   then receive block (r - s - 1) mod P from the left and check its size;
3. ``links.flush()``.

Cost: P - 1 rounds of b bytes each way, (P - 1) alpha + (P - 1) b beta: the ring allgather
:func:`~gtopk_lab.comm.schedules.ring_allgather_steps` prices, with each round's peers known
(``CommStats.peers``: (right, left)). The bytes are those gloo's allgather moves, so the
gathered blocks and the sum built from them are the same bitwise.
"""

from __future__ import annotations

import numpy as np

from gtopk_lab.comm.group_links import Links
from gtopk_lab.comm.schedules import ring_peers

__all__ = ["ring_allgather"]


def ring_allgather(links: Links, rank: int, world: int, block: np.ndarray) -> list[np.ndarray]:
    """Steps 1-3 of the module docstring: every rank's uint8 ``block`` (all the same size), in
    rank order (this rank's own is ``block`` itself). ``RuntimeError`` if a peer's block has
    another size (ranks that disagree on it would otherwise misread later messages)."""
    right, left = ring_peers(rank, world)
    blocks: list[np.ndarray | None] = [None] * world
    blocks[rank] = block
    for s in range(world - 1):
        links.send_arrays(right, [blocks[(rank - s) % world]])  # type: ignore[list-item]
        got = links.receive_array(left)
        if got.size != block.size:
            raise RuntimeError(f"topk_allgather: rank {left}'s message has {got.size} bytes, expected "
                               f"{block.size} (every rank must pass the same exact_count)")
        blocks[(rank - s - 1) % world] = got
    links.flush()
    return blocks  # type: ignore[return-value]
