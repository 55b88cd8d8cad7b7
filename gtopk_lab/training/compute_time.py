"""Per-rank compute and selection time of a config, measured once (the simulator's fixed
compute time and the predictions' ``compute_s`` come from here)."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from gtopk_lab.config import RunConfig, k_for
from gtopk_lab.training.data import load_dataset
from gtopk_lab.training.replica import Replica
from gtopk_lab.training.runtime import rank_clock_s, resolve_device
from gtopk_lab.training.step import RankStep
from gtopk_lab.training.step_settings import StepSettings

__all__ = ["measure_iteration_times", "calibration_task"]


def measure_iteration_times(config: Any, repeats: int = 7, warmup: int = 2,
                            device: Any = None, threads: int | None = 1) -> dict[str, Any]:
    """One rank's per-iteration compute and selection time, each the median of ``repeats`` passes.

    Compute = forward + backward + optimiser step on one batch of ``config.batch_size`` samples
    of ``config.dataset`` (what one rank does per iteration besides selection and
    communication); selection = the method's own training step before its collective
    (:meth:`~gtopk_lab.training.step.RankStep.prepare`: clip, DGC velocity, the method's memory
    compensating, its selector or the run's ``selector``, at ``k = max(1, floor(density * d))``)
    on the real gradient, plus the part of it the collective makes itself
    (``CommStats.compress_cpu_s`` of the one-rank call: Ok-Topk's threshold selection). After each pass the step's memory is updated as on one rank
    (:meth:`~gtopk_lab.training.step.RankStep.finish` with the one-rank collective, untimed), so
    the residual a selection sees is a trained one. Times are CPU time
    (``replica.rank_clock_s``: the thread's with one torch thread, else the process's; CUDA:
    synchronised wall time), so other jobs on the machine inflate them less than wall time;
    the median discards the slow outliers of a loaded machine. ``warmup`` untimed passes come
    first (allocator, kernel selection).

    ``threads`` torch threads (default 1, as a rank on a shared box and a simulation task run;
    None keeps the caller's setting) during the passes, restored after: with one thread the
    clock is that thread's CPU time, so neither this process's other threads nor idle
    OpenMP workers spinning on an oversubscribed machine (seen: 240 ms for a 3 ms CNN pass at
    load 5 with 2 threads) count.

    Returns ``{"compute_time_s", "selection_time_s", "compute_samples_s",
    "selection_samples_s", "numel", "k", "threads"}``. Cost: ``warmup + repeats`` forward/backward
    passes and as many selections. The weights change (real SGD steps), which is harmless for
    timing.
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"config has type {type(config).__name__}: expected RunConfig")
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r} is invalid: expected an integer >= {low}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads={threads!r} is invalid: expected an integer >= 1 or None")
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _measure(config, repeats, warmup, device)
    finally:
        torch.set_num_threads(previous)


def _measure(config: RunConfig, repeats: int, warmup: int, device: Any) -> dict[str, Any]:
    dev = resolve_device(config, device)
    # whole tens: MNIST-1D makes 10 * floor(n / 10) samples (a batch of 8 got none, 16 got 9)
    train = -(-max(config.batch_size, 1) // 10) * 10
    dataset = load_dataset(config.dataset, model=config.model,
                           train_samples=train, test_samples=10, seed=config.seed,
                           data_dir=config.data_dir,
                           num_classes=(config.model_options.kwargs or {}).get("vocab_size"))
    replica = Replica(config.replace(workers=1), 1, dev)
    x, y = dataset.x_train[:config.batch_size], dataset.y_train[:config.batch_size]
    if len(x) < config.batch_size:
        raise ValueError(f"batch_size={config.batch_size} is invalid for dataset={config.dataset!r}: "
                         f"it gave {len(x)} training samples for one batch")
    k = k_for(replica.numel, config.density)
    # one rank alone: its settings are P = 1, so the one-rank collective closes each pass
    settings = StepSettings.from_config(config, world=1)
    settings.check_driver("calibration")
    step = RankStep(settings, replica.numel, dev, layout=replica.layout, params=replica.params,
                    optimizer=replica.optimizer)

    compute, selection = [], []
    for i in range(warmup + repeats):
        t0 = rank_clock_s(dev)
        replica.forward_backward(x, y)
        replica.optimizer.step()
        t1 = rank_clock_s(dev)
        contribution = step.prepare(replica.grad, k)
        t2 = rank_clock_s(dev)
        result = step.collective.simulate([contribution], step.call(k, i))[0]
        step.finish(contribution, result)
        if i >= warmup:
            compute.append(t1 - t0)
            # with the collective's own compression of this rank's input (Ok-Topk's
            # threshold selection, PowerSGD's projections), timed inside the untimed call
            selection.append(t2 - t1 + result.stats.compress_cpu_s)
    return {"compute_time_s": statistics.median(compute), "selection_time_s": statistics.median(selection),
            "compute_samples_s": compute, "selection_samples_s": selection, "numel": replica.numel,
            "k": k, "threads": torch.get_num_threads()}


def calibration_task(config_dict: dict[str, Any], repeats: int = 7) -> dict[str, Any]:
    """A Dask task: :func:`measure_iteration_times` of ``RunConfig.from_dict(config_dict)`` on
    this worker, as ``{"compute_time_s", "selection_time_s", "host", "threads"}``
    (``gtopk_lab.orchestration.calibration`` submits it)."""
    import socket

    times = measure_iteration_times(RunConfig.from_dict(config_dict), repeats=repeats)
    return {"compute_time_s": times["compute_time_s"], "selection_time_s": times["selection_time_s"],
            "host": socket.gethostname(), "threads": times["threads"]}
