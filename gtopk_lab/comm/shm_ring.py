"""Shared-memory rings between the ranks of one host: segments, one ring per directed pair, doorbells.

Rank r owns one segment, the mailbox it receives in (P - 1 rings, one per sender):

1. **Layout.** ``[0, 64)`` control words: the doorbell (uint32, a futex word) and a
   ``sleeping`` flag (uint32, set while r waits in the kernel). Then, per sender s (slot s;
   slot r unused), a :data:`RING_HEADER_BYTES` header (``write_pos`` int64, written only by s;
   ``read_pos`` int64 one cache line later, written only by r) and ``capacity`` data bytes.
   Positions count bytes since the start and never wrap; byte ``pos`` lives at
   ``pos % capacity``. One writer and one reader per ring, so no lock: the writer copies its
   bytes, then publishes ``write_pos``; the reader copies, then publishes ``read_pos``.
   x86-64 keeps stores in order (TSO) and the copies are calls Python cannot reorder
   around, so a published position never runs ahead of its bytes; other CPUs would need
   fences, hence :func:`shm_supported` says x86-64 only.
2. **Messages** in a ring are an 8-byte length, then the bytes (the wire format's buffer,
   :mod:`gtopk_lab.comm.wire`); a message longer than the free space streams through.
3. **Doorbells.** A writer that published bytes, or a reader that freed space, increments
   the peer's doorbell and, only when the peer's ``sleeping`` flag is set, wakes it
   (``FUTEX_WAKE``, one syscall). A waiter spins briefly on its own doorbell, then sleeps
   in ``FUTEX_WAIT`` on it with a short timeout (a missed wake-up costs at most that).
4. **Files.** A segment is a file in /dev/shm (``O_EXCL``, space reserved with
   ``posix_fallocate`` so a full /dev/shm is an error here, not a SIGBUS later) that lives
   only during the handshake: every rank unlinks its own once all peers have mapped it
   (:mod:`gtopk_lab.comm.shm_links`). Names carry the pid namespace and pid of their
   creator, so :func:`sweep_stale_segments` can remove a segment whose creator died
   inside the handshake.

Cost: a message of n bytes is two copies (into the ring, out of it) plus, when the peer
sleeps, one ``FUTEX_WAKE`` and its wake-up (tens of microseconds); no socket, no thread.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import socket
from pathlib import Path

import numpy as np

__all__ = ["SHM_DIR", "SEGMENT_PREFIX", "RING_HEADER_BYTES", "CONTROL_BYTES", "Segment", "Ring",
           "Doorbell", "shm_supported", "host_identity", "segment_name", "sweep_stale_segments",
           "process_alive"]

SHM_DIR = Path("/dev/shm")
SEGMENT_PREFIX = "gtopk_lab_shm_"
CONTROL_BYTES = 64
#: write_pos and read_pos on separate cache lines (each has one writer)
RING_HEADER_BYTES = 128
_READ_SLOT = 8  # int64 index of read_pos in a ring header (byte 64)
_SYS_FUTEX_X86_64 = 202
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc: ctypes.CDLL | None = None


def _syscall() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def shm_supported() -> bool:
    """Linux on x86-64 with a writable /dev/shm (the rings' ordering relies on x86-64's TSO)."""
    return (platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")
            and SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK))


def _namespace(kind: str) -> int:
    try:
        return os.stat(f"/proc/self/ns/{kind}").st_ino
    except OSError:
        return 0


def _pid_namespace() -> int:
    return _namespace("pid")


def host_identity() -> str:
    """What two ranks must share to use each other's segments and pids: hostname, boot id,
    pid namespace (the handshake then also proves that each opened the others' files), and
    network namespace: ranks in separate network namespaces are separate hosts to the
    network (``gtopk-lab testbed``'s hosts, shaped links between them), so their messages
    must cross it, not this machine's shared memory."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}|{boot}|{_pid_namespace()}|{_namespace('net')}"


def segment_name(token: str) -> str:
    """A fresh segment's file name: prefix, pid namespace, pid, a random token."""
    return f"{SEGMENT_PREFIX}{_pid_namespace()}_{os.getpid()}_{token}"


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def sweep_stale_segments(directory: Path = SHM_DIR) -> list[str]:
    """Remove this pid namespace's segments whose creating process is gone (a rank killed
    inside its handshake); returns their names. Cost: one directory listing."""
    ns = str(_pid_namespace())
    removed = []
    try:
        names = [p.name for p in directory.iterdir() if p.name.startswith(SEGMENT_PREFIX)]
    except OSError:
        return removed
    for name in names:
        parts = name[len(SEGMENT_PREFIX):].split("_")
        if len(parts) != 3 or parts[0] != ns or not parts[1].isdigit() or process_alive(int(parts[1])):
            continue
        try:
            (directory / name).unlink()
            removed.append(name)
        except OSError:  # another rank swept it first
            pass
    return removed


class Segment:
    """One mapped segment file (created with ``size`` bytes, or opened at its own size)."""

    def __init__(self, path: Path, size: int | None = None) -> None:
        self.path = path
        create = size is not None
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError:
                    os.unlink(path)
                    raise
            self.size = os.fstat(fd).st_size
            self.mm = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)

    def unlink(self) -> None:
        """Remove the file; the mappings stay valid until every process closes them."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.bytes = None  # type: ignore[assignment]
        try:
            self.mm.close()
        except BufferError:  # a ring's view is still alive somewhere: the GC unmaps it later
            pass


class Doorbell:
    """The control words of one segment: its owner waits on them, its peers ring them."""

    def __init__(self, segment: Segment) -> None:
        self.words = np.frombuffer(segment.mm, dtype=np.uint32, count=2, offset=0)
        self.address = self.words.ctypes.data

    def value(self) -> int:
        return int(self.words[0])

    def ring(self) -> None:
        """Tell the owner something changed; one syscall only when it sleeps."""
        self.words[0] += np.uint32(1)  # wraps at 2**32; two peers racing still change it
        if self.words[1]:
            _syscall().syscall(ctypes.c_long(_SYS_FUTEX_X86_64), ctypes.c_void_p(self.address),
                               ctypes.c_int(_FUTEX_WAKE), ctypes.c_int(1), None, None, ctypes.c_int(0))

    def sleep(self, seen: int, timeout_s: float) -> None:
        """Sleep until the doorbell differs from ``seen`` (or ``timeout_s`` passes)."""
        self.words[1] = 1
        if int(self.words[0]) == seen:
            ts = _Timespec(int(timeout_s), int((timeout_s % 1.0) * 1e9))
            _syscall().syscall(ctypes.c_long(_SYS_FUTEX_X86_64), ctypes.c_void_p(self.address),
                               ctypes.c_int(_FUTEX_WAIT), ctypes.c_uint(seen), ctypes.byref(ts), None,
                               ctypes.c_int(0))
        self.words[1] = 0


class Ring:
    """One directed pair's ring inside the receiver's segment, at ``offset``."""

    def __init__(self, segment: Segment, offset: int, capacity: int) -> None:
        self.capacity = capacity
        self.pos = np.frombuffer(segment.mm, dtype=np.int64, count=RING_HEADER_BYTES // 8, offset=offset)
        start = offset + RING_HEADER_BYTES
        self.data = segment.bytes[start:start + capacity]

    def write_some(self, src: np.ndarray, start: int) -> int:
        """Copy ``src[start:]`` (uint8) as far as the free space allows; bytes written."""
        w, cap = int(self.pos[0]), self.capacity
        n = min(cap - (w - int(self.pos[_READ_SLOT])), src.size - start)
        if n <= 0:
            return 0
        at = w % cap
        first = min(n, cap - at)
        self.data[at:at + first] = src[start:start + first]
        if n > first:
            self.data[:n - first] = src[start + first:start + n]
        self.pos[0] = w + n  # published after the bytes
        return n

    def read_some(self, dst: np.ndarray, start: int) -> int:
        """Copy up to ``dst.size - start`` available bytes into ``dst[start:]``; bytes read."""
        r, cap = int(self.pos[_READ_SLOT]), self.capacity
        n = min(int(self.pos[0]) - r, dst.size - start)
        if n <= 0:
            return 0
        at = r % cap
        first = min(n, cap - at)
        dst[start:start + first] = self.data[at:at + first]
        if n > first:
            dst[start + first:start + n] = self.data[:n - first]
        self.pos[_READ_SLOT] = r + n  # the space is free only once the bytes are out
        return n

    def write_message(self, parts: list[np.ndarray], length: np.ndarray, total: int) -> bool:
        """Copy a whole message (``length``'s 8 bytes, then ``parts``, ``total`` bytes of
        them) in and publish it with one store, if the free space holds all of it; else
        write nothing and return False (the caller streams it). Cost: the copies alone."""
        w, cap = int(self.pos[0]), self.capacity
        if cap - (w - int(self.pos[_READ_SLOT])) < total + length.size:
            return False
        at = w
        for part in (length, *parts):
            n, start = part.size, at % cap
            first = min(n, cap - start)
            self.data[start:start + first] = part[:first]
            if n > first:
                self.data[:n - first] = part[first:]
            at += n
        self.pos[0] = at  # published after all the bytes
        return True

    def read_message(self, length: np.ndarray) -> np.ndarray | None:
        """The next message as a fresh uint8 array, taken with one store, when its 8-byte
        length (read into ``length``, int64) and all its bytes are in; else None and
        nothing taken (the caller streams it). Cost: one copy of the message."""
        r, cap = int(self.pos[_READ_SLOT]), self.capacity
        avail = int(self.pos[0]) - r
        head = length.view(np.uint8)
        if avail < head.size:
            return None
        at = r % cap
        first = min(head.size, cap - at)
        head[:first] = self.data[at:at + first]
        if head.size > first:
            head[first:] = self.data[:head.size - first]
        n = int(length[0])
        if avail < head.size + n:
            return None
        out = np.empty(n, dtype=np.uint8)
        at = (r + head.size) % cap
        first = min(n, cap - at)
        out[:first] = self.data[at:at + first]
        if n > first:
            out[first:] = self.data[:n - first]
        self.pos[_READ_SLOT] = r + head.size + n  # the space is free only once the bytes are out
        return out
