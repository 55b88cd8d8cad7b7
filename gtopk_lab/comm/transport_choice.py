"""Which transport a real rank's point-to-point call uses: shared memory on one host, else gloo/NCCL.

:func:`transport_for` is what every real-rank driver asks (gTop-k, Ok-Topk, tensor programs):

1. messages leave from the CPU (gloo, or a CPU tensor) and the group's handshake found all
   its ranks on this host (:func:`gtopk_lab.comm.shm_links.shm_links`, once per group;
   ``GTOPK_LAB_SHM=0`` turns it off): :class:`~gtopk_lab.comm.shm_transport.ShmTransport`;
2. otherwise :class:`~gtopk_lab.comm.dist_transport.DistTransport` (gloo between hosts,
   NCCL on GPUs).

Both send the same wire-format bytes, so results are the same bitwise either way.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gtopk_lab.comm.dist_transport import DistTransport
from gtopk_lab.comm.profiling import RoundProfile
from gtopk_lab.comm.shm_links import links_decided, shm_links
from gtopk_lab.comm.shm_transport import ShmTransport
from gtopk_lab.comm.transport import Transport
from gtopk_lab.comm.wire import WireFormat

__all__ = ["transport_for", "transport_kind", "transport_used"]


def transport_for(group: dist.ProcessGroup | None, device: torch.device, wire: WireFormat, *,
                  profile: RoundProfile | None = None) -> Transport:
    """This rank's transport for one call on ``group`` whose messages leave from ``device``."""
    if device.type == "cpu":
        links = shm_links(group)
        if links is not None:
            return ShmTransport(links, wire, profile=profile)
    return DistTransport(group, device, wire, profile=profile)


def transport_kind(group: dist.ProcessGroup | None = None, device: torch.device | None = None) -> str:
    """"shm" or the backend's name ("gloo", "nccl"): what :func:`transport_for` picks for
    ``group`` (a collective call: every rank of the group must ask together the first time)."""
    device = device or torch.device("cpu")
    if device.type == "cpu" and shm_links(group) is not None:
        return "shm"
    return str(dist.get_backend(group)).lower()


def transport_used(group: dist.ProcessGroup | None = None) -> str:
    """What carried ``group``'s point-to-point messages so far, asking nobody (any rank, any
    time): "shm" when its handshake chose shared memory, else the backend's name (also when
    no point-to-point call was made: the library collectives ran on the backend)."""
    return "shm" if links_decided(group) else str(dist.get_backend(group)).lower()
