"""One calibrated compute time per workload, measured once on a worker and kept with the results.

A scaling study on a shared or oversubscribed machine measures each rank's forward/backward
under contention that no one-core-per-rank cluster has, and the figure then shows that
contention instead of the method (benchmarks/RESULTS.md, "Efficiency figures you can
trust"). Charging every rank, real or simulated, one calibrated compute time
(``RunConfig.extra["compute_time_s"]``) removes it. :func:`calibrated_compute_time_s`:

1. looks up ``<out>/calibration.json`` for an entry of the same workload (model, dataset,
   batch size, model options, density, device); found: returns it, so a resumed study's
   points keep their identity (the charged time is part of each point's config);
2. else runs :func:`~gtopk_lab.training.compute_time.measure_iteration_times` (one torch
   thread, the median of a few passes) as a Dask task on one worker, never in the client;
3. appends the entry (with when and where it was measured) atomically and returns it.

Cost: one task of ``warmup + repeats`` forward/backward passes, once per workload and
results folder. Client side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gtopk_lab.config import RunConfig
from gtopk_lab.training.compute_time import calibration_task
from gtopk_lab.orchestration.reading import move_aside
from gtopk_lab.orchestration.run_files import utc_now, write_json_atomic

__all__ = ["CALIBRATION_FILE", "calibrated_compute_time_s", "workload_key"]

CALIBRATION_FILE = "calibration.json"


def workload_key(config: RunConfig) -> dict[str, Any]:
    """What one rank's compute time depends on (not the method, P or the network)."""
    return {"model": config.model, "dataset": config.dataset, "batch_size": config.batch_size,
            "model_kwargs": config.extra.get("model_kwargs", {}), "density": config.density,
            "device": config.device}


def calibrated_compute_time_s(lab: Any, config: RunConfig, out: str | Path, repeats: int = 7) -> float:
    """The compute seconds per iteration to charge every rank of ``config``'s workload (module
    docstring): stored in ``out``, else measured on a worker of ``lab`` and stored."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"config has type {type(config).__name__}: expected RunConfig")
    path = Path(out) / CALIBRATION_FILE
    key = workload_key(config)
    entries: list[dict[str, Any]] = []
    try:
        entries = list(json.loads(path.read_text())["entries"])
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError, KeyError):  # damaged: measure again, keep it aside
        move_aside(path)
    for entry in entries:
        if isinstance(entry, dict) and entry.get("workload") == key:
            return float(entry["compute_time_s"])
    measured = lab.client.submit(calibration_task, config.to_dict(), repeats, pure=False).result()
    entries.append({"workload": key, **measured, "repeats": repeats, "measured_at": utc_now()})
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"entries": entries})
    return float(measured["compute_time_s"])
