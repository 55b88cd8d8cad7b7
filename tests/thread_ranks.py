"""Ranks as threads of this process, for the transports' own links tested without
processes (shared by tests/test_shm_transport.py, tests/test_tcp_transport.py and
tests/test_send_order.py)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import torch


def tcp_mesh_sockets(world: int) -> list[dict[int, socket.socket]]:
    """Every rank's sockets to every other (rank -> {peer: socket}), a real TCP connection on
    127.0.0.1 per pair, ``TCP_NODELAY`` and non-blocking as the TCP links' handshake leaves them."""
    socks: list[dict[int, socket.socket]] = [{} for _ in range(world)]
    for a in range(world):
        for b in range(a + 1, world):
            listener = socket.create_server(("127.0.0.1", 0))
            sa = socket.create_connection(listener.getsockname())
            sb, _ = listener.accept()
            listener.close()
            for s in (sa, sb):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.setblocking(False)
            socks[a][b], socks[b][a] = sa, sb
    return socks


def run_ranks(work: list[Callable[[], Any]], join_s: float = 30.0) -> list[Any]:
    """``work[r]()`` for every rank r on threads at once; what each returned. Asserts that none
    hung (each joined within ``join_s``) and that none raised (the exceptions in the message)."""
    results: list[Any] = [None] * len(work)
    errors: list[BaseException] = []

    def run(r: int) -> None:
        try:
            results[r] = work[r]()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not errors, errors
    return results


def run_both(body: Callable[[int], None], join_s: float = 30.0) -> None:
    """``body(0)`` and ``body(1)`` on two threads at once (:func:`run_ranks`)."""
    run_ranks([lambda: body(0), lambda: body(1)], join_s)


def swap_messages(ends: tuple[Any, Any], nbytes: int, repeats: int) -> None:
    """Each of two ends of one kind of links (rank 0's and rank 1's) sends ``nbytes`` random
    bytes to the other before receiving the other's, ``repeats`` times, on two threads; the
    oracle: each received exactly the tensor the other sent."""
    sent = [torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(r))
            for r in range(2)]
    got: list[Any] = [None, None]

    def rank(r: int) -> None:
        for _ in range(repeats):
            ends[r].send(1 - r, sent[r])
            got[r] = ends[r].receive(1 - r)
        ends[r].flush()

    run_both(rank)
    assert torch.equal(got[0], sent[1]) and torch.equal(got[1], sent[0])
