"""Virtual time and link throttling around every collective.

Two clocks describe a distributed run:

- **wall time** (``time.perf_counter``) is what the machine actually took. It is the right
  figure for benchmarking *this* machine, and for throttled runs that must really last as
  long as the emulated network would make them.
- **virtual time** is what the run would take on the modelled network with one core per
  rank: each rank's own compute is measured as *CPU time* between collectives
  (``time.process_time``, or the training thread's ``time.thread_time`` when the caller
  passes ``cpu_timer``, as ranks with one torch thread do), so it is not inflated when 8
  ranks share 2 cores (or, with ``charged_compute=True``, it is what the rank
  :meth:`~VirtualClock.charge` passes: a fixed, calibrated compute time), and each
  collective costs its *modelled* duration (``NetworkModel.steps_time_s`` of the
  per-round bytes in ``CommStats.steps``), not its loopback wall time. At every
  collective the ranks synchronise: the collective starts when the last rank arrives and
  lasts as long as the slowest rank's modelled rounds::

      arrival_i   = T + compute_i                  (T: common virtual time after the last sync)
      T'          = max_i arrival_i + max_i steps_time_s(steps_i)

  Virtual time is deterministic in its communication part (bytes and rounds only) and is
  the right figure for scaling-efficiency studies and for comparing methods across
  machines; it ignores contention that the model does not describe (shared cores, memory
  bandwidth, OS jitter). The CPU time of merges inside the collective (``merge_cpu_s``)
  is added to the rank's duration with ``include_merge_cpu=True`` (alpha-beta-gamma), which
  training runs do unless ``RunConfig.virtual_merge_cpu=False``; ``last_comm_model_s``
  stays the alpha-beta part either way. The class default is off, communication only.
  With ``merge_gamma_s_per_element`` the merges are charged from a calibration instead of
  their measured CPU time: ``gamma * stats.merged_elements`` per collective (the gamma of
  alpha-beta-gamma, measured once on an idle core at the run's k), so a loaded machine
  moves the merge charge no more than it moves a calibrated compute time. A collective's
  own compression of the rank's input (``stats.compress_cpu_s``: Ok-Topk's threshold
  selection, PowerSGD's projections) is step 3's work done late; with
  ``include_compress_cpu=True`` it is added to the duration as measured (training runs do,
  unless a fixed selection time stands for it); the simulator adds the median over the
  virtual ranks that compressed, as it charges their selection.

With ``throttle=True`` every *round* of the real collective is paced
(:mod:`gtopk_lab.network.pacing`): the rank sleeps until the round has lasted
``alpha + beta * max(sent, recv)`` before it goes on, so the merge that needs the round's
data starts after the emulated wire time, as on a real link (per-rank full-duplex link
emulation, unlike ``tc`` on loopback which shares one link). Library collectives are paced
as a whole before their local assembly. A final ``max(0, modelled_s - wall_s)`` top-up
covers collectives without pacing hooks. Wall time of a throttled sparse collective is
therefore about the alpha-beta-gamma time (wire + merge CPU), not ``max`` of the two.

The same ``all_reduce(MAX)`` carries each rank's wall-clock stamps (``time.time``) of the
call's start and end, so ``last_span_wall_s`` = max end - max start is the collective as
the ranks' shared clock saw it: from the last rank's arrival to the last rank's completion.
A rank's own call time cannot say this: the rank that arrives last finds its partners'
messages already sent and may finish before they receive its own (a butterfly's last
arrival reads less than the wire time of its rounds). Exact where the ranks share a clock
(one host, the namespaces testbed); across hosts it is off by their clocks' offset.

Cost per collective: one extra ``all_reduce(MAX)`` of five float64 values over ``group``,
or, with ``max_reduce`` (a rank's own max over the links its collectives already use:
``comm.transport_choice.links_max_reduce``), one 40-byte message to and from every peer.

Worker-side module: torch only, no plotting or notebook code.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from gtopk_lab.network.model import NetworkModel
from gtopk_lab.network.pacing import steps_model_s, throttled_call

__all__ = ["VirtualClock"]

T = TypeVar("T")


def _compress_cpu_s(item: Any) -> float:
    """``stats.compress_cpu_s`` of a ``CommStats`` or a result carrying ``.stats`` (0 if none)."""
    stats = getattr(item, "stats", item)
    return float(getattr(stats, "compress_cpu_s", 0.0) or 0.0)


def _steps_of(item: Any) -> Sequence[tuple[int, int]]:
    """``CommStats`` (or a result carrying ``.stats``) or a plain steps list -> steps."""
    if hasattr(item, "stats"):
        item = item.stats
    if hasattr(item, "steps"):
        return item.steps
    if isinstance(item, (list, tuple)):
        return item
    raise TypeError(f"stats={item!r} has type {type(item).__name__}: expected CommStats, "
                    "a CollectiveResult or a list of (bytes_sent, bytes_recv)")


class VirtualClock:
    """Per-rank virtual clock (compute CPU time + modelled communication), optional throttling.

    Parameters
    ----------
    network:
        The link model; ``NetworkModel.from_strings("none")`` models free communication.
    throttle:
        Sleep after each real collective until it has lasted its modelled time.
    group:
        ``torch.distributed`` process group to synchronise over; ``None`` uses the default
        group when one is initialised, else the clock runs alone (world size 1).
    include_merge_cpu:
        Add this rank's ``stats.merge_cpu_s`` to its collective duration (off by default so
        that the communication part stays deterministic).
    merge_gamma_s_per_element:
        With ``include_merge_cpu``: charge ``gamma * stats.merged_elements`` seconds per
        collective instead of the measured ``merge_cpu_s`` (None: measured).
    include_compress_cpu:
        Add this rank's ``stats.compress_cpu_s`` (its collective's own compression of its
        input) to its collective duration.

    Example::

        clock = VirtualClock(NetworkModel.from_strings("1Gbps"), throttle=True)
        ...forward/backward...
        result = clock.collective(gtopk_allreduce, values, indices, numel, k)
        row = {"virtual_time_s": clock.virtual_time_s, "comm_model_s": clock.last_comm_model_s}
    """

    def __init__(self, network: NetworkModel, throttle: bool = False, group: Any = None,
                 include_merge_cpu: bool = False, cpu_timer: Callable[[], float] | None = None,
                 charged_compute: bool = False, merge_gamma_s_per_element: float | None = None,
                 max_reduce: Callable[[list[float]], list[float] | None] | None = None,
                 include_compress_cpu: bool = False) -> None:
        if not isinstance(network, NetworkModel):
            raise TypeError(f"network={network!r} has type {type(network).__name__}: expected NetworkModel")
        if not isinstance(throttle, bool):
            raise TypeError(f"throttle={throttle!r} has type {type(throttle).__name__}: expected bool")
        # tuned by the user
        self.network = network
        self.throttle = throttle
        self.group = group
        # the ranks' own max of a few floats where they have faster links than the backend's
        # all_reduce (returns None where it does not apply, then the all_reduce runs); every
        # rank must take the same path in each call
        self.max_reduce = max_reduce
        self.include_merge_cpu = bool(include_merge_cpu)
        self.include_compress_cpu = bool(include_compress_cpu)
        if merge_gamma_s_per_element is not None and not (
                isinstance(merge_gamma_s_per_element, (int, float)) and not isinstance(merge_gamma_s_per_element, bool)
                and 0.0 <= merge_gamma_s_per_element < float("inf")):
            raise ValueError(f"merge_gamma_s_per_element={merge_gamma_s_per_element!r} is invalid: expected "
                             "seconds per element >= 0 (finite) or None")
        # a calibrated gamma (seconds per merged element): merges charged from it, not measured
        self.merge_gamma_s_per_element = (None if merge_gamma_s_per_element is None
                                          else float(merge_gamma_s_per_element))
        # The training thread's CPU time (time.thread_time) when the caller computes on one
        # thread: a Dask worker's own threads (event loop, heartbeats, event streaming) then
        # do not count as the rank's compute, as they do in the process-wide clock.
        self.cpu_timer = cpu_timer or time.process_time
        # A fixed compute time per iteration (RunConfig.compute_charge.compute_time_s): the rank
        # says what to charge (charge()) and its CPU time is not read, so a loaded machine
        # cannot move the virtual clock.
        self.charged_compute = bool(charged_compute)
        # internal state
        self.reset()

    # --- pickling: the process group stays behind -------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["group"] = None
        state["max_reduce"] = None
        return state

    # --- state --------------------------------------------------------------------------
    def reset(self) -> None:
        """Virtual time and all totals back to 0; compute is measured from now on."""
        self._time_s = 0.0            # common virtual time after the last synchronisation
        self._cpu_mark = self.cpu_timer()
        self._paused_cpu_s = 0.0
        self._charged_s = 0.0
        self.collectives = 0
        self.last_compute_s = 0.0     # this rank's CPU time before the last collective
        self.last_wait_s = 0.0        # virtual time this rank waited for the last arrival
        self.last_comm_model_s = 0.0  # alpha-beta time of the last collective (max over ranks;
        #                               merge CPU not included even with include_merge_cpu)
        self.last_rank_model_s = 0.0  # modelled duration of this rank's own rounds
        self.last_comm_wall_s = 0.0   # wall time of the real collective (+ throttle sleep) and the sync
        self.last_call_wall_s = 0.0   # of it, the collective's call alone (+ throttle sleep)
        self.last_sync_wall_s = 0.0   # of it, this clock's all_reduce(MAX) after the call
        self.last_span_wall_s = 0.0   # the last call from the last arrival to the last completion,
        #                               on the ranks' shared wall clock (max end - max start)
        self.last_comm_charge_s = 0.0  # virtual time the last collective took: the slowest rank's
        #                                modelled rounds (+ its merge CPU with include_merge_cpu)
        self.last_sleep_s = 0.0
        self.last_merge_cpu_s = 0.0
        self.last_compress_cpu_s = 0.0  # this rank's collective compression charged (include_compress_cpu)
        self.total_compress_cpu_s = 0.0
        self.total_compute_s = 0.0
        self.total_wait_s = 0.0
        self.total_comm_model_s = 0.0
        self.total_comm_wall_s = 0.0
        self.total_sleep_s = 0.0
        self.total_merge_cpu_s = 0.0

    def _pending_compute_s(self) -> float:
        if self.charged_compute:
            return self._charged_s
        return max(0.0, self.cpu_timer() - self._cpu_mark - self._paused_cpu_s)

    def charge(self, seconds: float) -> None:
        """Add ``seconds`` of compute before the next collective (``charged_compute`` clocks
        only: they read no CPU time)."""
        if not self.charged_compute:
            raise RuntimeError("charge() needs VirtualClock(charged_compute=True): this clock "
                               "measures compute as CPU time")
        if not seconds >= 0:
            raise ValueError(f"seconds={seconds!r} is invalid: expected a number >= 0")
        self._charged_s += float(seconds)

    @property
    def virtual_time_s(self) -> float:
        """Virtual time now: last synchronisation plus this rank's CPU time since then."""
        return self._time_s + self._pending_compute_s()

    @property
    def synced_time_s(self) -> float:
        """Virtual time at the end of the last collective (identical on every rank)."""
        return self._time_s

    def mark(self) -> None:
        """Forget CPU time spent since the last collective (e.g. set-up before training)."""
        self._cpu_mark = self.cpu_timer()
        self._paused_cpu_s = 0.0
        self._charged_s = 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """CPU time spent inside this block does not count as compute (evaluation, logging)."""
        start = self.cpu_timer()
        try:
            yield
        finally:
            self._paused_cpu_s += self.cpu_timer() - start

    def advance(self, seconds: float) -> None:
        """Add modelled time that no collective accounts for (e.g. an emulated I/O stall)."""
        if not seconds >= 0:
            raise ValueError(f"seconds={seconds!r} is invalid: expected a number >= 0")
        self._time_s += float(seconds)

    # --- process group --------------------------------------------------------------------
    def _world(self) -> tuple[Any, int]:
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch is a hard dependency
            return None, 1
        if not (dist.is_available() and dist.is_initialized()):
            return None, 1
        group = self.group
        return group, dist.get_world_size(group)

    def _max_over_ranks(self, values: list[float]) -> list[float]:
        """The element-wise max of ``values`` over the group's ranks (``values`` alone
        without a group)."""
        group, world = self._world()
        if world == 1:
            return list(values)
        if self.max_reduce is not None:
            reduced = self.max_reduce(list(values))
            if reduced is not None:
                return list(reduced)
        import torch
        import torch.distributed as dist

        device = torch.device("cpu")
        if dist.get_backend(group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        both = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
        return both.tolist()

    # --- the hook around every collective ---------------------------------------------------
    def collective(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run the real collective ``fn(*args, **kwargs)`` and advance virtual time.

        Steps: (1) arrival = virtual time now (CPU compute since the last collective
        included); (2) run ``fn`` and time it on the wall clock, with ``throttle`` under a
        :func:`~gtopk_lab.network.pacing.pacing` block that paces each round; (3)
        modelled_s = ``network.steps_time_s(result.stats.steps)``; (4) with ``throttle``
        top up with a sleep of ``max(0, modelled_s - wall_s)``; (5) one ``all_reduce(MAX)`` of
        (arrival, duration, modelled_s), duration = modelled_s + merge CPU with
        ``include_merge_cpu`` -> virtual time = max arrival + max duration, and
        ``last_comm_model_s`` = max modelled_s; the same all_reduce takes the max of the
        ranks' wall-clock stamps of steps 2-4's start and end, and ``last_span_wall_s`` =
        max end - max start. ``last_call_wall_s`` is this rank's wall time of steps 2-4
        (the method's communication), ``last_sync_wall_s`` that of step 5 (this clock's
        bookkeeping: on a real network a small all-reduce of its own, milliseconds).
        ``fn`` must return an object with ``.stats.steps`` (a ``CollectiveResult``).
        """
        compute_s = self._pending_compute_s()
        arrival_s = self._time_s + compute_s
        wall_start, stamp_start = time.perf_counter(), time.time()
        sleep_s = 0.0
        if self.throttle:
            result, rank_model_s, sleep_s = throttled_call(self.network, fn, *args, **kwargs)
        else:
            result = fn(*args, **kwargs)
            rank_model_s = steps_model_s(self.network, fn, result)
        call_end, stamp_end = time.perf_counter(), time.time()
        merge_cpu_s = self._merge_charge_s(result.stats)
        compress_s = _compress_cpu_s(result) if self.include_compress_cpu else 0.0
        duration_s = rank_model_s + (merge_cpu_s if self.include_merge_cpu else 0.0) + compress_s
        self.last_compress_cpu_s = compress_s
        self.total_compress_cpu_s += compress_s
        max_arrival_s, max_duration_s, max_model_s, last_start, last_end = self._max_over_ranks(
            [arrival_s, duration_s, rank_model_s, stamp_start, stamp_end])
        comm_wall_s = time.perf_counter() - wall_start
        # the method's collective alone; the all_reduce(MAX) above is this clock's own
        # bookkeeping, which a run without the platform would not make
        self.last_call_wall_s = call_end - wall_start
        self.last_sync_wall_s = comm_wall_s - self.last_call_wall_s
        self.last_span_wall_s = max(0.0, last_end - last_start)
        self.last_comm_charge_s = max_duration_s
        self._record(compute_s, max_arrival_s - arrival_s, max_model_s, rank_model_s,
                     comm_wall_s, sleep_s, merge_cpu_s)
        self._time_s = max_arrival_s + max_duration_s
        self.mark()
        return result

    def _merge_charge_s(self, stats: Any) -> float:
        """The merge seconds of one rank's collective: measured ``merge_cpu_s``, or with a
        calibrated gamma ``gamma * merged_elements``."""
        stats = getattr(stats, "stats", stats)
        if self.merge_gamma_s_per_element is not None:
            return self.merge_gamma_s_per_element * int(getattr(stats, "merged_elements", 0) or 0)
        return float(getattr(stats, "merge_cpu_s", 0.0) or 0.0)

    def _record(self, compute_s: float, wait_s: float, model_s: float, rank_model_s: float,
                wall_s: float, sleep_s: float, merge_cpu_s: float) -> None:
        self.collectives += 1
        self.last_compute_s, self.last_wait_s = compute_s, wait_s
        self.last_comm_model_s, self.last_rank_model_s = model_s, rank_model_s
        self.last_comm_wall_s, self.last_sleep_s, self.last_merge_cpu_s = wall_s, sleep_s, merge_cpu_s
        self.total_compute_s += compute_s
        self.total_wait_s += wait_s
        self.total_comm_model_s += model_s
        self.total_comm_wall_s += wall_s
        self.total_sleep_s += sleep_s
        self.total_merge_cpu_s += merge_cpu_s

    # --- single-process simulator ----------------------------------------------------------
    def simulate_collective(self, compute_s: Sequence[float], stats: Sequence[Any],
                            merge_cpu_s: Sequence[float] | None = None) -> float:
        """Advance time for P *virtual* ranks living in one process (the simulator's hook).

        ``compute_s[i]`` is rank i's compute time since the previous collective (the
        simulator measures it with ``time.process_time`` around that rank's work);
        ``stats[i]`` is rank i's ``CommStats`` (or ``CollectiveResult`` or steps list).
        Virtual time becomes ``T + max_i compute_s[i] + max_i steps_time_s(stats[i])``
        (plus merge CPU when ``include_merge_cpu``; with ``include_compress_cpu`` every rank
        that compressed inside the collective adds the median of those ranks'
        ``compress_cpu_s``: the slowest of P measurements on one shared machine is its
        contention, not the method's). Nothing is slept and no process group
        is used; ``last_*`` and ``total_*`` describe the slowest rank. Returns the new
        virtual time. O(total rounds).
        """
        if len(compute_s) != len(stats) or len(stats) == 0:
            raise ValueError(f"compute_s has {len(compute_s)} entries and stats {len(stats)}: "
                             "expected one of each per virtual rank (>= 1)")
        if any(not c >= 0 for c in compute_s):
            raise ValueError(f"compute_s={list(compute_s)!r} is invalid: expected numbers >= 0")
        merges = list(merge_cpu_s) if merge_cpu_s is not None else [self._merge_charge_s(s) for s in stats]
        models = [self.network.steps_time_s(_steps_of(s)) for s in stats]
        durations = [m + (c if self.include_merge_cpu else 0.0) for m, c in zip(models, merges)]
        typical = 0.0
        if self.include_compress_cpu:
            compress = [_compress_cpu_s(s) for s in stats]
            chosen = [c for c in compress if c > 0]
            typical = statistics.median(chosen) if chosen else 0.0
            durations = [d + (typical if c > 0 else 0.0) for d, c in zip(durations, compress)]
        self.last_compress_cpu_s = typical
        self.total_compress_cpu_s += typical
        max_compute = max(compute_s)
        max_duration = max(durations)
        self._record(max_compute, 0.0, max(models), max(models), 0.0, 0.0, max(merges))
        self.last_comm_charge_s = max_duration
        self._time_s += max_compute + max_duration
        self.mark()
        return self._time_s
