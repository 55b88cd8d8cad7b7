"""Messages a rank posts to several peers leave in posting order, one peer at a time
(gtopk_lab.comm.send_order through TcpLinks): on a shaped link the first peer has its whole
message when half the bytes have left, not at the end; messages to several peers still arrive
whole and in order; a peer that does not read cannot hold another peer's message (no
deadlock). Oracles: the messages' own bytes, and the shaped link's rate written out here."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gtopk_lab.comm.tcp_links import TcpLinks
from thread_ranks import run_ranks, tcp_mesh_sockets

HERE = Path(__file__).resolve()


def _mesh(world: int, timeout_s: float = 30.0) -> list[TcpLinks]:
    """A group of ``world`` ranks in this process, a real TCP connection on 127.0.0.1 per pair."""
    return [TcpLinks(r, world, socks, timeout_s) for r, socks in enumerate(tcp_mesh_sockets(world))]


@pytest.mark.timeout(60)
def test_messages_to_several_peers_posted_before_any_is_read_arrive_whole_and_in_order() -> None:
    """Rank 0 posts 40 messages of 0 to 3 MB, alternating irregularly between ranks 1 and 2,
    before either reads; each receives exactly its own, in the order posted."""
    links = _mesh(3)
    rng = np.random.default_rng(3)
    sizes = [int(s) for s in rng.integers(0, 300_000, 40)]
    sizes[5] = sizes[17] = 3 << 20  # larger than the socket buffers: queued behind the gate
    dests = [1 + int(d) for d in rng.integers(0, 2, 40)]
    messages = [rng.integers(0, 256, s, dtype=np.uint8) for s in sizes]

    def sender() -> None:
        for d, m in zip(dests, messages):
            links[0].send_arrays(d, [m])
        links[0].flush()

    def receiver(r: int):
        return lambda: [links[r].receive_array(0) for d in dests if d == r]
    _, got1, got2 = run_ranks([sender, receiver(1), receiver(2)], 50)
    for r, got in ((1, got1), (2, got2)):
        want = [m for d, m in zip(dests, messages) if d == r]
        assert [g.size for g in got] == [w.size for w in want]
        assert all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.timeout(60)
def test_a_peer_that_does_not_read_yet_cannot_hold_another_peers_message() -> None:
    """Rank 0 posts 32 MB to rank 1, then 1 kB to rank 2. Rank 1 reads rank 0 only after rank
    2 has told it to, and rank 2 does so only once it has rank 0's message: a gate that waited
    for rank 1's bytes to leave would deadlock until the group's timeout (30 s). The gate opens
    after STALL_S without progress, so all three finish within seconds."""
    links = _mesh(3)
    big, small = np.zeros(32 << 20, dtype=np.uint8), np.ones(1024, dtype=np.uint8)

    def rank0() -> None:
        links[0].send_arrays(1, [big])
        links[0].send_arrays(2, [small])
        links[0].flush()

    def rank1() -> int:
        links[1].receive_array(2)
        return links[1].receive_array(0).size

    def rank2() -> int:
        got = links[2].receive_array(0)
        links[2].send_arrays(1, [np.zeros(1, dtype=np.uint8)])
        links[2].flush()
        return got.size

    start = time.monotonic()
    _, size1, size2 = run_ranks([rank0, rank1, rank2], 45)
    assert (size1, size2) == (big.size, small.size)
    assert time.monotonic() - start < 15.0


# --- on a shaped link (network namespaces): the first peer's message arrives first ---------
def _probe_receiver(address: str, port: int, rounds: int) -> None:
    listener = socket.create_server((address, port))
    for _ in range(rounds):
        conn, _ = listener.accept()
        head = bytearray(8)
        view = memoryview(head)
        got = 0
        while got < 8:
            got += conn.recv_into(view[got:])
        body = memoryview(bytearray(int.from_bytes(head, "little")))
        got = 0
        while got < len(body):
            got += conn.recv_into(body[got:])
        print(json.dumps({"done_s": time.monotonic()}), flush=True)
        conn.close()


def _probe_sender(first: str, second: str, port: int, rounds: int, nbytes: int) -> None:
    payload = np.ones(nbytes, dtype=np.uint8)
    for _ in range(rounds):
        socks = {}
        for dst, address in ((1, first), (2, second)):
            sock = socket.create_connection((address, port), timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            socks[dst] = sock
        links = TcpLinks(0, 3, socks, 30.0)
        time.sleep(0.2)
        start = time.monotonic()  # one clock for every namespace: CLOCK_MONOTONIC is the host's
        links.send_arrays(1, [payload])
        links.send_arrays(2, [payload])
        links.flush()
        print(json.dumps({"start_s": start}), flush=True)
        time.sleep(0.4)  # both receivers are done: the next round starts on idle links
        links.close()


def _times(path: Path, key: str) -> list[float]:
    return [json.loads(line)[key] for line in path.read_text().splitlines() if line.startswith("{")]


@pytest.mark.timeout(120)
def test_on_a_shaped_link_the_first_peer_has_its_whole_message_when_half_the_bytes_have_left() -> None:
    """Three testbed hosts at 200 Mbit/s; host 0 posts 2 MB to host 1, then 2 MB to host 2
    (as a tree's root posts to its relay, then to a leaf). The oracle: 2 MB at 200 Mbit/s is
    84 ms, so in posting order the first arrives at about half the second's time. Interleaved
    (measured before SendOrder: 146-175 ms against 194-204 ms), it came late."""
    from gtopk_lab import testbed as testbed_pkg

    problem = testbed_pkg.testbed_problem()
    if problem is not None:
        pytest.skip(problem)
    rounds, port = 4, 29711
    with testbed_pkg.Testbed(hosts=3, rate="200mbit", name="tsord", dask=False) as tb:
        receivers = [tb.popen(h, [sys.executable, str(HERE), "receive", tb.address(h), str(port), str(rounds)],
                              log=f"recv{h}.log") for h in (1, 2)]
        time.sleep(1.0)
        sender = tb.popen(0, [sys.executable, str(HERE), "send", tb.address(1), tb.address(2), str(port),
                              str(rounds), str(2 << 20)], log="send.log")
        for proc in (sender, *receivers):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the probe hung:\n{tb.logs(1500)}")
        assert sender.returncode == 0 and all(p.returncode == 0 for p in receivers), tb.logs(1500)
        starts = _times(tb.folder / "send.log", "start_s")
        first = [d - s for d, s in zip(_times(tb.folder / "recv1.log", "done_s"), starts)]
        second = [d - s for d, s in zip(_times(tb.folder / "recv2.log", "done_s"), starts)]
    assert len(first) == len(second) == rounds
    wire_s = 2 * (2 << 20) * 8 / 200e6  # both messages at the shaped rate
    assert statistics.median(second) > 0.8 * wire_s, (first, second)  # the link really is shaped
    assert statistics.median(first) < 0.7 * statistics.median(second), (first, second)


if __name__ == "__main__":  # the probe's processes inside the testbed's hosts
    if sys.argv[1] == "receive":
        _probe_receiver(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        _probe_sender(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
