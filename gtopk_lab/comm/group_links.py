"""A group's own links: what both kinds share, and their handshake made once per group.

:class:`Links` is the part of the shared-memory rings (:class:`~gtopk_lab.comm.shm_links.ShmLinks`)
and the TCP links (:class:`~gtopk_lab.comm.tcp_links.TcpLinks`) that does not depend on the
medium: a message of tensors sent as its bytes, a received message as a tensor, and the
flush of queued sends (each kind brings ``send_arrays``, ``receive_array``, its wait and
``close``); :func:`links_wanted` reads each kind's on/off switch from the environment.

The shared-memory rings (:mod:`gtopk_lab.comm.shm_links`) and the TCP links
(:mod:`gtopk_lab.comm.tcp_links`) are each decided by a collective handshake on a group's
first point-to-point call. :class:`GroupLinks` keeps that decision per group:

1. keyed by ``id(group)`` (the default group when None), with a weak reference to the
   group, so a freed group's id taken by a new one is not a hit;
2. :meth:`GroupLinks.get` runs ``handshake(group, rank, world)`` on a gloo group of more than
   one rank the first time (every rank of the group must ask together then), else keeps None;
3. when the group is freed, its links are dropped and closed (the weak reference's callback).

Cost: a dict lookup per call once decided. Worker side.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from gtopk_lab.comm.dist_transport import rank_world

__all__ = ["GroupLinks", "Links", "links_wanted"]


def links_wanted(env: str, what: str) -> bool:
    """The switch ``env`` of one kind of links: "0"/"off"/"false"/"no" -> False; unset, "",
    "1"/"on"/"true"/"yes"/"auto" -> True; anything else a ``ValueError`` naming ``env`` and
    what 1 means (``what``)."""
    text = os.environ.get(env, "1").strip().lower()
    if text in ("0", "off", "false", "no"):
        return False
    if text in ("", "1", "on", "true", "yes", "auto"):
        return True
    raise ValueError(f"{env}={text!r} is invalid: expected 0 (gloo only) or 1 ({what})")


class Links:
    """The medium-free part of a group's links (module docstring); one rank's end."""

    #: per destination: what is queued and not yet sent
    pending: dict[int, deque[Any]]

    def send_arrays(self, dst: int, arrays: list[np.ndarray]) -> None:
        """Send one message, the concatenation of the uint8 ``arrays``, to ``dst``."""
        raise NotImplementedError

    def receive_array(self, src: int) -> np.ndarray:
        """The next message from ``src`` as a fresh uint8 numpy array (blocks)."""
        raise NotImplementedError

    def _wait_until(self, ready: Callable[[], bool], peer: int | None, what: str) -> None:
        raise NotImplementedError

    def send(self, dst: int, parts: torch.Tensor | list[torch.Tensor]) -> None:
        """Send one message (its length, then the bytes of the uint8 tensor ``parts``, or of
        a list of them one after the other) to ``dst``; returns without waiting for it."""
        self.send_arrays(dst, [parts.numpy()] if isinstance(parts, torch.Tensor) else [t.numpy() for t in parts])

    def receive(self, src: int) -> torch.Tensor:
        """The next message from ``src`` as a fresh uint8 tensor (blocks)."""
        return torch.from_numpy(self.receive_array(src))

    def flush(self) -> None:
        """Block until every queued send has left this rank (into its ring or the kernel; the
        peer need not have read it)."""
        self._wait_until(lambda: not any(self.pending.values()), None, "take this rank's messages")


class _Closable(Protocol):
    def close(self) -> None: ...


L = TypeVar("L", bound=_Closable)


class GroupLinks(Generic[L]):
    """The per-group decisions of one kind of links (module docstring)."""

    def __init__(self, handshake: Callable[[dist.ProcessGroup | None, int, int], L | None]) -> None:
        self._handshake = handshake
        self._lock = threading.Lock()
        #: id(group) -> (weak reference to the group, its links or None for gloo)
        self._entries: dict[int, tuple[weakref.ref, L | None]] = {}

    def forget(self, key: int) -> None:
        """Drop (and close) the links kept under ``key`` = id(group) (the group was freed)."""
        with self._lock:
            hit = self._entries.pop(key, None)
        if hit is not None and hit[1] is not None:
            hit[1].close()

    def _cached(self, pg: dist.ProcessGroup) -> tuple[weakref.ref, L | None] | None:
        hit = self._entries.get(id(pg))
        return hit if hit is not None and hit[0]() is pg else None

    def decided(self, group: dist.ProcessGroup | None) -> bool | None:
        """Without any communication: True when ``group``'s handshake chose these links, False
        when it did not, None when it has not run."""
        hit = self._cached(group if group is not None else dist.group.WORLD)
        return None if hit is None else hit[1] is not None

    def get(self, group: dist.ProcessGroup | None) -> L | None:
        """Step 2: ``group``'s links (None: the default group), or None."""
        pg = group if group is not None else dist.group.WORLD
        hit = self._cached(pg)
        if hit is not None:
            return hit[1]
        rank, world = rank_world(group)
        links = None
        if world > 1 and str(dist.get_backend(group)).lower() == "gloo":
            links = self._handshake(group, rank, world)
        key = id(pg)
        with self._lock:
            self._entries[key] = (weakref.ref(pg, lambda _ref, key=key: self.forget(key)), links)
        return links
