"""Calibrated per-rank costs per workload, measured once on a worker and kept with the results.

A scaling study on a shared or oversubscribed machine measures each rank's forward/backward
under contention that no one-core-per-rank cluster has, and the figure then shows that
contention instead of the method (benchmarks/RESULTS.md, "Efficiency figures you can
trust"): 4 real ranks time-share 2 cores, the P = 1 baseline ran at another moment of another
job's load, and a simulated point's slowest of P merges grows with P. Charging every rank,
real or simulated, one calibrated compute time (``RunConfig.compute_charge.compute_time_s``),
its merges at one calibrated gamma (``compute.merge_gamma_s_per_element``) and a
method's selection (its step's, or its collective's own compression: ``Method.compresses``)
at one calibrated time (``compute.selection_time_s``) removes all three;
the communication is modelled (:mod:`gtopk_lab.training.compute_charge`). A selection
measured per run (the rule before) borrowed the real P = 1 run's CPU time for a simulated
point's prediction while the simulator charged its own, measured at another moment of the
load: the two read 10-13 points apart beside two busy loops. :func:`calibrated_costs`:

1. looks up ``<out>/calibration.json`` for an entry of the same workload (model, dataset,
   batch size, model options, device; for gamma also the density, which sets k; for the
   selection also the method and the settings its step reads, :func:`selection_key`):
   found, returns it, so a resumed study's points keep their identity (the charged costs
   are part of each point's config);
2. else runs :func:`~gtopk_lab.training.compute_charge.compute_calibration_task` (one torch
   thread, the lower quartile of 15 forward/backward/step passes: contention only adds to a
   pass),
   :func:`~gtopk_lab.training.compute_charge.merge_calibration_task` (gamma of a k + k merge
   at the workload's k) and, for a method that selects or compresses (``Method.compresses``:
   Top-k, gTop-k, CLT-k, Ok-Topk, PowerSGD, ...) without local steps or a density schedule,
   :func:`~gtopk_lab.training.compute_charge.selection_calibration_task` (the lower quartile
   of 15 selections), as Dask tasks on one worker, never in the client (a damaged file is
   moved aside to ``calibration.json.damaged-<stamp>``, with one warning line saying what is
   wrong, and every workload measured again);
3. appends the entries (with when and where they were measured) atomically and returns them.

A local-steps method selects once per H iterations and a density schedule changes k per
epoch: their selection stays measured per iteration (``selection_time_s`` None).

Steps 1-3 hold ``<out>/.calibration.lock``, so two clients calibrating one workload into one
folder measure it once and charge the same costs (their study points are then the same
points, which the point locks run once).

:func:`with_calibrated_costs` applies them to a study's points (``Lab.study`` does, unless
``compute="measured"``). Cost: two tasks per workload and results folder, about
``warmup + repeats`` forward/backward passes and ``repeats`` merges, and one task of as many
passes and selections per (sparse method, density). Client side.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gtopk_lab.atomic_io import DamagedFile, read_json_file
from gtopk_lab.config import RunConfig, k_for
from gtopk_lab.orchestration.locks import wait_lock
from gtopk_lab.orchestration.reading import move_aside
from gtopk_lab.orchestration.run_files import utc_now, write_json_atomic
from gtopk_lab.orchestration.study_grid import StudyPoint
from gtopk_lab.methods import get_method
from gtopk_lab.training.compute_charge import (compute_calibration_task, merge_calibration_task,
                                               selection_calibration_task)

__all__ = ["CALIBRATION_FILE", "COMPUTE_MODES", "calibrated_compute_time_s", "calibrated_costs",
           "selection_key", "stored_entries", "with_calibrated_costs", "workload_key"]

CALIBRATION_FILE = "calibration.json"
#: Held while a client reads, measures and writes calibration.json (orchestration.locks).
CALIBRATION_LOCK = ".calibration.lock"
#: The longest a client waits for another one's calibration (two tasks of a few seconds).
CALIBRATION_WAIT_S = 600.0
#: How a study charges each rank's compute: one calibration per workload, or each rank's own
#: CPU time as measured.
COMPUTE_MODES: tuple[str, ...] = ("calibrated", "measured")

logger = logging.getLogger("gtopk_lab.orchestration.lab")


def workload_key(config: RunConfig) -> dict[str, Any]:
    """What one rank's compute time depends on (not the method, P, the density or the network)."""
    return {"model": config.model, "dataset": config.dataset, "batch_size": config.batch_size,
            "model_kwargs": config.model_options.kwargs or {}, "device": config.device}


def selection_key(config: RunConfig) -> dict[str, Any] | None:
    """What one rank's selection time depends on beyond its workload: the method, the density
    and the settings :class:`~gtopk_lab.training.step_settings.StepSettings` reads (selector,
    residual rule, clipping, momentum, the method's and the collective's options), as JSON
    values so that a stored key compares equal; None where the selection is not calibrated
    (a method that neither selects nor compresses, a local-steps method, a density schedule
    or warm-up)."""
    method = get_method(config.method)
    if not method.compresses or method.local_steps or config.density_warmup or config.density_schedule:
        return None
    key = {**workload_key(config), "method": config.method, "density": config.density,
           "selector": config.selector, "residual_rule": config.residual_rule, "grad_clip": config.grad_clip,
           "grad_clip_mode": config.grad_clip_mode, "momentum": config.momentum,
           "momentum_correction": config.momentum_correction,
           "method_options": config.method_options or {}, "collective_options": config.collective_options or {}}
    return json.loads(json.dumps(key, sort_keys=True, default=str))


def _read(path: Path) -> list[dict[str, Any]]:
    """The entries of ``path`` (none when it is missing). A file that is not
    ``{"entries": [...]}`` of compute entries (``workload``, ``compute_time_s`` seconds > 0)
    and merge entries (``merge_workload``, ``merge_gamma_s_per_element`` >= 0) is moved aside
    with one warning line saying what is wrong, and its workloads are measured again."""
    try:
        return _entries(path)
    except DamagedFile as exc:  # kept aside, never written over
        moved = move_aside(path)
        logger.warning("calibration file %s: %s; moved it to %s and measuring again", path, exc.reason, moved)
        return []


def stored_entries(path: str | Path) -> list[dict[str, Any]]:
    """The entries of the calibration file ``path``, read only (none when it is missing;
    a damaged file raises :class:`~gtopk_lab.atomic_io.DamagedFile`, left where it is):
    what the what-if explorer reads without measuring anything."""
    return _entries(Path(path))


def _entries(path: Path) -> list[dict[str, Any]]:
    data = read_json_file(path)
    if data is None:
        return []
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise DamagedFile(path, f"entries={entries!r:.40} is invalid: expected a list")
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise DamagedFile(path, f"entry {n} is invalid: expected an object, found {entry!r:.40}")
        kind, field, low = (("merge_workload", "merge_gamma_s_per_element", -1.0) if "merge_workload" in entry
                            else ("selection_workload", "selection_time_s", -1.0) if "selection_workload" in entry
                            else ("workload", "compute_time_s", 0.0))
        value = entry.get(field)
        if (not isinstance(entry.get(kind), dict) or isinstance(value, bool)
                or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= low):
            raise DamagedFile(path, f"entry {n} is invalid: expected a {kind} object and {field} "
                                    f"{'> 0' if low == 0 else '>= 0'}, found {entry!r:.60}")
    return entries


def calibrated_costs(lab: Any, config: RunConfig, out: str | Path, repeats: int = 15) -> dict[str, Any]:
    """``{"compute_time_s", "merge_gamma_s_per_element", "selection_time_s", "host",
    "measured_at", "repeats"}`` of ``config``'s workload (module docstring): stored in
    ``out``, else measured on a worker of ``lab`` and stored. The compute entry is shared by
    every density and method; gamma has one per k; the selection one per
    :func:`selection_key` (None where it is not calibrated)."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"config has type {type(config).__name__}: expected RunConfig")
    path = Path(out) / CALIBRATION_FILE
    # one client at a time reads, measures and writes the file: two studies of one workload
    # into one folder then charge the same costs, so their points are the same points
    with wait_lock(Path(out) / CALIBRATION_LOCK, CALIBRATION_WAIT_S):
        return _calibrated_costs(lab, config, path, repeats)


def _calibrated_costs(lab: Any, config: RunConfig, path: Path, repeats: int) -> dict[str, Any]:
    key = workload_key(config)
    entries = _read(path)
    compute = next((e for e in entries if e.get("workload") == key and "compute_time_s" in e and "numel" in e),
                   None)
    changed = False
    if compute is None:
        measured = lab.client.submit(compute_calibration_task, config.to_dict(), repeats, pure=False).result()
        compute = {"workload": key, **measured, "repeats": repeats, "measured_at": utc_now()}
        entries.append(compute)
        changed = True
    gamma_key = {**key, "density": config.density}
    merges = next((e for e in entries if e.get("merge_workload") == gamma_key), None)
    if merges is None:
        numel = int(compute["numel"])
        k = k_for(numel, config.density)
        measured = lab.client.submit(merge_calibration_task, numel, k, pure=False).result()
        merges = {"merge_workload": gamma_key, **measured, "numel": numel, "k": k, "measured_at": utc_now()}
        entries.append(merges)
        changed = True
    sel_key = selection_key(config)
    selection = None if sel_key is None else next(
        (e for e in entries if e.get("selection_workload") == sel_key), None)
    if sel_key is not None and selection is None:
        measured = lab.client.submit(selection_calibration_task, config.to_dict(), repeats, pure=False).result()
        selection = {"selection_workload": sel_key, **measured, "repeats": repeats, "measured_at": utc_now()}
        entries.append(selection)
        changed = True
    if changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"entries": entries})
    return {"compute_time_s": float(compute["compute_time_s"]),
            "merge_gamma_s_per_element": float(merges["merge_gamma_s_per_element"]),
            "selection_time_s": None if selection is None else float(selection["selection_time_s"]),
            "host": compute.get("host"), "measured_at": compute.get("measured_at"),
            "repeats": compute.get("repeats")}


def calibrated_compute_time_s(lab: Any, config: RunConfig, out: str | Path, repeats: int = 15) -> float:
    """The compute seconds per iteration to charge every rank of ``config``'s workload
    (:func:`calibrated_costs`' ``compute_time_s``)."""
    return calibrated_costs(lab, config, out, repeats)["compute_time_s"]


def with_calibrated_costs(lab: Any, points: Sequence[StudyPoint], out: str | Path) -> list[StudyPoint]:
    """The ``points`` with their workload's calibrated costs in ``config.compute_charge``:
    ``compute_time_s``, ``merge_gamma_s_per_element``, ``selection_time_s`` (where calibrated
    and not already fixed) and ``calibration`` (``{"calibration":
    "calibrated", "host", "measured_at", "repeats", "file"}``, what the summary states). A point
    whose ``compute_charge`` already fixes ``compute_time_s`` keeps its own. O(points) plus one calibration
    per new workload."""
    done: list[StudyPoint] = []
    for point in points:
        if point.config.compute_charge.compute_time_s is not None:
            done.append(point)
            continue
        costs = calibrated_costs(lab, point.config, out)
        described = {"calibration": "calibrated", "host": costs["host"], "measured_at": costs["measured_at"],
                     "repeats": costs["repeats"], "file": CALIBRATION_FILE}
        own_selection = point.config.compute_charge.selection_time_s
        compute = dataclasses.replace(point.config.compute_charge, compute_time_s=costs["compute_time_s"],
                                      merge_gamma_s_per_element=costs["merge_gamma_s_per_element"],
                                      selection_time_s=(own_selection if own_selection is not None
                                                        else costs["selection_time_s"]),
                                      calibration=described)
        config = point.config.replace(compute_charge=compute)
        done.append(dataclasses.replace(point, config=config))
    return done
