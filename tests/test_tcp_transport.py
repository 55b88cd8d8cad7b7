"""The project's own TCP links between hosts (gtopk_lab.comm.tcp_links): messages of any size
arrive whole and in order without deadlock when both ends send at once, a peer that closes or
goes silent is a one-line error that failure_cause reads as a lost peer or a peer timeout,
real ranks whose peer is killed stop at once, and the listener takes the address gloo binds.

The bitwise equality of every point-to-point collective over these links with gloo's path and
with oracles: test_shm_transport (MODES "tcp"). Real hosts (network namespaces): test_testbed.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.comm.tcp_links import TcpLinks, io_cpu_s, listen_address, tcp_wanted
from gtopk_lab.worker.faults import PEER_LOST, PEER_TIMEOUT, failure_cause
from thread_ranks import run_both, swap_messages, tcp_mesh_sockets


def _pair(timeout_s: float = 30.0) -> tuple[TcpLinks, TcpLinks]:
    """Both ends of a P = 2 group in this process, over one real TCP connection on 127.0.0.1."""
    a, b = tcp_mesh_sockets(2)
    return TcpLinks(0, 2, a, timeout_s), TcpLinks(1, 2, b, timeout_s)


@pytest.mark.timeout(60)
def test_an_exchange_larger_than_the_socket_buffers_streams_through() -> None:
    """Both ends post 16 MB to each other before receiving (threads as ranks): each keeps
    moving its own queued bytes while it waits, so neither blocks the other."""
    swap_messages(_pair(), 16 << 20, repeats=2)


@pytest.mark.timeout(60)
def test_messages_of_several_parts_and_of_no_bytes_arrive_whole_and_in_order() -> None:
    """200 messages of 1-3 parts, 0 to 300 kB, sent before any is read: the oracle is each
    message's parts concatenated, in the order sent."""
    a, b = _pair()
    gen = torch.Generator().manual_seed(7)
    messages = []
    for n in range(200):
        sizes = [int(x) for x in torch.randint(0, 3000 if n % 10 else 300_000, (1 + n % 3,), generator=gen)]
        messages.append([torch.randint(0, 256, (s,), dtype=torch.uint8, generator=gen) for s in sizes])
    results: list = []

    def rank(r: int) -> None:
        if r == 0:
            for parts in messages:
                a.send(1, parts)
            a.flush()
        else:
            results.extend(b.receive(0) for _ in messages)

    run_both(rank)
    assert len(results) == len(messages)
    for n, (got, parts) in enumerate(zip(results, messages)):
        assert torch.equal(got, torch.cat(parts)), n
    assert not any(a.pending.values())


@pytest.mark.timeout(60)
def test_io_cpu_counts_the_links_socket_work_but_not_their_waits_nor_other_work() -> None:
    """``io_cpu_s`` (the TCP links' I/O CPU the network model leaves to the calibrated wire):
    a receive that waits 0.3 s for a late 1 kB message adds almost nothing; a 64 MB receive
    adds at least the CPU this thread spent in it (all of it I/O: the oracle, read around the
    call here); 50 ms of arithmetic outside the links adds nothing."""
    a, b = _pair()

    def late_send(nbytes: int, delay_s: float) -> threading.Thread:
        def go() -> None:
            time.sleep(delay_s)
            b.send(0, torch.ones(nbytes, dtype=torch.uint8))
            b.flush()
        t = threading.Thread(target=go)
        t.start()
        return t

    sender = late_send(1024, 0.3)
    io0, t0 = io_cpu_s(), time.monotonic()
    assert a.receive(1).numel() == 1024
    waited_s, io_s = time.monotonic() - t0, io_cpu_s() - io0
    sender.join()
    assert waited_s >= 0.29 and io_s < 0.05, (waited_s, io_s)

    sender = late_send(64 << 20, 0.0)
    io0, cpu0 = io_cpu_s(), time.thread_time()
    got = a.receive(1)
    receive_cpu_s, io_s = time.thread_time() - cpu0, io_cpu_s() - io0
    sender.join()
    assert got.numel() == 64 << 20 and bool((got == 1).all())
    assert receive_cpu_s > 0 and io_s >= 0.99 * receive_cpu_s, (receive_cpu_s, io_s)

    io0, cpu0 = io_cpu_s(), time.thread_time()
    x = 0
    while time.thread_time() - cpu0 < 0.05:
        x += 1
    assert io_cpu_s() == io0


@pytest.mark.timeout(60)
def test_a_closed_peer_or_a_silent_one_is_a_one_line_error_not_a_hang() -> None:
    mine, theirs = _pair()
    theirs.close()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        mine.receive(1)
    assert time.monotonic() - t0 < 5.0
    text = str(info.value)
    assert "\n" not in text and "rank 1 of 2" in text and failure_cause(info.value) == PEER_LOST, text
    with pytest.raises(RuntimeError) as info:  # a send into a closed connection: reset or broken pipe
        for _ in range(50):
            mine.send(1, torch.zeros(1 << 20, dtype=torch.uint8))
            mine.flush()
            time.sleep(0.01)
    assert failure_cause(info.value) == PEER_LOST, str(info.value)
    mine, _silent = _pair(timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        mine.receive(1)
    assert 0.3 <= time.monotonic() - t0 < 5.0
    assert "the group's timeout" in str(info.value) and failure_cause(info.value) == PEER_TIMEOUT


def _killed_job(rank: int, world: int) -> None:
    from gtopk_lab.comm.torch_dist import gtopk_allreduce
    from gtopk_lab.comm.transport_choice import transport_kind

    os.environ["GTOPK_LAB_SHM"] = "0"  # one host: the TCP links, as between hosts
    assert transport_kind() == "tcp"
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(rank))
    i = x.abs().topk(100).indices
    gtopk_allreduce(x[i], i, 10_000, 100)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    gtopk_allreduce(x[i], i, 10_000, 100, algorithm="tree")  # rank 0 waits for a dead peer


@pytest.mark.timeout(120)
def test_a_killed_rank_stops_its_peer_at_once_as_a_lost_peer() -> None:
    """The group's timeout is 100 s; the survivor's wait ends with the closed connection."""
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="Connection closed by peer: rank 1 of 2") as info:
        run_gloo(_killed_job, 2, timeout_s=100.0)
    assert time.monotonic() - t0 < 60.0
    assert failure_cause(RuntimeError(str(info.value).splitlines()[-1])) == PEER_LOST


@pytest.mark.timeout(30)
def test_listen_address_is_the_interface_gloo_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    assert listen_address() == "127.0.0.1"
    for text, want in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("GTOPK_LAB_TCP", text)
        assert tcp_wanted() is want
    monkeypatch.setenv("GTOPK_LAB_TCP", "maybe")
    with pytest.raises(ValueError, match="GTOPK_LAB_TCP='maybe' is invalid"):
        tcp_wanted()


def _clock_max_job(rank: int, world: int, shm: str) -> list:
    from gtopk_lab.comm.torch_dist import gtopk_allreduce
    from gtopk_lab.comm.transport_choice import links_max_reduce

    os.environ["GTOPK_LAB_SHM"] = shm
    reduce_max = links_max_reduce()
    got = [reduce_max([float(rank)])]  # no handshake yet: None, the caller's all_reduce runs
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(rank))
    i = x.abs().topk(100).indices
    for call in range(3):  # collectives and the clock's max interleaved on the same links
        r = gtopk_allreduce(x[i] * (call + 1), i, 10_000, 100, algorithm="tree" if call % 2 else "butterfly")
        got.append((reduce_max([rank + call, -rank, 1e9 if rank == world - 1 else 0.0]),
                    float(r.values.abs().sum())))
    return got


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shm", ["0", "1"])
def test_the_clocks_max_over_the_links_equals_the_oracle_between_collectives(shm: str) -> None:
    """links_max_reduce over TCP links (shm 0) and shared-memory rings (1), P = 3: None until
    a collective made the handshake, then each rank holds the maximum written here, and the
    collectives around it are undisturbed (the same sums on every rank)."""
    world = 3
    got = run_gloo(_clock_max_job, world, shm, timeout_s=60.0)
    assert [g[0] for g in got] == [None] * world
    for call in range(3):
        want = [float(world - 1 + call), 0.0, 1e9]
        assert all(g[1 + call][0] == want for g in got), [g[1 + call] for g in got]
        assert len({g[1 + call][1] for g in got}) == 1
