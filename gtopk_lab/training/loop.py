"""The per-rank S-SGD training loop: ``train_rank(config, sink, device) -> RankResult``.

One iteration on rank i of P (docs/architecture.md, "Data flow of one iteration"); the loop
computes the gradient, runs the collective and writes the update, the rank's
:class:`~gtopk_lab.training.step.RankStep` (built from the run's
:class:`~gtopk_lab.training.step_settings.StepSettings`) does the rest:

1. forward + backward on the rank's shard; every parameter's ``.grad`` is a view into
   one model-sized flat buffer, so the gradient ``g`` is that buffer (no copy); a
   local-steps method takes its inner optimiser step here (``RankStep.local_step``)
2. ``RankStep.begin(g, k, it)``: the step's clip, DGC velocity, compensation and selection,
   giving this rank's contribution and ``CommCall`` (None when the iteration does not
   synchronise: a local-steps method between synchronisations)
3. the method's collective (``Collective.run`` on the process group), wrapped by the
   :class:`VirtualClock` (virtual time, throttling)
4. ``Sync.finish(result)``: memory update, DGC masking, the memory's aggregate, the
   aggregated clip, giving the update ``G / P`` (a local-steps method's outer step happens
   here instead), which :meth:`~gtopk_lab.training.replica.Replica.apply` writes into the
   flat gradient buffer before the optimiser steps (momentum / weight decay as configured, LR
   from :func:`~gtopk_lab.training.optim.lr_at`)
5. one metric row (docs/architecture.md schema), flushed to ``sink`` every ``sink_every``

Costs per iteration: one forward/backward, O(d) for flattening-free error feedback and
update, the selector's cost, and the collective's (see gtopk_lab.comm).
Timings are wall-clock (``perf_counter``; CUDA is synchronised before each reading).

The process group: ``train_rank`` uses the default group when one is initialised
(any world size, also 1); without one it runs as the only rank (P must then be 1), using
the method's in-process collective so that stats match.

Evaluation (every ``eval_every_epochs`` and at the end) runs on rank 0 only, on the full
test split, outside the virtual clock; other ranks emit their epoch rows with NaN test
metrics. Epoch ``train_loss`` is the mean over all ranks of their epoch-mean losses.

Seeding: every rank seeds torch with ``config.seed`` before building the model
(identical initial weights), then with ``config.seed + rank`` for dropout; data order is
seeded in :class:`~gtopk_lab.training.data.Shard`. On CPU the same config gives the same
metrics (timings aside).

Example::

    # torchrun --nproc-per-node 4 -m gtopk_lab.training.torchrun --method gtopk --density 0.01
    result = train_rank(RunConfig(method="gtopk", workers=4))
    result.summary["final_test_accuracy"]
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from gtopk_lab.comm.transport_choice import links_max_reduce, transport_used
from gtopk_lab.config import RunConfig
from gtopk_lab.network.clock import VirtualClock
from gtopk_lab.training import checkpoint as ckpt
from gtopk_lab.training.compute_charge import (
    charged_selection_s, clock_compress_option, clock_merge_options, compute_time_fields, fixed_times,
)
from gtopk_lab.training.rank_state import RankResult, RankState, rank_checkpoint_state, restore_rank_state
from gtopk_lab.training.replica import Replica
from gtopk_lab.training.rows import RowBuffer, Sink, build_summary, epoch_row, iter_row
from gtopk_lab.training.runtime import (
    limit_threads, network_of, rank_cpu_timer, resolve_device, run_dataset, sync_device,
)
from gtopk_lab.training.skeleton import Boundary, Point, Resumed, Timeline, run_iterations
from gtopk_lab.training.state_size import state_bytes_per_parameter
from gtopk_lab.training.step_settings import StepSettings

__all__ = ["RankResult", "train_rank", "resolve_device", "gloo_rank_entry", "gloo_checkpoint_entry",
           "gloo_runs_entry"]


def _process_group(config: RunConfig) -> tuple[int, int, bool]:
    """(rank, world size, has a process group)."""
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        if world != config.workers:
            raise ValueError(f"workers={config.workers} does not match the process group's world "
                             f"size {world}")
        return dist.get_rank(), world, True
    if config.workers != 1:
        raise ValueError(f"workers={config.workers} needs an initialised torch.distributed process "
                         "group (torchrun, gtopk-lab run, run_gloo); without one only workers=1 runs")
    return 0, 1, False


def _all_mean(value: float, has_group: bool, world: int) -> float:
    if not has_group or world == 1:
        return value
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t) / world



class _RealRank:
    """The :class:`~gtopk_lab.training.skeleton.IterationDriver` of this process's one rank."""

    def __init__(self, config: RunConfig, rank: int, world: int, has_group: bool,
                 dev: torch.device, dataset: Any, replica: Replica, state: RankState,
                 clock: VirtualClock, buffer: RowBuffer, fixed_compute_s: float | None = None,
                 fixed_selection_s: float | None = None) -> None:
        self.config, self.rank, self.world, self.has_group = config, rank, world, has_group
        self.dev, self.dataset, self.replica, self.state = dev, dataset, replica, state
        self.clock, self.buffer = clock, buffer
        #: charged instead of measured (``RunConfig.compute_charge.compute_time_s``), as the simulator does
        self.fixed_compute_s, self.fixed_selection_s = fixed_compute_s, fixed_selection_s
        self.ipe = state.shard.iterations_per_epoch
        self.coordinator = rank == 0

    def iteration(self, point: Point, timeline: Timeline) -> None:
        replica, state, step, dev, clock = self.replica, self.state, self.state.step, self.dev, self.clock
        it, lr, k = point.iteration, point.lr, point.k
        x, y = state.next_batch(point.epoch_index, point.first_of_epoch)
        t0 = time.perf_counter()
        with state.active(replica, swap_buffers=False):  # dropout and a random selector: the rank's RNG
            loss = replica.forward_backward(x, y)
            step.local_step(lr)  # a local-steps method's inner step; nothing otherwise
            sync_device(dev)
            t1 = time.perf_counter()
            c1 = clock.cpu_timer()
            sync = step.begin(replica.grad, k, it)
        result = None
        if sync is not None:
            sync_device(dev)
            t2 = time.perf_counter()
            if self.fixed_compute_s is not None:
                charged_selection_s = self._charge(clock.cpu_timer() - c1, sync.selected)
            if self.has_group:
                result = clock.collective(step.collective.run, sync.contribution, sync.call)
            else:  # the only rank: the in-process collective, so that stats match
                result = clock.collective(lambda: step.collective.simulate([sync.contribution], sync.call)[0])
            sync_device(dev)
            t3 = time.perf_counter()
            update = sync.finish(result)
            if update is not None:  # None: a local-steps method's outer step moved the weights
                replica.apply(update, lr)
        else:
            t2 = t3 = time.perf_counter()
            if self.fixed_compute_s is not None:
                charged_selection_s = self._charge(0.0, False)
        sync_device(dev)
        t4 = time.perf_counter()
        t = {"compute": t1 - t0, "selection": t2 - t1, "comm": t3 - t2, "update": t4 - t3, "clock": 0.0}
        if result is not None and self.has_group:  # the clock's own all_reduce is not the method's
            t["clock"] = min(clock.last_sync_wall_s, t["comm"])
            t["comm"] -= t["clock"]
            t["comm_span"] = clock.last_span_wall_s
        t["comm_charge"] = clock.last_comm_charge_s if result is not None else 0.0
        if self.fixed_compute_s is not None:  # rows report what was charged, as simulated ones do
            t["compute"], t["selection"] = self.fixed_compute_s, charged_selection_s
        state.epoch_loss_sum += loss
        state.epoch_loss_count += 1
        stats = result.stats if result is not None else None
        comm_model_s = clock.last_comm_model_s if result is not None else 0.0
        self.buffer.add(iter_row(self.config, self.rank, self.world, it, point.epoch, point.density,
                                 k, loss, lr, t, stats, comm_model_s, t4 - timeline.wall_start,
                                 clock.virtual_time_s, selected=sync is not None and sync.selected))

    def _charge(self, selection_cpu_s: float, selected: bool) -> float:
        """Charge this iteration's fixed compute plus its selection (:func:`charged_selection_s`
        of this rank's measured CPU time, where the rank ``selected``: every rank of a sparse
        method, CLT-k's leader alone); returns the selection charged."""
        assert self.fixed_compute_s is not None
        selection_s = charged_selection_s(selected, self.fixed_selection_s, selection_cpu_s)
        self.clock.charge(self.fixed_compute_s + selection_s)
        return selection_s

    def end_epoch(self, boundary: Boundary, point: Point, timeline: Timeline) -> None:
        state = self.state
        mean_loss = _all_mean(state.epoch_loss_sum / max(state.epoch_loss_count, 1),
                              self.has_group, self.world)
        state.epoch_loss_sum, state.epoch_loss_count = 0.0, 0
        test = self.replica.evaluate(self.dataset) if (boundary.evaluate and self.rank == 0) else None
        self.buffer.add(epoch_row(self.config, self.rank, self.world, boundary.iteration,
                                  boundary.epochs_done, point.density, point.k, mean_loss, test,
                                  timeline.elapsed_s(), self.clock.virtual_time_s),
                        count_iteration=False)

    def save(self, checkpoint_dir: str, epoch: int, iteration: int, timeline: Timeline) -> None:
        ckpt.save_rank_rows(checkpoint_dir, epoch, self.rank, self.buffer.since_checkpoint())
        ckpt.save_rank_state(checkpoint_dir, epoch, self.rank, rank_checkpoint_state(
            self.replica, self.state, virtual_time_s=self.clock.virtual_time_s, iteration=iteration,
            epoch=epoch, wall_time_s=timeline.elapsed_s(), eval_wall_s=timeline.eval_wall_s))

    def barrier(self) -> None:
        if self.has_group:
            dist.barrier()

    def restore(self, resume_from: str, epoch: int) -> Resumed:
        saved = ckpt.load_rank_state(resume_from, epoch, self.rank)
        restore_rank_state(saved, self.replica, self.state)
        return Resumed(iteration=int(saved["iteration"]), virtual_time_s=float(saved["virtual_time_s"]),
                       wall_time_s=float(saved["wall_time_s"]), eval_wall_s=float(saved["eval_wall_s"]))


def train_rank(config: RunConfig, sink: Sink | None = None,
               device: torch.device | None = None, *, checkpoint_dir: str | None = None,
               resume_from: str | None = None) -> RankResult:
    """Train this rank of ``config`` (see the module docstring for one iteration).

    Requires an initialised default process group of ``config.workers`` ranks, except for
    ``workers=1``, which also runs without one. Rows go to ``sink(rows)`` every
    ``config.sink_every`` iterations and at the end; exceptions propagate (after the
    rows produced so far were flushed). Epochs, evaluation, checkpoints and resume are
    :func:`~gtopk_lab.training.skeleton.run_iterations`, shared with the simulator.

    Checkpoints (:mod:`gtopk_lab.training.checkpoint`): with ``config.checkpoint`` and a
    ``checkpoint_dir``, every rank saves its state at the end of every epoch, then (after
    a barrier) rank 0 writes ``latest.json``. ``resume_from`` (a checkpoint folder) loads
    the newest complete checkpoint, if any, and continues from the next epoch: on CPU
    the final weights equal those of an uninterrupted run. Rows and the summary's
    per-iteration means then cover only the resumed part; ``iterations`` is the total.
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"config has type {type(config).__name__}: expected RunConfig")
    rank, world, has_group = _process_group(config)
    dev = resolve_device(config, device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    limit_threads(int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    setup_start = time.perf_counter()

    dataset = run_dataset(config)
    replica = Replica(config, world, dev)
    settings = StepSettings.from_config(config, world)
    settings.check_driver("ranks")
    state = RankState(settings, config, rank, replica, dataset)
    if dev.type == "cuda":  # CUDA dropout masks differ between ranks, as on CPU
        torch.cuda.manual_seed(config.seed + 1 + rank)
    fixed_compute_s, fixed_selection_s = fixed_times(config.compute_charge)
    # as in the simulator: merges measured only with measured compute, else from a calibrated gamma
    clock = VirtualClock(network_of(config), throttle=config.throttle,
                         cpu_timer=rank_cpu_timer(dev), charged_compute=fixed_compute_s is not None,
                         max_reduce=links_max_reduce() if has_group and dev.type == "cpu" else None,
                         **clock_merge_options(config.virtual_merge_cpu, config.compute_charge, fixed_compute_s),
                         **clock_compress_option(state.step.method.compresses, fixed_selection_s))
    buffer = RowBuffer(sink, config.sink_every)
    ranks = _RealRank(config, rank, world, has_group, dev, dataset, replica, state, clock, buffer,
                      fixed_compute_s, fixed_selection_s)
    try:
        # Wall time counts training from run_iterations on: building the dataset and the
        # replica (seconds for MNIST-1D on a fresh worker) is reported as setup_wall_s, so a
        # short run's throughput does not depend on whether its worker was fresh.
        timeline = run_iterations(config, ranks, numel=replica.numel, world=world,
                                  iterations_per_epoch=ranks.ipe, clock=clock,
                                  checkpoint_dir=checkpoint_dir, resume_from=resume_from,
                                  on_start=clock.mark)
        summary = build_summary(config, buffer.rows, numel=replica.numel, world=world, layout=replica.layout,
                                iterations=timeline.total, iterations_per_epoch=ranks.ipe,
                                train_wall_s=timeline.train_wall_s, wall_time_s=timeline.wall_time_s,
                                virtual_time_s=clock.virtual_time_s,
                                extra={"rank": rank, "device": str(dev),
                                       # what carried the messages: shm between ranks on one
                                       # host, gloo / nccl between hosts (testbed hosts too)
                                       "transport": transport_used() if has_group else "none",
                                       "merge_cpu_s": clock.total_merge_cpu_s,
                                       "compress_cpu_s": clock.total_compress_cpu_s,
                                       "virtual_merge_cpu": clock.include_merge_cpu,
                                       "setup_wall_s": timeline.started_at - setup_start,
                                       **compute_time_fields(config.compute_charge, fixed_compute_s,
                                                             fixed_selection_s),
                                       "state_bytes_per_param": state_bytes_per_parameter(
                                           state.step, replica.numel),
                                       **state.step.describe()})
        weights = replica.flat_weights().cpu() if config.output.return_weights else None
        return RankResult(rows=buffer.rows, summary=summary, final_weights=weights)
    finally:  # rows produced before an exception still reach the sink
        buffer.flush()


def gloo_rank_entry(rank: int, world_size: int, config_dict: dict[str, Any]) -> RankResult:
    """``run_gloo`` target: ``train_rank`` of ``RunConfig.from_dict(config_dict)`` on this rank.

    Example::

        from gtopk_lab.comm.launch import run_gloo
        results = run_gloo(gloo_rank_entry, 4, cfg.to_dict(), timeout_s=120)
    """
    return train_rank(RunConfig.from_dict(config_dict))


def gloo_checkpoint_entry(rank: int, world_size: int, config_dict: dict[str, Any],
                          checkpoint_dir: str | None, resume_from: str | None) -> RankResult:
    """``run_gloo`` target like :func:`gloo_rank_entry`, with checkpoint / resume folders."""
    return train_rank(RunConfig.from_dict(config_dict), checkpoint_dir=checkpoint_dir,
                      resume_from=resume_from)


def gloo_runs_entry(rank: int, world_size: int, config_dicts: list[dict[str, Any]]) -> list[RankResult]:
    """``run_gloo`` target training several configs one after the other in the same process
    group (each from its own seed, as separate runs would): one process start for many runs,
    e.g. a test that compares several methods' real and simulated results."""
    return [train_rank(RunConfig.from_dict(d)) for d in config_dicts]
