"""``VirtualRanks``: the simulator's P virtual ranks, one iteration at a time.

The :class:`~gtopk_lab.training.skeleton.IterationDriver` that
:func:`~gtopk_lab.training.simulator.simulate` hands to
:func:`~gtopk_lab.training.skeleton.run_iterations`: per iteration, steps 1-4 of
:mod:`~gtopk_lab.training.simulator`'s docstring (P gradients and contributions, one
``Collective.simulate`` call, P finishes and rank 0's update written into the shared
replica, the clock charged what one real rank pays), and the epoch rows, checkpoints and
resume of every virtual rank.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.network.clock import VirtualClock
from gtopk_lab.training import checkpoint as ckpt
from gtopk_lab.training.batched_ranks import BatchedGradients, batched_refusal, use_batched
from gtopk_lab.training.batched_step import BatchedRound, BatchedSteps, batched_step_refusal
from gtopk_lab.training.compute_charge import ComputeCharge, charged_selection_s
from gtopk_lab.training.rank_state import RankState, rank_checkpoint_state, restore_rank_state
from gtopk_lab.training.replica import Replica
from gtopk_lab.training.rows import RowBuffer, epoch_row, iter_row, peak_comm_pair
from gtopk_lab.training.runtime import rank_clock_s
from gtopk_lab.training.shards import EpochCursor, StackedShards
from gtopk_lab.training.skeleton import Boundary, Point, Resumed, Timeline
from gtopk_lab.training.step import Sync
from gtopk_lab.training.step_settings import StepSettings

__all__ = ["ONE_RANK_EVERY", "ONE_RANK_WARM", "ONE_RANK_WINDOW", "VirtualRanks"]

#: a batched run times rank 0's own forward/backward at its first ONE_RANK_WARM iterations and
#: every ONE_RANK_EVERY-th after, and charges every rank the median of the last ONE_RANK_WINDOW
#: (:meth:`VirtualRanks._one_rank_compute_s`): an eighth of a pass an iteration (the MNIST-1D
#: CNN at P = 64: a pass 1.3 ms, a batched iteration 12 ms)
ONE_RANK_WARM = 4
ONE_RANK_EVERY = 8
ONE_RANK_WINDOW = 8


class _RankWork(NamedTuple):
    """One virtual rank's part of phase 1: its loss, its synchronisation waiting for the
    collective (None when the iteration does not synchronise), the CPU seconds of its
    forward/backward and contribution (of which ``selection_cpu_s`` the contribution), the
    wall seconds of the two (``wall_s``: compute, selection), and whether it ``selected``
    (every rank of a sparse method, CLT-k's leader alone, none between synchronisations)."""

    loss: float
    sync: Sync | None
    compute_cpu_s: float
    selection_cpu_s: float
    wall_s: tuple[float, float]
    selected: bool


class VirtualRanks:
    """The :class:`~gtopk_lab.training.skeleton.IterationDriver` of P virtual ranks
    (steps 1-4 of :mod:`~gtopk_lab.training.simulator`'s docstring per iteration).

    One iteration is three phases with one seam each (:meth:`iteration`): P gradients and P
    contributions (:meth:`_contribute`, one rank at a time in the shared replica, or
    :meth:`_contribute_batched`, the P gradients in one call), one
    ``Collective.simulate`` call over all P contributions, P finishes (:meth:`_finish`) and
    the write of rank 0's update into the shared replica.
    """

    coordinator = True

    def __init__(self, config: RunConfig, settings: StepSettings, dev: torch.device, dataset: Any,
                 replica: Replica, clock: VirtualClock, buffer: RowBuffer, *, emit: range,
                 fixed_compute_s: float | None, fixed_selection_s: float | None) -> None:
        self.config, self.dev, self.dataset = config, dev, dataset
        self.replica, self.clock, self.buffer, self.emit = replica, clock, buffer, emit
        self.fixed_compute_s, self.fixed_selection_s = fixed_compute_s, fixed_selection_s
        self.world = settings.world
        self.states = [RankState(settings, config, r, replica, dataset, shares_replica=True)
                       for r in range(self.world)]
        self.collective = self.states[0].step.collective
        self.swap_buffers = len(self.states[0].buffers) > 0
        self.ipe = self.states[0].shard.iterations_per_epoch
        self.charge = ComputeCharge(config.simulator.compute, config.seed)
        self.batched_refusal = batched_refusal(settings, replica.model)
        slower = replica.spec.batched_slower
        batched = use_batched(config.simulator.batched, self.batched_refusal, self.world, slower)
        self.batched = BatchedGradients(replica) if batched else None
        # the batched gradients read every rank's batch in one gather, the same samples
        self.stacked = EpochCursor(StackedShards([s.shard for s in self.states])) if batched else None
        if not batched and self.batched_refusal is None and slower is not None:
            self.batched_refusal = f"model {config.model!r}: {slower}"
        self.steps_refusal = (batched_step_refusal(self.states[0].step, dev) if batched
                              else "the gradients are not batched")
        self.steps = BatchedSteps([s.step for s in self.states]) if self.steps_refusal is None else None
        self._one_rank: list[tuple[float, float]] = []  # (CPU, wall) of rank 0's own passes
        #: called once, after the first iteration (the simulator refreezes the collector's
        #: objects there: that iteration imports and builds what the others reuse)
        self.after_first_iteration: Callable[[], None] | None = None

    def _contribute(self, state: RankState, point: Point) -> _RankWork:
        """One rank's gradient and contribution (phase 1), timed."""
        replica, dev = self.replica, self.dev
        x, y = state.next_batch(point.epoch_index, point.first_of_epoch)
        with state.active(replica, self.swap_buffers):
            c0, w0 = rank_clock_s(dev), time.perf_counter()
            loss = replica.forward_backward(x, y)
            state.step.local_step(point.lr)  # a local-steps method's inner step; nothing otherwise
            c_mid, w1 = rank_clock_s(dev), time.perf_counter()
            # the next rank's backward reuses the gradient buffer: shared_buffer
            sync = state.step.begin(replica.grad, point.k, point.iteration, shared_buffer=True)
            c1, w2 = rank_clock_s(dev), time.perf_counter()
        return _RankWork(loss, sync, c1 - c0, c1 - c_mid, (w1 - w0, w2 - w1), sync is not None and sync.selected)

    def _contribute_batched(self, point: Point) -> tuple[list[_RankWork], BatchedRound | None]:
        """Phase 1 with the P gradients from one batched call, each rank charged rank 0's own
        forward/backward (:meth:`_one_rank_compute_s`), then the P contributions: one batched
        step (each rank charged rank 0's own selection call), or each rank's own
        (its RNG current, as in :meth:`_contribute`)."""
        states, dev, world = self.states, self.dev, self.world
        assert self.batched is not None and self.stacked is not None
        xs, ys = self.stacked.next_batch(point.epoch_index, point.first_of_epoch)
        self.batched.check(xs, ys)  # once per run, untimed
        compute_cpu_s, compute_wall_s = self._one_rank_compute_s(xs, ys, point.iteration)
        grads, losses = self.batched(xs, ys)
        c1, w1 = rank_clock_s(dev), time.perf_counter()
        if self.steps is not None:
            round_ = self.steps.begin(grads, point.k, point.iteration)
            if round_.indices is not None:
                sel_cpu_s, sel_wall_s = self._one_rank_selection_s(grads[0], point.k)
            else:  # a dense step: its compensation, 1/P of the batched call
                sel_cpu_s, sel_wall_s = (rank_clock_s(dev) - c1) / world, (time.perf_counter() - w1) / world
            return [_RankWork(loss, None, compute_cpu_s + sel_cpu_s, sel_cpu_s, (compute_wall_s, sel_wall_s),
                              round_.indices is not None) for loss in losses.tolist()], round_
        work = []
        for state, g, loss in zip(states, grads, losses.tolist()):
            with state.active(self.replica, swap_buffers=False):
                c1, w1 = rank_clock_s(dev), time.perf_counter()
                sync = state.step.begin(g, point.k, point.iteration)  # rows are not overwritten
                c2, w2 = rank_clock_s(dev), time.perf_counter()
            work.append(_RankWork(loss, sync, compute_cpu_s + (c2 - c1), c2 - c1, (compute_wall_s, w2 - w1),
                                  sync is not None and sync.selected))
        return work, None

    def _one_rank_compute_s(self, xs: Any, ys: Any, iteration: int) -> tuple[float, float]:
        """(CPU, wall) seconds charged to every rank for its forward/backward in a batched
        iteration: rank 0's own pass (``Replica.forward_backward`` on its batch, what the
        sequential path times), made at the first :data:`ONE_RANK_WARM` iterations and every
        :data:`ONE_RANK_EVERY`-th after, the median of the last :data:`ONE_RANK_WINDOW`.

        The batched call / P would charge a virtual rank less than a real one: it pays the
        per-call overhead of autograd and of every kernel once for P ranks (the MNIST-1D CNN,
        batch 32: 0.44 ms a rank at P = 4 and 0.33 at P = 8 against 0.97 for a rank's own
        pass: a simulated sweep read dense's P = 4 efficiency 33%, 28% charged its own pass). The
        extra pass changes no result: batched models have no buffers or dropout, and the
        replica's gradient buffer is not read on the batched path."""
        if self.fixed_compute_s is not None:  # the fixed time is charged: nothing to measure
            return 0.0, 0.0
        if not self._one_rank or iteration < ONE_RANK_WARM or iteration % ONE_RANK_EVERY == 0:
            dev = self.dev
            c0, w0 = rank_clock_s(dev), time.perf_counter()
            self.replica.forward_backward(xs[0], ys[0])
            self._one_rank.append((rank_clock_s(dev) - c0, time.perf_counter() - w0))
            del self._one_rank[:-ONE_RANK_WINDOW]
        return (statistics.median(c for c, _ in self._one_rank),
                statistics.median(w for _, w in self._one_rank))

    def _one_rank_selection_s(self, grad: torch.Tensor, k: int) -> tuple[float, float]:
        """(CPU, wall) seconds of rank 0's compensation and selection made as its own call
        would make them (result discarded): a row of a ``[P, d]`` top-k shares the per-call
        overhead with P - 1 others, which a real rank pays whole (and more of under load),
        so the batched call / P would charge a virtual rank less than a real one."""
        assert self.steps is not None
        step, dev = self.steps.steps[0], self.dev
        c0, w0 = rank_clock_s(dev), time.perf_counter()
        acc = grad + step.memory.residual if step.memory is not None else grad
        step.select(acc, k)
        return rank_clock_s(dev) - c0, time.perf_counter() - w0

    def _finish(self, state: RankState, sync: Sync, result: Any) -> torch.Tensor | None:
        """One rank's end of the synchronisation, with its own weights current (a local-steps
        method's outer step moves them): the update G / P, or None."""
        with state.active(self.replica, swap_buffers=False):
            return sync.finish(result)

    def iteration(self, point: Point, timeline: Timeline) -> None:
        config, replica, dev, clock, states = self.config, self.replica, self.dev, self.clock, self.states
        world, it, lr, k = self.world, point.iteration, point.lr, point.k
        # 1. P gradients, P contributions
        work, round_ = (self._contribute_batched(point) if self.batched is not None
                        else ([self._contribute(state, point) for state in states], None))
        losses = [w.loss for w in work]
        syncs = [w.sync for w in work]
        compute_s = [w.compute_cpu_s for w in work]
        timings = [w.wall_s for w in work]
        selected = [w.selected for w in work]
        chosen = [w.selection_cpu_s for w in work if w.selected]
        if self.fixed_compute_s is not None:
            # Every rank is charged the same compute, and every rank that selected the same
            # selection: the clock then only sees method differences.
            selection_s = charged_selection_s(bool(chosen), self.fixed_selection_s,
                                              statistics.median(chosen) if chosen else 0.0)
            compute_s = [self.fixed_compute_s + (selection_s if s else 0.0) for s in selected]
            timings = [(self.fixed_compute_s, selection_s if s else 0.0) for s in selected]
        elif chosen and not all(selected) and self.charge.rule != "max":
            # Some ranks selected (CLT-k's leader): the charge rule's typical rank would not
            # have, so the rule takes the computes alone and the selecting ranks add theirs.
            base = self.charge.charge([w.compute_cpu_s - w.selection_cpu_s for w in work])
            typical_s = statistics.median(chosen)
            compute_s = [b + (typical_s if s else 0.0) for b, s in zip(base, selected)]
        else:
            compute_s = self.charge.charge(compute_s)
        update_cpu_s = update_wall_s = 0.0
        results: list[Any] = [None] * world
        synced = round_ is not None or syncs[0] is not None  # every rank has the same schedule
        if synced:
            # 2. one collective over all P contributions; one collective state for the group:
            # every real rank would hold the same (rank 0's call carries it)
            contributions, call = ((round_.contributions, round_.call) if round_ is not None
                                   else ([s.contribution for s in syncs], syncs[0].call))
            results = self.collective.simulate(contributions, call)
            clock.simulate_collective(compute_s, [r.stats for r in results])
        if round_ is not None and self.steps is not None:
            # 3. batched: the P memory updates as one (1/P of it charged to rank 0), rank 0's update
            u0, uw0 = rank_clock_s(dev), time.perf_counter()
            self.steps.update_memories(round_, results)
            u1, uw1 = rank_clock_s(dev), time.perf_counter()
            update = self.steps.update(round_, results)
            replica.apply(update, lr)
            update_cpu_s = (u1 - u0) / world + rank_clock_s(dev) - u1
            update_wall_s = (uw1 - uw0) / world + time.perf_counter() - uw1
        elif synced:
            # 3. P finishes, then rank 0's update written. A real rank pays its own finish and
            # optimiser step; the other P - 1 ranks' finishes run here one after the other but
            # cost no virtual time, so the charged update does not grow with P.
            u0, uw0 = rank_clock_s(dev), time.perf_counter()
            update = self._finish(states[0], syncs[0], results[0])
            update_cpu_s, update_wall_s = rank_clock_s(dev) - u0, time.perf_counter() - uw0
            for state, sync, result in zip(states[1:], syncs[1:], results[1:]):
                self._finish(state, sync, result)  # their updates equal rank 0's
            u0, uw0 = rank_clock_s(dev), time.perf_counter()
            if update is not None:  # None: a local-steps method's outer step moved the weights
                replica.apply(update, lr)
            update_cpu_s += rank_clock_s(dev) - u0
            update_wall_s += time.perf_counter() - uw0
        else:
            clock.advance(max(compute_s))
        if self.fixed_compute_s is None and synced:
            clock.advance(update_cpu_s)
        wall_now = timeline.elapsed_s()
        comm_model_s = clock.last_comm_model_s if synced else 0.0
        # rows of some ranks only: the others' largest collective, so repricing still sees it
        peak = None if len(self.emit) == world else (
            peak_comm_pair([r.stats for r in results]) if synced else (0, 0))
        for r in self.emit:
            t = {"compute": timings[r][0], "selection": timings[r][1],
                 "comm": comm_model_s, "update": update_wall_s,
                 "comm_charge": clock.last_comm_charge_s if synced else 0.0}
            stats = results[r].stats if synced else None
            self.buffer.add(iter_row(config, r, world, it, point.epoch, point.density, k, losses[r],
                                     lr, t, stats, comm_model_s, wall_now, clock.synced_time_s,
                                     selected=selected[r], peak=peak),
                            count_iteration=(r == 0))
        for state, loss in zip(states, losses):
            state.epoch_loss_sum += loss
            state.epoch_loss_count += 1
        hook, self.after_first_iteration = self.after_first_iteration, None
        if hook is not None:
            hook()

    def end_epoch(self, boundary: Boundary, point: Point, timeline: Timeline) -> None:
        states = self.states
        mean_loss = sum(s.epoch_loss_sum / max(s.epoch_loss_count, 1) for s in states) / self.world
        for s in states:
            s.epoch_loss_sum, s.epoch_loss_count = 0.0, 0
        test = None
        if boundary.evaluate:
            with states[0].active(self.replica, self.swap_buffers):  # rank 0's BN statistics
                test = self.replica.evaluate(self.dataset)
        for r in self.emit:
            self.buffer.add(epoch_row(self.config, r, self.world, boundary.iteration, boundary.epochs_done,
                                      point.density, point.k, mean_loss, test if r == 0 else None,
                                      timeline.elapsed_s(), self.clock.synced_time_s),
                            count_iteration=False)

    def save(self, checkpoint_dir: str, epoch: int, iteration: int, timeline: Timeline) -> None:
        wall_s = timeline.elapsed_s()
        rows = self.buffer.since_checkpoint()
        for state in self.states:
            ckpt.save_rank_rows(checkpoint_dir, epoch, state.rank, [r for r in rows if r.get("rank") == state.rank])
            with state.active(self.replica, self.swap_buffers):  # this rank's BN buffers
                ckpt.save_rank_state(checkpoint_dir, epoch, state.rank, rank_checkpoint_state(
                    self.replica, state, virtual_time_s=self.clock.synced_time_s, iteration=iteration,
                    epoch=epoch, wall_time_s=wall_s, eval_wall_s=timeline.eval_wall_s))

    def barrier(self) -> None:
        """All virtual ranks live in this process: nothing to wait for."""

    def restore(self, resume_from: str, epoch: int) -> Resumed:
        resumed = None
        for state in self.states:
            saved = ckpt.load_rank_state(resume_from, epoch, state.rank)
            restore_rank_state(saved, self.replica, state)
            if state.rank == 0:
                resumed = Resumed(iteration=int(saved["iteration"]),
                                  virtual_time_s=float(saved["virtual_time_s"]),
                                  wall_time_s=float(saved["wall_time_s"]),
                                  eval_wall_s=float(saved["eval_wall_s"]))
        assert resumed is not None
        return resumed
