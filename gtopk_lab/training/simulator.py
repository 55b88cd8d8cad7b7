"""Single-process simulator: P virtual workers through the same code paths as ``train_rank``.

``simulate(config, sink=None) -> RankResult`` runs ``config.workers`` virtual ranks (32,
64, 256 ... on one laptop) one after the other in one process. Epochs, evaluation,
checkpoints and resume are :func:`~gtopk_lab.training.skeleton.run_iterations`, the skeleton
``train_rank`` runs too; per iteration:

1. for each virtual rank r (its RNG state and BatchNorm buffers, and a local-steps method's
   own weights, swapped into the shared replica): forward/backward on r's shard, then
   :meth:`~gtopk_lab.training.step.RankStep.begin` (clipping, momentum correction, error
   feedback, selection) -- the step ``train_rank`` runs, built from the same
   :class:`~gtopk_lab.training.step_settings.StepSettings`; rank r's CPU time for this is
   measured with ``time.process_time`` (wall time on CUDA). A local-steps method takes its
   inner step here and synchronises on the last iteration of a round only.
   **Batched** (``config.simulator.batched``: "auto", the default, where
   :func:`~gtopk_lab.training.batched_ranks.batched_refusal` allows it and P > 1; "on"; "off"): the P
   forward/backward passes are one vmapped call
   (:class:`~gtopk_lab.training.batched_ranks.BatchedGradients`) on the P shards' batches,
   then, where :func:`~gtopk_lab.training.batched_step.batched_step_refusal` allows, the P
   ``begin`` s are one :class:`~gtopk_lab.training.batched_step.BatchedSteps` (``[P, d]``
   error feedback and top-k; step 4's memory updates too), else each row goes through its
   rank's own ``begin``. Each rank is charged rank 0's own forward/backward, timed beside the
   batched call at the first 4 iterations and every 8th after, the median of the last 8
   (summary ``compute_s_attribution`` "one_rank_call": the batched call / P pays autograd's
   and the kernels' per-call overhead once for P ranks, a third of a real rank's pass on
   the MNIST-1D CNN at P = 4); a batched sparse step is
   charged per rank as rank 0's own compensation and selection call, timed beside it
   (``selection_s_attribution`` "one_rank_call": a row of the batched top-k shares the
   per-call overhead a real rank pays whole); else "per_rank", or "fixed" with a fixed or
   calibrated compute time; ``batched_ranks`` /
   ``batched_steps`` say whether they ran, ``batched_ranks_refusal`` /
   ``batched_steps_refusal`` why not, ``batched_gradients`` how ("layers" or "vmap";
   ``batched_gradients_refusal``: why not "layers")
2. the method's in-process collective (``Collective.simulate``: the per-rank message programs
   without transport, gTop-k's merges each made once; identical ``CommStats``)
3. ``VirtualClock.simulate_collective(compute_s, stats)``: virtual time advances by the
   slowest rank's *charged* compute plus the slowest rank's modelled communication. The
   charge follows ``config.simulator.compute``
   (:mod:`~gtopk_lab.training.compute_charge`): by default every rank is charged the median
   of the P measurements (one process on a shared machine is no cluster of stragglers);
   ``"straggler"`` draws each rank's charge from the run's measured distribution, ``"max"``
   charges each its own measurement. The summary names the rule (``compute_charge``) and
   the measurements' spread (``compute_s_spread``: p10/p50/p90 seconds)
4. each rank's ``Sync.finish`` (memory update, DGC masking, the memory's aggregate, the
   clip), giving the update ``G / P``, then one optimiser step of the shared replica with
   rank 0's update (in synchronous SGD every rank holds the same weights; a local-steps
   method's finish is every rank's own outer step instead). The clock is charged what one
   real rank pays: rank 0's finish (batched: 1/P of the P memory updates, and rank 0's
   aggregate) and the optimiser step; the other ranks' finishes cost no virtual time

Steps 1, 2 and 4 are the driver's three seams
(:meth:`~gtopk_lab.training.virtual_ranks.VirtualRanks.iteration`): P gradients and
P contributions, one ``Collective.simulate`` call, P finishes.

**Fixed compute time** (``compute_time_s=`` / ``config.compute_charge.compute_time_s``, optionally
``selection_time_s=`` / ``.selection_time_s``): on a loaded machine one rank's measured
forward/backward varies 3-5x, and step 3 takes the slowest of P, so measured virtual time
drifts up with P for reasons unrelated to the method. Fixed, every rank is charged exactly
``compute_time_s`` (forward + backward + optimiser step of one batch, e.g. the median measured
once at P=1 by :func:`~gtopk_lab.training.compute_time.measure_iteration_times`) plus, on each
rank that selected (every rank of a sparse method, CLT-k's leader), ``selection_time_s`` or else
the median over the selecting ranks of that iteration's measured selection CPU time; the update
is not added. Virtual time per iteration is then
``compute_time_s + selection + max_i steps_time_s(stats_i)``, reproducible. Rows report the
charged ``compute_s`` / ``selection_s``; the summary says ``compute_time_source: "fixed"``
(else ``"measured"``) with ``fixed_compute_time_s`` / ``fixed_selection_time_s``.

Only one model exists, so memory is one replica plus, per virtual rank, a residual and
(with momentum correction) a velocity of d floats: P * d * 4 bytes each.

Rows: ``train_rank``'s schema; ``iter`` rows of every virtual rank when P <= 32, of rank 0
above (``rows="all"`` / ``"rank0"`` or ``config.simulator.rows``; rank 0's alone add
``comm_peak_rounds`` / ``comm_peak_wire_bytes``, any rank's largest collective, for
:mod:`~gtopk_lab.analysis.reprice`). ``comm_s`` is the *modelled* communication time,
``compute_s`` / ``selection_s`` the rank's own (or charged) wall times, ``update_s`` the shared
step's, ``wall_time_s`` the simulator's elapsed time. The summary is rank 0's plus ``simulated: True``.

Result: to float tolerance the same weights as a real P-rank gloo run of the same config
(tests/test_simulator.py checks dense, topk and gtopk at P=4).

**Checkpoints** (``checkpoint_dir`` with ``config.checkpoint``; ``resume_from``): at the end
of every epoch the simulator writes the files a real run writes
(:mod:`gtopk_lab.training.checkpoint`): one per virtual rank (the shared weights and
optimiser state with that rank's BN buffers, residual, velocity, RNG state), then
``latest.json``. So a simulated run resumes as a simulated or a real run of the same
config and P, and the other way round. Cost: P ``torch.save`` calls per epoch, each about
(2-4) x model size.

Example::

    result = simulate(RunConfig(method="gtopk", workers=64, model="resnet20",
                                dataset="synthetic", bandwidth="1GbE", max_iterations=5))
    result.summary["samples_per_s_virtual"]
"""

from __future__ import annotations

import gc
import math
import time

import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.network.clock import VirtualClock
from gtopk_lab.training.batched_step import batched_summary
from gtopk_lab.training.compute_charge import (
    clock_compress_option, clock_merge_options, compute_time_fields, fixed_times,
)
from gtopk_lab.training.rank_state import RankResult
from gtopk_lab.training.replica import Replica
from gtopk_lab.training.rows import RowBuffer, Sink, build_summary
from gtopk_lab.training.runtime import network_of, resolve_device, run_dataset
from gtopk_lab.training.skeleton import run_iterations
from gtopk_lab.training.state_size import state_bytes_per_parameter
from gtopk_lab.training.step_settings import StepSettings
from gtopk_lab.training.virtual_ranks import VirtualRanks

__all__ = ["simulate", "ALL_ROWS_MAX_WORKERS"]

#: Up to this many virtual ranks every rank's ``iter`` rows are emitted by default.
ALL_ROWS_MAX_WORKERS = 32


def simulate(config: RunConfig, sink: Sink | None = None, device: torch.device | str | None = None,
             rows: str | None = None, compute_time_s: float | None = None,
             selection_time_s: float | None = None, *, checkpoint_dir: str | None = None,
             resume_from: str | None = None) -> RankResult:
    """Run ``config.workers`` virtual ranks in this process; see the module docstring.

    ``rows``: "all" (iter rows of every virtual rank), "rank0", or None (all when
    P <= :data:`ALL_ROWS_MAX_WORKERS`). ``compute_time_s`` / ``selection_time_s`` (default:
    ``config.compute_charge.compute_time_s`` / ``.selection_time_s``, else None = measure):
    fixed per-rank times charged to the virtual clock instead of measured CPU time (see
    "Fixed compute time" in the module docstring); ``selection_time_s`` needs
    ``compute_time_s``. Cost per iteration: P forward/backward passes and selections, the
    in-process collective, one optimiser step (the same work whether or not times are fixed:
    the gradients and selections are real, only the clock's charge changes).

    ``checkpoint_dir`` (used when ``config.checkpoint``) and ``resume_from`` work as in
    :func:`~gtopk_lab.training.loop.train_rank`: epoch checkpoints of every virtual rank, and
    a resume from the newest complete one (``ValueError`` if it has another P; none there:
    from iteration 0). Rows of a resumed run start at the checkpoint's iteration.
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"config has type {type(config).__name__}: expected RunConfig")
    fixed_compute_s, fixed_selection_s = fixed_times(config.compute_charge, compute_time_s, selection_time_s)
    rows = rows or config.simulator.rows
    if rows is None:
        rows = "all" if config.workers <= ALL_ROWS_MAX_WORKERS else "rank0"
    if rows not in ("all", "rank0"):
        raise ValueError(f"rows={rows!r} is invalid: expected 'all', 'rank0' or None")
    world = config.workers
    dev = resolve_device(config, device)
    setup_start = time.perf_counter()
    dataset = run_dataset(config)
    replica = Replica(config, world, dev)
    settings = StepSettings.from_config(config, world)
    settings.check_driver("simulator")
    # Fixed compute removes CPU noise from virtual time; charging measured merges would
    # bring it back, so merges count only when compute is measured too, or from a calibrated gamma.
    clock = VirtualClock(network_of(config), throttle=False,
                         **clock_merge_options(config.virtual_merge_cpu, config.compute_charge, fixed_compute_s),
                         **clock_compress_option(settings.method.compresses, fixed_selection_s))
    buffer = RowBuffer(sink, config.sink_every)
    ranks = VirtualRanks(config, settings, dev, dataset, replica, clock, buffer,
                         emit=range(world) if rows == "all" else range(1),
                         fixed_compute_s=fixed_compute_s, fixed_selection_s=fixed_selection_s)
    # The setup's objects (the dataset, every rank's step and memory) live for the whole run;
    # frozen, the collector's full passes skip them. An iteration at P = 1024 makes ~34k objects
    # that survive into the old generation until the next, and each full pass traversed the
    # setup's as well: 38 ms of 110 an iteration (benchmarks/RESULTS.md, the simulator). The
    # first iteration imports and builds more (kernels, modules: ~40k objects), frozen after
    # it. A process that froze objects itself keeps its own choice.
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
        ranks.after_first_iteration = gc.freeze
    try:
        timeline = run_iterations(config, ranks, numel=replica.numel, world=world,
                                  iterations_per_epoch=ranks.ipe, clock=clock,
                                  checkpoint_dir=checkpoint_dir, resume_from=resume_from)
        rank0_rows = [r for r in buffer.rows if r["rank"] == 0]
        summary = build_summary(config, rank0_rows, numel=replica.numel, world=world, layout=replica.layout,
                                iterations=timeline.total, iterations_per_epoch=ranks.ipe,
                                train_wall_s=timeline.train_wall_s, wall_time_s=timeline.wall_time_s,
                                virtual_time_s=clock.synced_time_s,
                                extra={"rank": 0, "device": str(dev), "simulated": True,
                                       "setup_wall_s": timeline.started_at - setup_start,
                                       "merge_cpu_s": clock.total_merge_cpu_s,
                                       "compress_cpu_s": clock.total_compress_cpu_s,
                                       "virtual_merge_cpu": clock.include_merge_cpu,
                                       # per iteration this call ran (a resumed run's clock
                                       # totals start at its checkpoint)
                                       "compute_s_virtual": (clock.total_compute_s / max(
                                           timeline.total - timeline.start_iteration, 1)),
                                       **compute_time_fields(config.compute_charge, fixed_compute_s,
                                                             fixed_selection_s),
                                       "state_bytes_per_param": state_bytes_per_parameter(
                                           ranks.states[0].step, replica.numel),
                                       "compute_charge": (None if fixed_compute_s is not None
                                                          else ranks.charge.rule),
                                       "compute_s_spread": ranks.charge.spread(),
                                       **batched_summary(ranks.batched is not None, ranks.batched_refusal,
                                                         ranks.steps_refusal, fixed=fixed_compute_s is not None,
                                                         how=ranks.batched.how() if ranks.batched else None),
                                       **ranks.states[0].step.describe()})
        # In a simulation wall throughput is the simulator's own speed, not the cluster's.
        summary["samples_per_s_wall"] = math.nan if world > 1 else summary["samples_per_s_wall"]
        weights = replica.flat_weights().cpu() if config.output.return_weights else None
        return RankResult(rows=buffer.rows, summary=summary, final_weights=weights)
    finally:
        try:
            buffer.flush()
        finally:
            if freeze:
                gc.unfreeze()
