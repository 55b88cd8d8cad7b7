"""Scaling efficiency and the method x P table of the paper.

Scaling efficiency (Shi et al. 2019) of a run on N workers::

    efficiency(N) = throughput(N) / (N * throughput(1))

with throughput in samples per second, measured in *virtual* time (modelled network,
one core per rank; the default, comparable across machines) or *wall* time (this
machine). With the same per-worker batch this equals ``t_iter(1) / t_iter(N)``.

A "run" is anything describing one run: a summary dict (``summary.json``), a
:class:`~gtopk_lab.training.loop.RankResult`, or its metric rows (a list of dicts or a
pandas DataFrame). From a summary the throughput is ``samples_per_s_<time>``; from rows
it is ``workers * batch / t_iter`` with ``t_iter`` the mean cumulative time per ``iter``
row of rank 0 (batch_size taken from ``batch_size``, default 1, which cancels in the ratio
when both runs use the same per-worker batch).

Measured compute on a shared machine is noisy (3-5x between iterations), and the
simulator's virtual clock takes the slowest of P ranks, so efficiencies from measured compute
drift with P. :func:`measure_iteration_times` measures one rank's compute and selection time
once (medians of a few passes at the P=1 batch); passing them to
``simulate(config, compute_time_s=..., selection_time_s=...)`` charges every virtual rank the
same, so efficiencies differ only by communication and selection.

Example::

    eff = scaling_efficiency(simulate(cfg.replace(workers=1)), simulate(cfg.replace(workers=32)))
    table = scaling_table(results)        # rows: method (or model, method); columns: P
    times = measure_iteration_times(cfg)  # {"compute_time_s": ..., "selection_time_s": ...}
    simulate(cfg.replace(workers=32), compute_time_s=times["compute_time_s"],
             selection_time_s=times["selection_time_s"])
"""

from __future__ import annotations

import math
import statistics
import time as _time
from collections.abc import Iterable, Sequence
from typing import Any

TIMES: tuple[str, ...] = ("virtual", "wall")


def _check_time(time: str) -> None:
    if time not in TIMES:
        raise ValueError(f"time={time!r} is invalid: expected one of {', '.join(TIMES)}")


def _as_summary_or_rows(run: Any) -> tuple[dict[str, Any] | None, list[dict[str, Any]] | None]:
    if hasattr(run, "summary") and hasattr(run, "rows"):
        return dict(run.summary), list(run.rows)
    if isinstance(run, dict):
        return run, None
    if hasattr(run, "to_dict") and hasattr(run, "columns"):  # pandas DataFrame of rows
        return None, run.to_dict("records")
    if isinstance(run, Sequence) and not isinstance(run, (str, bytes)):
        return None, list(run)
    raise TypeError(f"run has type {type(run).__name__}: expected a summary dict, a RankResult, "
                    "a list of metric rows or a DataFrame of them")


def workers_of(run: Any) -> int:
    """The run's number of workers P."""
    summary, rows = _as_summary_or_rows(run)
    if summary is not None and summary.get("workers") is not None:
        return int(summary["workers"])
    assert rows is not None
    if not rows:
        raise ValueError("run has no metric rows: cannot tell its workers")
    return int(rows[0]["workers"])


def throughput(run: Any, time: str = "virtual", batch_size: int | None = None) -> float:
    """Samples per second of ``run`` (all workers together), in virtual or wall time."""
    _check_time(time)
    summary, rows = _as_summary_or_rows(run)
    key = f"samples_per_s_{time}"
    if summary is not None and summary.get(key) is not None and not math.isnan(float(summary[key])):
        return float(summary[key])
    if rows is None:
        raise ValueError(f"summary has no usable {key}: expected a number (or pass the run's rows)")
    it_rows = [r for r in rows if r.get("kind") == "iter" and int(r.get("rank", 0)) == 0]
    if not it_rows:
        raise ValueError("run has no iter rows of rank 0: cannot compute its throughput")
    t_iter = float(it_rows[-1][f"{time}_time_s"]) / len(it_rows)
    if not t_iter > 0:
        raise ValueError(f"run's {time}_time_s is {t_iter * len(it_rows)!r}: expected a time > 0")
    batch = batch_size or (summary or {}).get("batch_size") or 1
    return int(it_rows[0]["workers"]) * batch / t_iter


def scaling_efficiency(run_1: Any, run_n: Any, time: str = "virtual") -> float:
    """``throughput(N) / (N * throughput(1))``; ``run_1`` must have workers == 1."""
    _check_time(time)
    p1, pn = workers_of(run_1), workers_of(run_n)
    if p1 != 1:
        raise ValueError(f"run_1 has workers={p1}: expected the single-worker baseline (workers=1)")
    return throughput(run_n, time) / (pn * throughput(run_1, time))


def scaling_table(runs: Iterable[Any], time: str = "virtual", baseline_method: str = "dense",
                  percent: bool = True) -> Any:
    """Method x P table of scaling efficiencies (the paper's Table), as a pandas DataFrame.

    ``runs``: summaries / RankResults, including at least one workers == 1 run per model
    (the baseline: method ``baseline_method`` if present, else the method's own P=1 run).
    The index is ``method`` (or ``(model, method)`` when runs span several models); the
    columns are the worker counts > 1. Values in percent unless ``percent=False``.
    """
    import pandas as pd

    _check_time(time)
    records = []
    for run in runs:
        summary, _ = _as_summary_or_rows(run)
        summary = summary or {}
        records.append({"model": summary.get("model", ""), "method": summary.get("method", ""),
                        "workers": workers_of(run), "throughput": throughput(run, time)})
    if not records:
        raise ValueError("runs is empty: expected summaries of runs at P=1 and P>1")
    frame = pd.DataFrame(records)
    out = []
    for (model, method), group in frame.groupby(["model", "method"], sort=False):
        base = frame[(frame.model == model) & (frame.workers == 1) & (frame.method == baseline_method)]
        if base.empty:
            base = group[group.workers == 1]
        if base.empty:
            raise ValueError(f"no workers=1 baseline for model={model!r}, method={method!r}")
        t1 = float(base.throughput.iloc[0])
        for _, row in group[group.workers > 1].iterrows():
            eff = row.throughput / (row.workers * t1)
            out.append({"model": model, "method": method, "workers": int(row.workers),
                        "efficiency": 100.0 * eff if percent else eff})
    table = pd.DataFrame(out).pivot_table(index=["model", "method"], columns="workers",
                                          values="efficiency", sort=False)
    if table.index.get_level_values("model").nunique() == 1:
        table = table.droplevel("model")
    table.columns.name = "workers"
    return table


def measure_iteration_times(config: Any, repeats: int = 7, warmup: int = 2,
                            device: Any = None) -> dict[str, Any]:
    """One rank's per-iteration compute and selection time, each the median of ``repeats`` passes.

    Compute = forward + backward + optimiser step on one batch of ``config.batch_size`` samples
    of ``config.dataset`` (what one rank does per iteration besides selection and
    communication); selection = error-feedback compensation + the config's selector (default
    ``topk``) at ``k = max(1, floor(density * d))`` on the real gradient. Times are process CPU
    time (``time.process_time``; CUDA: synchronised wall time), so other jobs on the machine
    inflate them less than wall time; the median discards the slow outliers of a loaded
    machine. ``warmup`` untimed passes come first (allocator, kernel selection).

    Returns ``{"compute_time_s", "selection_time_s", "compute_samples_s",
    "selection_samples_s", "numel", "k", "threads"}``. Cost: ``warmup + repeats`` forward/backward
    passes and as many selections. The weights change (real SGD steps), which is harmless for
    timing.
    """
    import torch

    from gtopk_lab.config import RunConfig, k_for
    from gtopk_lab.compression.residual import ErrorFeedback
    from gtopk_lab.compression.selection import get_selector
    from gtopk_lab.training.data import load_dataset
    from gtopk_lab.training.loop import Replica, resolve_device

    if not isinstance(config, RunConfig):
        raise TypeError(f"config has type {type(config).__name__}: expected RunConfig")
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r} is invalid: expected an integer >= {low}")
    dev = resolve_device(config, device)
    dataset = load_dataset(config.dataset, model=config.model,
                           train_samples=max(config.batch_size, 1), test_samples=1, seed=config.seed,
                           data_dir=config.data_dir,
                           num_classes=config.extra.get("model_kwargs", {}).get("vocab_size"))
    replica = Replica(config.replace(workers=1), 1, dev)
    x, y = dataset.x_train[:config.batch_size], dataset.y_train[:config.batch_size]
    selector = get_selector(config.default_selector or "topk")
    k = k_for(replica.numel, config.density)
    ef = ErrorFeedback(replica.numel, rule=config.residual_rule, device=dev)

    def now() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            return _time.perf_counter()
        return _time.process_time()

    compute, selection = [], []
    for i in range(warmup + repeats):
        t0 = now()
        replica.forward_backward(x, y)
        replica.optimizer.step()
        t1 = now()
        acc = ef.compensate(replica.grad)
        selector(acc, k)
        t2 = now()
        if i >= warmup:
            compute.append(t1 - t0)
            selection.append(t2 - t1)
    return {"compute_time_s": statistics.median(compute), "selection_time_s": statistics.median(selection),
            "compute_samples_s": compute, "selection_samples_s": selection, "numel": replica.numel,
            "k": k, "threads": torch.get_num_threads()}
