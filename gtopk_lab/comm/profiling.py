"""Optional per-round timing of gTop-k calls: where one rank's call time goes.

Inside ``with profiling() as prof:`` every :func:`gtopk_lab.comm.torch_dist.gtopk_allreduce`
this thread makes records, per communication round, the wall time (``time.perf_counter``)
and this thread's CPU time (``time.thread_time``) of each phase:

- ``pack``: moving the operand to the send device and packing values + indices into one
  uint8 buffer;
- ``sendrecv``: posting the isend/irecv (one buffer per message) and waiting for the
  receive (sends complete at the call's end); with an active
  :class:`~gtopk_lab.network.pacing.LinkPacer` also the pacing sleep;
- ``unpack``: viewing (or copying) the received buffer as values and indices;
- ``merge``: ``merge_sparse`` of the two operands (top-k of their sparse sum);

and, once per call, ``prep`` (argument checks, wire dtypes, the local sort by index) and
``finish`` (stats, moving results and drops to the caller's device). Their sum is the
call's time less the program's bookkeeping between phases (byte counts, the generator
hand-offs: tens of µs) and any preemption that falls between two phases (3-18% of
the call on the 2-core box at load 9, benchmarks/RESULTS.md).

Why thread CPU as well as wall: when ranks outnumber cores (8 ranks on 2 cores), a
rank's wall time includes the time it waited for a core; its thread CPU does not. The
gap says how much of a merge phase is contention rather than work.

When no profile is active the hooks cost one ``ContextVar`` read per call and an
``is None`` test per phase; nothing is timed and results, stats and bytes are the same
either way (the hooks only read clocks). The in-process simulator never records.

Example::

    with profiling() as prof:
        gtopk_allreduce(values, indices, numel, k, algorithm="butterfly", exact_k=True)
    prof.totals()  # {'prep': 1.1e-4, 'pack': ..., 'sendrecv': ..., 'merge': ..., ...}
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["ROUND_PHASES", "CALL_PHASES", "PHASES", "RoundProfile", "profiling", "active_profile"]

#: phases timed in every communication round
ROUND_PHASES: tuple[str, ...] = ("pack", "sendrecv", "unpack", "merge")
#: phases timed once per call, before the first and after the last round
CALL_PHASES: tuple[str, ...] = ("prep", "finish")
#: every phase, in the order a call runs them
PHASES: tuple[str, ...] = ("prep", "pack", "sendrecv", "unpack", "merge", "finish")

_ACTIVE: contextvars.ContextVar["RoundProfile | None"] = contextvars.ContextVar(
    "gtopk_lab_round_profile", default=None)

Stamp = tuple[float, float]


@dataclass
class RoundProfile:
    """Phase times of the calls made while this profile was active (one rank).

    ``call`` sums the per-call phases (prep, finish) over calls; ``rounds`` holds one dict
    per round in call order, each ``{"label": "butterfly exchange", "pack": s, ...,
    "pack_cpu": s, ...}``. Several calls append their rounds one after the other: use one
    profile per call to tell them apart (as ``gtopk_lab.bench.profile`` does).
    """

    call: dict[str, float] = field(default_factory=dict)
    rounds: list[dict[str, float | str]] = field(default_factory=list)

    @staticmethod
    def stamp() -> Stamp:
        """(wall, thread CPU) now: the start of a phase, handed back to :meth:`stop`."""
        return time.perf_counter(), time.thread_time()

    def begin_round(self, label: str) -> None:
        """Open the next round (``label``: the schedule step, e.g. "reduce recv")."""
        self.rounds.append({"label": label})

    def stop(self, phase: str, start: Stamp) -> None:
        """Add the wall and thread CPU time since ``start`` to ``phase``: a call phase to
        :attr:`call`, a round phase to the open round (to :attr:`call` if none is open,
        e.g. a transport used outside a profiled program)."""
        wall = time.perf_counter() - start[0]
        cpu = time.thread_time() - start[1]
        target = self.rounds[-1] if phase in ROUND_PHASES and self.rounds else self.call
        target[phase] = float(target.get(phase, 0.0)) + wall
        target[f"{phase}_cpu"] = float(target.get(f"{phase}_cpu", 0.0)) + cpu

    def totals(self, cpu: bool = False) -> dict[str, float]:
        """Seconds per phase summed over calls and rounds (thread CPU with ``cpu=True``)."""
        suffix = "_cpu" if cpu else ""
        out = {p: float(self.call.get(p + suffix, 0.0)) for p in PHASES}
        for rnd in self.rounds:
            for p in ROUND_PHASES:
                out[p] += float(rnd.get(p + suffix, 0.0))
        return out


def active_profile() -> RoundProfile | None:
    """The profile of the innermost :func:`profiling` block of this thread, or None."""
    return _ACTIVE.get()


@contextlib.contextmanager
def profiling(profile: RoundProfile | None = None) -> Iterator[RoundProfile]:
    """Record phase times into ``profile`` (a fresh one by default) for the block."""
    prof = RoundProfile() if profile is None else profile
    token = _ACTIVE.set(prof)
    try:
        yield prof
    finally:
        _ACTIVE.reset(token)
