"""The iteration skeleton of a run, written once for real ranks and for the simulator.

``run_iterations(config, ranks, ...)`` walks a run from its first (or resumed) iteration to
its last; what happens *inside* an iteration belongs to ``ranks``, an
:class:`IterationDriver`: :func:`~gtopk_lab.training.loop.train_rank` drives this process's
one rank, :func:`~gtopk_lab.training.simulator.simulate` drives P virtual ranks. Per run:

1. total iterations ``T = epochs * ipe`` (capped by ``max_iterations``); wall time counts
   from here (set-up is reported apart as ``setup_wall_s``)
2. with ``resume_from``: the newest complete checkpoint of this P, if any
   (:func:`~gtopk_lab.training.checkpoint.resume_point`); the driver restores its ranks and
   the run continues at the checkpoint's iteration, its wall and evaluation times carried on
3. for every iteration ``it``: the schedule's :class:`Point` (learning rate and density of
   ``progress = it / ipe``, k of that density) goes to ``ranks.iteration``
4. after the last iteration of an epoch, and after iteration T: a :class:`Boundary`
   (evaluate at the end and every ``eval_every_epochs`` epochs) goes to
   ``ranks.end_epoch``, with the virtual clock paused, its wall time counted as
   evaluation time (excluded from throughput)
5. at epoch ends with ``config.checkpoint`` and a ``checkpoint_dir``: ``ranks.save``
   writes this process's ranks, then (after ``ranks.barrier()``) the coordinator writes
   ``latest.json`` and prunes older epochs, so a checkpoint is complete or invisible

Cost: O(T) driver calls plus one evaluation per evaluated epoch boundary; checkpoints cost
what the driver's saves cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from gtopk_lab.config import RunConfig, k_for
from gtopk_lab.network.clock import VirtualClock
from gtopk_lab.training import checkpoint as ckpt
from gtopk_lab.training.optim import density_at, lr_at

__all__ = ["Point", "Boundary", "Timeline", "Resumed", "IterationDriver", "total_iterations",
           "run_iterations"]


@dataclass(frozen=True)
class Point:
    """Where iteration ``iteration`` stands in the schedule."""

    iteration: int
    epoch_index: int
    first_of_epoch: bool
    epoch: float  # epochs done after this iteration, (iteration + 1) / ipe
    lr: float
    density: float
    k: int


@dataclass(frozen=True)
class Boundary:
    """An epoch end (or the run's end) after ``iteration`` iterations in total."""

    iteration: int
    epochs_done: float
    end_of_epoch: bool
    evaluate: bool


@dataclass(frozen=True)
class Resumed:
    """What a driver read back from a checkpoint (the coordinator rank's view)."""

    iteration: int
    virtual_time_s: float
    wall_time_s: float
    eval_wall_s: float


@dataclass
class Timeline:
    """Wall-clock bookkeeping of one run (seconds)."""

    total: int
    wall_start: float  # moved back by a resumed run's earlier wall time
    started_at: float  # when training began in this process (set-up ends here)
    start_iteration: int = 0
    eval_wall_s: float = 0.0
    wall_time_s: float = 0.0

    def elapsed_s(self) -> float:
        """Training wall time so far (including a resumed run's earlier part)."""
        return time.perf_counter() - self.wall_start

    @property
    def train_wall_s(self) -> float:
        return self.wall_time_s - self.eval_wall_s


class IterationDriver(Protocol):
    """The ranks a run drives: one real rank, or P virtual ranks in one process."""

    #: writes ``latest.json`` after a checkpoint (rank 0 of a real run; the simulator)
    coordinator: bool

    def iteration(self, point: Point, timeline: Timeline) -> None:
        """One training iteration of every rank this driver holds, its ``iter`` rows."""

    def end_epoch(self, boundary: Boundary, point: Point, timeline: Timeline) -> None:
        """Epoch-mean loss over all ranks, evaluation when due, the ``epoch`` rows."""

    def save(self, checkpoint_dir: str, epoch: int, iteration: int, timeline: Timeline) -> None:
        """Every held rank's checkpoint state for ``epoch``."""

    def barrier(self) -> None:
        """Wait until every rank of the run has saved (a no-op in one process)."""

    def restore(self, resume_from: str, epoch: int) -> Resumed:
        """Load every held rank's state of ``epoch``."""


def total_iterations(config: RunConfig, iterations_per_epoch: int) -> int:
    """``epochs * ipe``, capped by ``max_iterations``."""
    total = config.epochs * iterations_per_epoch
    return total if config.max_iterations is None else min(config.max_iterations, total)


def run_iterations(config: RunConfig, ranks: IterationDriver, *, numel: int, world: int,
                   iterations_per_epoch: int, clock: VirtualClock,
                   checkpoint_dir: str | None = None, resume_from: str | None = None,
                   on_start: Any = None) -> Timeline:
    """Steps 1-5 of the module docstring; returns the run's :class:`Timeline`.

    ``clock`` is the run's virtual clock: it advances by ``resume_from``'s saved virtual
    time and is paused around epoch ends and checkpoints. ``on_start`` (optional callable)
    runs right before the first iteration (real ranks forget their set-up CPU time there).
    """
    ipe = iterations_per_epoch
    now = time.perf_counter()
    timeline = Timeline(total=total_iterations(config, ipe), wall_start=now, started_at=now)
    if resume_from is not None:
        latest = ckpt.resume_point(resume_from, world)
        if latest is not None:
            resumed = ranks.restore(resume_from, latest["epoch"])
            clock.advance(resumed.virtual_time_s)
            timeline.start_iteration = resumed.iteration
            timeline.wall_start -= resumed.wall_time_s
            timeline.eval_wall_s = resumed.eval_wall_s
    save_checkpoints = bool(config.checkpoint) and checkpoint_dir is not None
    if on_start is not None:
        on_start()
    for it in range(timeline.start_iteration, timeline.total):
        epoch_index, pos = divmod(it, ipe)
        progress = it / ipe
        density = density_at(config, progress)
        point = Point(iteration=it, epoch_index=epoch_index, first_of_epoch=pos == 0,
                      epoch=(it + 1) / ipe, lr=lr_at(config, progress, world), density=density,
                      k=k_for(numel, density))
        ranks.iteration(point, timeline)
        end_of_epoch = (it + 1) % ipe == 0
        if not (end_of_epoch or it + 1 == timeline.total):
            continue
        epochs_done = (it + 1) / ipe
        boundary = Boundary(iteration=it + 1, epochs_done=epochs_done, end_of_epoch=end_of_epoch,
                            evaluate=(it + 1 == timeline.total) or (
                                end_of_epoch and round(epochs_done) % config.eval_every_epochs == 0))
        e0 = time.perf_counter()
        with clock.paused():
            ranks.end_epoch(boundary, point, timeline)
        timeline.eval_wall_s += time.perf_counter() - e0
        if save_checkpoints and end_of_epoch:
            assert checkpoint_dir is not None
            done = (it + 1) // ipe
            with clock.paused():
                ranks.save(checkpoint_dir, done, it + 1, timeline)
                ranks.barrier()
                if ranks.coordinator:
                    ckpt.write_latest(checkpoint_dir, done, it + 1, world)
                    ckpt.prune_older(checkpoint_dir, done)
    timeline.wall_time_s = timeline.elapsed_s()
    return timeline
