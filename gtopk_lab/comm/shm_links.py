"""A process group's shared-memory links on one host: the handshake, the rings, blocking waits.

:func:`shm_links` gives this rank's :class:`ShmLinks` for a gloo group whose ranks all run on
this host, or None (then gloo carries the messages). It is decided once per group, by the
handshake, on the group's first point-to-point call (every rank makes that call):

1. each rank reads its settings (``GTOPK_LAB_SHM``, ``GTOPK_LAB_SHM_RING_BYTES``, the two
   wait variables below); unless ``GTOPK_LAB_SHM=0``, a setting is invalid or the platform
   lacks support (:func:`~gtopk_lab.comm.shm_ring.shm_supported`), it removes stale
   segments of dead processes, then creates its mailbox segment: P - 1 rings of
   ``GTOPK_LAB_SHM_RING_BYTES`` (default 2 MiB) each;
2. ``all_gather_object`` over the group of (willing, host identity, segment name, pid,
   ring bytes, settings error): an invalid setting on any rank is then the same one-line
   ``ValueError`` on every rank (naming that rank), so none waits out the group's timeout
   for a peer that has given up; shared memory only if every rank is willing and all
   identities are equal;
3. each rank maps its peers' segments; a second ``all_gather_object`` of "mapped";
4. every rank unlinks its own segment file: from here on nothing of it is left in
   /dev/shm, whatever happens to any rank (a rank killed inside steps 1-3 leaves its file
   to the next handshake's sweep). Any failure: every rank unlinks and uses gloo.

Cost: two ``all_gather_object`` once per group (a few ms), P - 1 rings of memory per rank.

Waiting: a rank that waits (for a message, or for space to send into) first spins for
``GTOPK_LAB_SHM_SPIN_US`` (default 50 us, :data:`DEFAULT_SPIN_US`: longer spins measured
slower on a loaded box; 0 when the ranks outnumber the cores of this process's affinity,
where a spinning rank would take the core its peer needs), then polls between ``sched_yield``
calls for ``GTOPK_LAB_SHM_YIELD_US`` (default 500 us: a runnable peer on this core goes
first), then sleeps on its doorbell (futex, 2 ms timeout): on the 2-core VM a futex
wake-up took 40-100 us a hop, a spinning or yielding one 15 us (8 kB ping-pong). While it
waits it keeps moving its own pending sends, checks every 50 ms
that its peers still run (a dead peer is a ``RuntimeError`` naming it, as gloo's closed
connection would be) and gives up after the group's timeout.
"""

from __future__ import annotations

import os
import secrets
import time
from collections import deque

import numpy as np
import torch.distributed as dist

from gtopk_lab.comm.dist_transport import group_timeout_s
from gtopk_lab.comm.group_links import GroupLinks, Links, links_wanted
from gtopk_lab.comm.shm_ring import (CONTROL_BYTES, RING_HEADER_BYTES, SHM_DIR, Doorbell, Ring, Segment,
                                     host_identity, process_alive, segment_name, shm_supported,
                                     sweep_stale_segments)

__all__ = ["SHM_ENV", "RING_BYTES_ENV", "SPIN_ENV", "YIELD_ENV", "DEFAULT_SPIN_US", "ShmLinks", "shm_links",
           "shm_wanted", "wait_settings", "forget_links"]

#: "0" turns the shared-memory transport off (gloo everywhere); "1" (default): used where it can be
SHM_ENV = "GTOPK_LAB_SHM"
RING_BYTES_ENV = "GTOPK_LAB_SHM_RING_BYTES"
SPIN_ENV = "GTOPK_LAB_SHM_SPIN_US"
YIELD_ENV = "GTOPK_LAB_SHM_YIELD_US"
DEFAULT_RING_BYTES = 2 << 20
#: spin this long before yielding while the ranks fit the cores. Longer spins lost on the
#: shared 2-core box (P = 2, 1M, back to back, load 7-9: 0 / 50 / 300 / 1000 us -> 0.70 /
#: 0.80 / 1.28 / 3.05 ms a butterfly call, 0.88 / 1.79 / 3.48 / 6.88 ms a tree call): with
#: other jobs runnable, a spinner burns the slice its peer or they could use
DEFAULT_SPIN_US = 50
_SLEEP_S = 0.002
_PEER_CHECK_S = 0.05
_LENGTH = 8  # bytes of a message's length in front of it in a ring


def _env_int(name: str, default: int, low: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < low:
        raise ValueError(f"{name}={text!r} is invalid: expected an integer >= {low}")
    return int(text)


def shm_wanted() -> bool:
    """``GTOPK_LAB_SHM``: "0"/"off"/"false" -> False; unset, "1"/"on"/"auto" -> True."""
    return links_wanted(SHM_ENV, "shared memory where possible")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def wait_settings(world: int) -> tuple[int, int]:
    """(spin, yield) microseconds of a wait (module docstring): ``GTOPK_LAB_SHM_SPIN_US``
    (default :data:`DEFAULT_SPIN_US` while the ranks fit the cores, else 0: a spinning rank
    would hold the core its peer needs) and ``GTOPK_LAB_SHM_YIELD_US`` (default 500)."""
    spin = _env_int(SPIN_ENV, DEFAULT_SPIN_US if world <= _cores() else 0, 0)
    return spin, _env_int(YIELD_ENV, 500, 0)


def _settings(world: int) -> tuple[bool, int]:
    """(wanted, ring bytes) from the environment, every variable checked: ValueError naming
    the first invalid one (:func:`_handshake` shares it with every rank before raising it)."""
    wanted = shm_wanted()
    capacity = _env_int(RING_BYTES_ENV, DEFAULT_RING_BYTES, 64)
    wait_settings(world)
    return wanted, capacity


def _ring_offset(sender: int, receiver: int, capacity: int) -> int:
    slot = sender - (sender > receiver)
    return CONTROL_BYTES + slot * (RING_HEADER_BYTES + capacity)


def _segment_bytes(world: int, capacity: int) -> int:
    return CONTROL_BYTES + (world - 1) * (RING_HEADER_BYTES + capacity)


class ShmLinks(Links):
    """This rank's rings of one group: its mailbox (a ring from each peer) and its peers'."""

    def __init__(self, rank: int, world: int, own: Segment, peers: dict[int, Segment],
                 capacities: list[int], pids: list[int], timeout_s: float) -> None:
        self.rank, self.world, self.pids, self.timeout_s = rank, world, pids, timeout_s
        self.segments = [own, *peers.values()]
        self.inbox = {s: Ring(own, _ring_offset(s, rank, capacities[rank]), capacities[rank])
                      for s in range(world) if s != rank}
        self.outbox = {d: Ring(seg, _ring_offset(rank, d, capacities[d]), capacities[d]) for d, seg in peers.items()}
        self.bell = Doorbell(own)
        self.peer_bells = {d: Doorbell(seg) for d, seg in peers.items()}
        #: per destination: [uint8 array, bytes written, unused]
        self.pending: dict[int, deque[list]] = {d: deque() for d in peers}
        self.spin_s, self.yield_s = (us * 1e-6 for us in wait_settings(world))

    # ------------------------------------------------------------------ sending
    def send_arrays(self, dst: int, arrays: list[np.ndarray]) -> None:
        """One message (its length, then the bytes of the uint8 ``arrays`` one after the
        other) to ``dst``: copied into the ring at once when nothing is queued before it and it
        fits (one published store, one doorbell), else queued and moved as far as the free
        space allows now, the rest while this rank waits."""
        total = sum(a.size for a in arrays)
        length = np.array([total], dtype=np.int64).view(np.uint8)
        queue = self.pending[dst]
        if not queue and self.outbox[dst].write_message(arrays, length, total):
            self.peer_bells[dst].ring()
            return
        queue.append([length, 0, None])
        # a copy: the parts may be views of tensors the program reuses once post returns
        queue.append([arrays[0].copy() if len(arrays) == 1 else np.concatenate(arrays), 0, None])
        self.pump()

    def pump(self) -> bool:
        """Write pending bytes as far as the rings' free space allows; True if any moved."""
        moved = False
        for dst, queue in self.pending.items():
            ring, wrote = self.outbox[dst], False
            while queue:
                item = queue[0]
                n = ring.write_some(item[0], item[1])
                if n == 0 and item[0].size:
                    break
                item[1] += n
                wrote = True
                if item[1] < item[0].size:
                    break
                queue.popleft()
            if wrote:
                self.peer_bells[dst].ring()
                moved = True
        return moved

    # ------------------------------------------------------------------ receiving
    def receive_array(self, src: int) -> np.ndarray:
        """:meth:`receive` as a fresh uint8 numpy array (this rank owns it)."""
        ring = self.inbox[src]
        length = np.zeros(1, dtype=np.int64)
        whole = ring.read_message(length)  # the common case: the peer sent before we looked
        if whole is not None:
            self.peer_bells[src].ring()  # space freed: a writer waiting for it goes on
            return whole
        length_bytes = length.view(np.uint8)
        state = {"got": 0, "out": None, "out_np": None}

        def ready() -> bool:
            if state["out"] is None and state["got"] == 0:
                whole = ring.read_message(length)
                if whole is not None:
                    self.peer_bells[src].ring()
                    state["out"] = whole
                    return True
            if state["out"] is None:
                n = ring.read_some(length_bytes, state["got"])
                if n:
                    self.peer_bells[src].ring()
                state["got"] += n
                if state["got"] < _LENGTH:
                    return False
                state["out"] = np.empty(int(length[0]), dtype=np.uint8)
                state["out_np"], state["got"] = state["out"], 0
            out_np = state["out_np"]
            n = ring.read_some(out_np, state["got"])
            if n:
                self.peer_bells[src].ring()  # space freed: a writer waiting for it goes on
            state["got"] += n
            return state["got"] == out_np.size

        self._wait_until(ready, src, "send its message")
        return state["out"]

    # ------------------------------------------------------------------ waiting
    def _wait_until(self, ready, peer: int | None, what: str) -> None:
        """Spin, then sleep on the doorbell, until ``ready()``; pending sends keep moving."""
        start = time.perf_counter()
        spin_end, next_check = start + self.spin_s, start + _PEER_CHECK_S
        yield_end = spin_end + self.yield_s
        while True:
            seen = self.bell.value()  # before looking: a ring after this wakes the sleep below
            self.pump()
            if ready():
                return
            now = time.perf_counter()
            if now < spin_end:
                continue
            if now < yield_end:  # runnable peers on this core go first; still no kernel sleep
                os.sched_yield()
                continue
            if now >= next_check:
                self._check_peers(peer, what, now - start)
                next_check = now + _PEER_CHECK_S
            self.bell.sleep(seen, _SLEEP_S)

    def _check_peers(self, peer: int | None, what: str, waited_s: float) -> None:
        for r, pid in enumerate(self.pids):
            if r != self.rank and not process_alive(pid):
                raise RuntimeError(f"shared-memory transport: rank {r} (pid {pid}) of {self.world} died "
                                   f"while rank {self.rank} waited for rank {peer if peer is not None else 'a peer'} "
                                   f"to {what}")
        if waited_s > self.timeout_s:
            raise RuntimeError(f"shared-memory transport: rank {self.rank} waited {waited_s:.0f}s (the group's "
                               f"timeout) for rank {peer if peer is not None else 'a peer'} to {what}")

    def close(self) -> None:
        for seg in self.segments:
            seg.close()


# ---------------------------------------------------------------------- the handshake
def _handshake(group: dist.ProcessGroup | None, rank: int, world: int) -> ShmLinks | None:
    """Steps 1-4 of the module docstring; the same answer on every rank."""
    error = ""
    try:
        wanted, capacity = _settings(world)
    except ValueError as exc:  # raised below on every rank, not here on this one alone
        error, wanted, capacity = str(exc), False, DEFAULT_RING_BYTES
    willing = wanted and shm_supported()
    own: Segment | None = None
    peers: dict[int, Segment] = {}
    links: ShmLinks | None = None
    try:
        if willing:
            try:
                sweep_stale_segments()
                own = Segment(SHM_DIR / segment_name(secrets.token_hex(6)), _segment_bytes(world, capacity))
            except OSError:  # no room in /dev/shm, no permission: gloo
                willing = False
        infos: list = [None] * world
        dist.all_gather_object(infos, (willing, host_identity(), own.path.name if own else "", os.getpid(),
                                       capacity, error), group=group)
        bad = [(r, info[5]) for r, info in enumerate(infos) if info[5]]
        if bad:  # the same error on every rank, so none waits for a peer that has given up
            raise ValueError(f"{bad[0][1]} (in the environment of rank {bad[0][0]} of {world})")
        if not all(info[0] for info in infos) or len({info[1] for info in infos}) != 1:
            return None
        mapped = True
        try:
            for d, info in enumerate(infos):
                if d != rank:
                    peers[d] = Segment(SHM_DIR / info[2])
        except OSError:
            mapped = False
        answers: list = [None] * world
        dist.all_gather_object(answers, mapped, group=group)
        if not all(answers):
            return None
        assert own is not None
        links = ShmLinks(rank, world, own, peers, [info[4] for info in infos], [info[3] for info in infos],
                         group_timeout_s(group))
        return links
    finally:
        if own is not None:
            own.unlink()  # every peer has mapped it (or none will use it)
            if links is None:
                own.close()
        if links is None:
            for seg in peers.values():
                seg.close()


_GROUPS: GroupLinks[ShmLinks] = GroupLinks(_handshake)


def forget_links(key: int) -> None:
    """Drop (and unmap) the links kept under ``key`` = id(group) (the group was freed)."""
    _GROUPS.forget(key)


def links_decided(group: dist.ProcessGroup | None) -> bool | None:
    """Without any communication: True when ``group``'s handshake chose shared memory, False
    when it chose gloo, None when no point-to-point call has asked yet."""
    return _GROUPS.decided(group)


def shm_links(group: dist.ProcessGroup | None) -> ShmLinks | None:
    """This rank's shared-memory links of ``group`` (None: the default group), or None when
    gloo carries its messages (another backend, one rank, not one host, turned off)."""
    return _GROUPS.get(group)
