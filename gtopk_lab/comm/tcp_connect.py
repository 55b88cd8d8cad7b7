"""The TCP mesh of :mod:`~gtopk_lab.comm.tcp_links`' handshake: where a rank listens and
how it connects to its peers.

1. :func:`listen_address`: the address of the interface gloo binds to
   (``GLOO_SOCKET_IFNAME``, which :func:`~gtopk_lab.comm.launch.bind_to_interface` sets to
   the one carrying the worker's address), else the hostname's, else 127.0.0.1;
   :func:`listen` opens a listener there on a port the OS picks;
2. :func:`connect_mesh`: connect to every higher rank and send a hello (magic, this rank, the
   world size, the listener's token), then accept one connection from every lower rank and
   check its hello (anything else is closed and ignored); ``TCP_NODELAY`` and non-blocking
   on each socket. Gives up after :data:`HANDSHAKE_S` (then gloo carries the messages).

Cost: P - 1 connections per rank, once per group.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import time

import psutil

__all__ = ["HANDSHAKE_S", "connect_mesh", "listen", "listen_address"]

_MAGIC = b"GTLK"
_HELLO = struct.Struct("<4sII8s")  # magic, the connecting rank, the world size, the listener's token
#: the handshake's connect / accept give up after this long (then gloo carries the messages)
HANDSHAKE_S = 30.0


def listen_address() -> str:
    """The address this rank's peers reach it at: that of the interface gloo binds to
    (``GLOO_SOCKET_IFNAME``, the first one named; IPv4 first), else the hostname's address
    (what gloo binds without the variable), else 127.0.0.1."""
    names = [n.strip() for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n.strip()]
    if names:
        addrs = psutil.net_if_addrs().get(names[0], [])
        for family in (socket.AF_INET, socket.AF_INET6):
            for addr in addrs:
                if addr.family == family:
                    return addr.address.split("%")[0]
    try:
        return socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP)[0][4][0]
    except (socket.gaierror, IndexError):
        return "127.0.0.1"


def listen() -> socket.socket:
    address = listen_address()
    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind((address, 0))
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    return listener


def _tuned(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    return sock


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed during the hello")
        data += chunk
    return data


def connect_mesh(rank: int, world: int, infos: list, listener: socket.socket) -> dict[int, socket.socket]:
    """Step 3: connections to the higher ranks, then from the lower ones (OSError if any fails)."""
    socks: dict[int, socket.socket] = {}
    deadline = time.monotonic() + HANDSHAKE_S
    try:
        for peer in range(rank + 1, world):
            address, port, token = infos[peer][1], infos[peer][2], infos[peer][3]
            sock = socket.create_connection((address, port), timeout=max(0.1, deadline - time.monotonic()))
            socks[peer] = sock
            sock.sendall(_HELLO.pack(_MAGIC, rank, world, token))
        own_token = infos[rank][3]
        while len(socks) < world - 1:
            listener.settimeout(max(0.1, deadline - time.monotonic()))
            sock, _ = listener.accept()
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                magic, peer, size, token = _HELLO.unpack(_recv_exact(sock, _HELLO.size))
            except (OSError, struct.error):
                sock.close()
                continue
            if magic != _MAGIC or size != world or token != own_token or not 0 <= peer < rank or peer in socks:
                sock.close()  # not one of this group's ranks: ignored
                continue
            socks[peer] = sock
        return {peer: _tuned(sock) for peer, sock in socks.items()}
    except BaseException:
        for sock in socks.values():
            sock.close()
        raise
