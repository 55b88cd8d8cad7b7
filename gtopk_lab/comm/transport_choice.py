"""Which transport a real rank's point-to-point call uses: shared memory on one host, own TCP
links between hosts, else gloo/NCCL.

:func:`transport_for` is what every real-rank driver asks (gTop-k, Ok-Topk, tensor programs):

1. messages leave from the CPU (gloo, or a CPU tensor) and the group's handshake found all
   its ranks on this host (:func:`gtopk_lab.comm.shm_links.shm_links`, once per group;
   ``GTOPK_LAB_SHM=0`` turns it off): :class:`~gtopk_lab.comm.links_transport.LinksTransport`
   over shared-memory rings ("shm");
2. messages leave from the CPU of a gloo group across hosts (or with shared memory off): the
   same transport over a TCP socket per peer (:func:`gtopk_lab.comm.tcp_links.tcp_links`,
   once per group; ``GTOPK_LAB_TCP=0`` turns it off): "tcp", a tenth of gloo's per-message
   cost on the 2-core VM;
3. otherwise :class:`~gtopk_lab.comm.dist_transport.DistTransport` (gloo's point-to-point,
   NCCL on GPUs).

All send the same wire-format bytes, so results are the same bitwise whichever carries them.
Top-k's allgather takes the same links on a CPU rank (:func:`cpu_links`,
:mod:`gtopk_lab.comm.allgather_links`); the dense allreduce stays on the backend.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from gtopk_lab.comm.dist_transport import DistTransport, rank_world
from gtopk_lab.comm.links_transport import LinksTransport
from gtopk_lab.comm.profiling import RoundProfile
from gtopk_lab.comm.shm_links import ShmLinks, links_decided, shm_links
from gtopk_lab.comm.tcp_links import TcpLinks, tcp_decided, tcp_links
from gtopk_lab.comm.transport import Transport
from gtopk_lab.comm.wire import BYTES, WireFormat

__all__ = ["transport_for", "cpu_links", "transport_kind", "transport_used", "round_trip_over", "links_max_reduce"]


def transport_for(group: dist.ProcessGroup | None, device: torch.device, wire: WireFormat, *,
                  profile: RoundProfile | None = None) -> Transport:
    """This rank's transport for one call on ``group`` whose messages leave from ``device``."""
    if device.type == "cpu":
        links = cpu_links(group)
        if links is not None:
            return LinksTransport(links, wire, profile=profile)
    return DistTransport(group, device, wire, profile=profile)


def cpu_links(group: dist.ProcessGroup | None) -> ShmLinks | TcpLinks | None:
    """Steps 1-2: the group's shared-memory links, else its TCP links, else None (each
    handshake once per group, every rank asking together the first time)."""
    shm = shm_links(group)
    return shm if shm is not None else tcp_links(group)



def transport_kind(group: dist.ProcessGroup | None = None, device: torch.device | None = None) -> str:
    """"shm", "tcp" or the backend's name ("gloo", "nccl"): what :func:`transport_for` picks
    for ``group`` (a collective call: every rank of the group must ask together the first time)."""
    device = device or torch.device("cpu")
    if device.type == "cpu":
        links = cpu_links(group)
        if links is not None:
            return "shm" if isinstance(links, ShmLinks) else "tcp"
    return str(dist.get_backend(group)).lower()


def transport_used(group: dist.ProcessGroup | None = None) -> str:
    """What carried ``group``'s point-to-point messages so far, asking nobody (any rank, any
    time): "shm" or "tcp" when a handshake chose those links, else the backend's name (also
    when no point-to-point call was made: the library collectives ran on the backend)."""
    if links_decided(group):
        return "shm"
    return "tcp" if tcp_decided(group) else str(dist.get_backend(group)).lower()


def round_trip_over(group: dist.ProcessGroup | None = None) -> tuple[str, Callable[[torch.Tensor, int, bool], None]]:
    """(kind, ``round_trip(buf, peer, first)``): one round trip of the uint8 CPU tensor
    ``buf`` with ``peer`` over the transport :func:`transport_for` picks for ``group`` (a
    collective call the first time, as :func:`transport_kind`), in the byte wire format:
    what a link calibration times, so its alpha is that of the point-to-point collectives."""
    kind = transport_kind(group)
    cpu = torch.device("cpu")

    def round_trip(buf: torch.Tensor, peer: int, first: bool) -> None:
        transport = transport_for(group, cpu, BYTES)
        if first:
            transport.post(peer, buf)
            transport.receive(peer)
        else:
            transport.receive(peer)
            transport.post(peer, buf)
        transport.end_round()
        transport.finish()

    return kind, round_trip


def links_max_reduce(group: dist.ProcessGroup | None = None) -> Callable[[list[float]], list[float] | None]:
    """A max over the ranks of a few floats over ``group``'s own links (shared-memory rings
    or TCP sockets), for the virtual clock's bookkeeping after each collective: None (the
    caller then uses the backend's ``all_reduce``) until a handshake chose those links, which
    happens in the same collective call on every rank, so all ranks switch together.

    Each rank sends its values to every peer and takes every peer's, in rank order: one
    message each way per pair (40 bytes for the clock's five), against gloo's ring all_reduce
    of tiny messages (~1 ms on one host, 6-7 ms between 200 Mbit/s testbed hosts). Messages
    between two ranks stay in order, and every rank makes this call after the same
    collective, so it cannot take a collective's message."""
    def reduce_max(values: list[float]) -> list[float] | None:
        if not (links_decided(group) or tcp_decided(group)):
            return None
        links = cpu_links(group)  # cached: no communication
        if links is None:
            return None
        rank, world = rank_world(group)
        mine = np.asarray(values, dtype=np.float64)
        out = mine.copy()
        for peer in range(world):
            if peer != rank:
                links.send_arrays(peer, [mine.view(np.uint8)])
        for peer in range(world):
            if peer != rank:
                np.maximum(out, links.receive_array(peer).view(np.float64), out=out)
        links.flush()
        return out.tolist()

    return reduce_max
