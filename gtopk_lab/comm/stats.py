"""The per-call statistics shared by every collective, and the argument checks.

``CommStats`` records what one rank sent and received in one call (its rounds counted by
:class:`gtopk_lab.comm.recorder.Recorder` in the wire format of :mod:`gtopk_lab.comm.wire`,
or from a library collective's ring formula); the network model turns its ``steps`` into
time. Nothing here talks to a process group, so the in-process drivers share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from gtopk_lab.comm.schedules import SPARSE_ALGORITHMS
from gtopk_lab.comm.wire import HEADER_BYTES, sparse_message_bytes
from gtopk_lab.compression.merge import coalesce_sparse, index_dtype, merge_cpu_clock

__all__ = ["CommStats", "CollectiveResult", "HEADER_BYTES", "Payload", "Request", "sparse_message_bytes",
           "check_exact_k", "check_k", "check_numel", "check_algorithm", "wire", "merge_cpu_clock"]

Payload = tuple[torch.Tensor, torch.Tensor]
Request = tuple[str, int, "Payload | None"]


@dataclass
class CommStats:
    """What one rank sent and received in one collective call (see docs/architecture.md)."""

    collective: str
    algorithm: str
    bytes_sent: int = 0
    bytes_recv: int = 0
    messages: int = 0
    rounds: int = 0
    #: per round on this rank: (bytes_sent, bytes_recv), in order
    steps: list[tuple[int, int]] = field(default_factory=list)
    #: per round on this rank: (rank sent to, rank received from), None for a direction it did
    #: not use; empty when the rounds are a library call's (peers unknown). A model of links
    #: that differ (a straggler's) prices each round by its endpoints
    peers: list[tuple[int | None, int | None]] = field(default_factory=list)
    #: CPU seconds this rank spent merging inside the collective
    merge_cpu_s: float = 0.0
    #: CPU seconds the collective spent compressing this rank's own input, the part of the
    #: step's selection a collective makes itself because it needs the collective's state
    #: (Ok-Topk's threshold selection, PowerSGD's projections); not in ``merge_cpu_s``. The
    #: virtual clock charges it as the step's selection is charged (``VirtualClock``)
    compress_cpu_s: float = 0.0
    #: input entries of those merges (both operands; the gathered P*k of an allgather):
    #: ``merge_cpu_s / merged_elements`` is gamma as the collective itself ran it
    merged_elements: int = 0
    #: entries dropped by merges and charged to THIS rank (mass-conserving rule), canonical;
    #: None for exact collectives, empty tensors on gTop-k ranks that own no drops
    dropped_values: torch.Tensor | None = None
    dropped_indices: torch.Tensor | None = None
    #: True when the bytes come from the ring formula of a library collective
    library_estimate: bool = False
    #: drops of several merges charged to this rank, each canonical, not yet summed: the
    #: first read of ``dropped_values`` or ``dropped_indices`` coalesces them (so the
    #: collective does not pay for bookkeeping only the "mass" residual rule reads)
    dropped_parts: list[tuple[torch.Tensor, torch.Tensor]] | None = field(default=None, repr=False,
                                                                         compare=False)

    def _coalesce_drop_parts(self) -> None:
        parts = self.__dict__.get("dropped_parts")
        if parts:
            self.__dict__["dropped_parts"] = None
            v, i = coalesce_sparse(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
            self.__dict__["_dropped_values"], self.__dict__["_dropped_indices"] = v, i

    def drop_pieces(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The drops charged to this rank as (values, indices) pieces, pending parts unsummed: for
        a consumer that adds them into a dense vector anyway (``index_add_`` sums repeated
        indices), which then skips the sort and sum of coalescing. Empty without drops."""
        parts = self.__dict__.get("dropped_parts")
        if parts:
            return list(parts)
        v, i = self.__dict__.get("_dropped_values"), self.__dict__.get("_dropped_indices")
        return [(v, i)] if v is not None and i is not None and i.numel() > 0 else []

    def drops_to(self, device: torch.device) -> None:
        """Move the drops (pending parts or coalesced tensors) to ``device`` without summing."""
        parts = self.__dict__.get("dropped_parts")
        if parts:
            if any(v.device != device or i.device != device for v, i in parts):
                self.dropped_parts = [(v.to(device), i.to(device)) for v, i in parts]
            return
        v, i = self.__dict__.get("_dropped_values"), self.__dict__.get("_dropped_indices")
        # a no-op .to() still costs a dispatch each, on every call
        if v is not None and i is not None and (v.device != device or i.device != device):
            self.dropped_values, self.dropped_indices = v.to(device), i.to(device)


def _lazy_drop_field(name: str) -> property:
    key = "_" + name

    def get(self: CommStats) -> torch.Tensor | None:
        self._coalesce_drop_parts()
        return self.__dict__.get(key)

    def put(self: CommStats, value: torch.Tensor | None) -> None:
        self.__dict__[key] = value

    return property(get, put, doc=f"{name}: the drops charged to this rank (pending parts summed on read)")


# installed after @dataclass so that the generated __init__/repr/eq go through them
CommStats.dropped_values = _lazy_drop_field("dropped_values")  # type: ignore[assignment]
CommStats.dropped_indices = _lazy_drop_field("dropped_indices")  # type: ignore[assignment]


class CollectiveResult(NamedTuple):
    """Result of a collective: global values/indices (indices None for dense) and stats."""

    values: torch.Tensor
    indices: torch.Tensor | None
    stats: CommStats


# ---------------------------------------------------------------------------------------
# validation helpers
#: The largest buffer an index can address (int64 indices).
MAX_NUMEL = 2**63 - 1


def check_k(k: int, numel: int, name: str = "k") -> None:
    """``k`` (the caller's argument ``name``) is an int in [1, numel]. O(1), on every call."""
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"{name}={k!r} has type {type(k).__name__}: expected int")
    if not 1 <= k <= numel:
        raise ValueError(f"{name}={k!r} is invalid: expected 1 <= {name} <= numel={numel}")


def check_numel(numel: int) -> None:
    """``numel`` is an int in [1, 2**63 - 1]. O(1), on every call."""
    if isinstance(numel, bool) or not isinstance(numel, int):
        raise TypeError(f"numel={numel!r} has type {type(numel).__name__}: expected int")
    if not 1 <= numel <= MAX_NUMEL:
        raise ValueError(f"numel={numel!r} is invalid: expected an integer in [1, 2**63 - 1]")


def check_algorithm(algorithm: str) -> None:
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm={algorithm!r} has type {type(algorithm).__name__}: expected one of "
                        f"{', '.join(SPARSE_ALGORITHMS)}")
    if algorithm not in SPARSE_ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is invalid: expected one of {', '.join(SPARSE_ALGORITHMS)}")


def check_exact_k(exact_k: bool, counts: dict[str, int], k: int, field: str = "exact_k=True") -> None:
    """``exact_k`` is a bool and, when True, every rank's count (by rank name) is k.

    ``field`` names the caller's argument in the message (``exact_count=K`` for the allgather).
    """
    if not isinstance(exact_k, bool):
        raise TypeError(f"exact_k={exact_k!r} has type {type(exact_k).__name__}: expected bool")
    if exact_k:
        for name, n in counts.items():
            if n != k:
                raise ValueError(f"{field} is invalid here: {name} selected {n} entries, "
                                 f"expected exactly k={k}")


def wire(values: torch.Tensor, indices: torch.Tensor, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    return values.contiguous(), indices.to(index_dtype(numel)).contiguous()
