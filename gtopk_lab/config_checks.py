"""The checks of a ``RunConfig``'s own fields: each a type, a range or a name from a list.

Below :mod:`gtopk_lab.config`, which calls them while it builds a config: :func:`check_types`
(each field's type; an int where a float is expected becomes the float) and
:func:`check_values` (ranges, names from the lists here, the network strings parsed), in the
order ``RunConfig.__post_init__`` always ran them. A failure is one ``ValueError`` (or
``TypeError`` for a wrong type) naming the field, the value and what is allowed
(:func:`invalid`). The method, the selector and the option dicts are checked in
:mod:`gtopk_lab.config` and :mod:`gtopk_lab.config_options`, where the registry's facts are.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from gtopk_lab.comm.schedules import SPARSE_ALGORITHMS as ALGORITHMS
from gtopk_lab.compression.residual import RESIDUAL_RULES
from gtopk_lab.network.model import network_model

__all__ = ["DEVICES", "DATA_SPLITS", "GRAD_CLIP_MODES", "MAX_WORKERS", "invalid", "check_types",
           "check_values"]

DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
#: How the training set is divided between the ranks (gtopk_lab.training.data.Shard):
#: "iid" (a seeded permutation cut in P equal parts) or "dirichlet" (label skew).
DATA_SPLITS: tuple[str, ...] = ("iid", "dirichlet")

#: Where gradient clipping acts (``grad_clip_mode``): "aggregated" clips the synchronised
#: update G / P by its L2 norm, identically on every rank (where the references clip);
#: "local" clips each rank's own gradient before error feedback at grad_clip / sqrt(P) (DGC).
GRAD_CLIP_MODES: tuple[str, ...] = ("aggregated", "local")
#: The most ranks a run may have, real or simulated: far beyond any cluster, and small
#: enough that a simulator or a study never tries to build 10**30 ranks from a typo.
MAX_WORKERS = 2**16


def invalid(field_name: str, value: Any, allowed: str) -> ValueError:
    """The error of a field's bad value: ``field=value is invalid: expected allowed``."""
    return ValueError(f"{field_name}={value!r} is invalid: expected {allowed}")


def check_types(config: Any) -> None:
    """Each field of ``config`` (a RunConfig) against its type in ``_TYPES``; a float field
    given an int takes the float. ``TypeError`` naming the field otherwise (None only where
    the field defaults to None; a float must be finite: ``ValueError``)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        expected = _TYPES.get(f.name)
        if value is None and f.default is not None and expected is not None:
            raise TypeError(f"{f.name}=None is invalid: expected {expected.__name__} "
                            f"(only fields that default to None take None)")
        if expected is None or value is None:
            continue
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            setattr(config, f.name, float(value))
            continue
        if expected is bool and not isinstance(value, bool):
            raise TypeError(f"{f.name}={value!r} has type {type(value).__name__}: expected bool")
        if expected is not bool and (isinstance(value, bool) or not isinstance(value, expected)):
            raise TypeError(
                f"{f.name}={value!r} has type {type(value).__name__}: expected {expected.__name__}"
            )
        if expected is float and not math.isfinite(value):
            raise ValueError(f"{f.name}={value!r} is invalid: expected a finite number")


def check_values(config: Any) -> None:
    """The values of ``config``'s (a RunConfig's) plain fields: ranges, names from the lists
    above, the network strings; ``density_warmup``, ``density_schedule`` and
    ``lr_milestones`` are stored as tuples. ``ValueError`` naming the field otherwise."""
    if config.algorithm not in ALGORITHMS:
        raise invalid("algorithm", config.algorithm, f"one of {', '.join(ALGORITHMS)}")
    if config.residual_rule not in RESIDUAL_RULES:
        raise invalid("residual_rule", config.residual_rule, f"one of {', '.join(RESIDUAL_RULES)}")
    if config.data_split not in DATA_SPLITS:
        raise invalid("data_split", config.data_split, f"one of {', '.join(DATA_SPLITS)}")
    if not (math.isfinite(config.dirichlet_alpha) and config.dirichlet_alpha > 0):
        raise invalid("dirichlet_alpha", config.dirichlet_alpha, "a finite number > 0")
    if config.device not in DEVICES:
        raise invalid("device", config.device, f"one of {', '.join(DEVICES)}")
    if not (0.0 < config.density <= 1.0) or math.isnan(config.density):
        raise invalid("density", config.density, "a number in (0, 1]")
    if config.density_warmup is not None:
        dw = config.density_warmup
        try:
            ok = (isinstance(dw, (list, tuple)) and len(dw) == 2 and 0.0 < float(dw[0]) <= 1.0
                  and not isinstance(dw[1], bool) and int(dw[1]) == dw[1] and int(dw[1]) >= 0)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise invalid("density_warmup", config.density_warmup, "(density in (0, 1], epochs >= 0)")
        config.density_warmup = (float(dw[0]), int(dw[1]))
    if config.density_schedule is not None:
        config.density_schedule = _density_schedule(config.density_schedule)
        if config.density_warmup is not None:
            raise ValueError(f"density_schedule={config.density_schedule!r} is invalid with density_warmup="
                             f"{config.density_warmup!r}: expected one of the two (the warm-up (rho0, E) "
                             "is the schedule (rho0,) * E)")
    for name, low in (("workers", 1), ("epochs", 1), ("batch_size", 1), ("train_samples", 1),
                      ("test_samples", 1), ("eval_every_epochs", 1), ("sink_every", 1)):
        if getattr(config, name) < low:
            raise invalid(name, getattr(config, name), f"an integer >= {low}")
    if config.workers > MAX_WORKERS:
        raise invalid("workers", config.workers, f"an integer in [1, {MAX_WORKERS}]")
    if config.max_restarts < 0:
        raise invalid("max_restarts", config.max_restarts, "an integer >= 0")
    if not (0 < config.scheduler_timeout_s < math.inf):
        raise invalid("scheduler_timeout_s", config.scheduler_timeout_s, "seconds > 0 (finite)")
    if config.max_iterations is not None and config.max_iterations < 1:
        raise invalid("max_iterations", config.max_iterations, "an integer >= 1 or None")
    for name in ("lr", "lr_decay"):
        if not getattr(config, name) > 0:
            raise invalid(name, getattr(config, name), "a number > 0")
    for name in ("momentum", "weight_decay", "lr_warmup_epochs"):
        if not getattr(config, name) >= 0:
            raise invalid(name, getattr(config, name), "a number >= 0")
    if not config.momentum < 1:
        raise invalid("momentum", config.momentum, "a number in [0, 1)")
    if config.seed < 0:
        raise invalid("seed", config.seed, "an integer >= 0")
    if not isinstance(config.lr_milestones, (list, tuple)) or any(
            isinstance(m, bool) or not isinstance(m, int) or m < 0 for m in config.lr_milestones):
        raise invalid("lr_milestones", config.lr_milestones, "a list of epochs (integers >= 0)")
    if config.grad_clip is not None and not config.grad_clip > 0:
        raise invalid("grad_clip", config.grad_clip, "a number > 0 or None")
    if config.grad_clip_mode not in GRAD_CLIP_MODES:
        raise invalid("grad_clip_mode", config.grad_clip_mode, f"one of {', '.join(GRAD_CLIP_MODES)}")
    config.lr_milestones = tuple(int(m) for m in config.lr_milestones)
    # Network strings are parsed here so that a typo fails before anything starts; the
    # parse is cached, so the loops' network_of(config) does not repeat it.
    network_model(config.bandwidth, config.latency)


_TYPES: dict[str, type] = {
    "method": str, "algorithm": str, "residual_rule": str, "density": float, "workers": int,
    "model": str, "dataset": str, "data_split": str, "dirichlet_alpha": float, "train_samples": int,
    "test_samples": int, "epochs": int,
    "max_iterations": int, "batch_size": int, "lr": float, "momentum": float,
    "weight_decay": float, "lr_warmup_epochs": float, "lr_decay": float, "grad_clip": float,
    "grad_clip_mode": str, "preset": str,
    "momentum_correction": bool, "seed": int, "bandwidth": str, "latency": str, "throttle": bool,
    "virtual_merge_cpu": bool,
    "device": str, "eval_every_epochs": int, "sink_every": int, "checkpoint": bool,
    "max_restarts": int, "scheduler_timeout_s": float, "run_id": str, "selector": str, "data_dir": str,
    "collective_options": dict, "method_options": dict, "custom": dict,
}


def _density_schedule(value: Any) -> tuple[float, ...]:
    """``value`` as a tuple of densities in (0, 1]; ``ValueError`` naming the field otherwise."""
    ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 < v <= 1.0 for v in value)
    if not ok:
        raise invalid("density_schedule", value, "a non-empty list of densities in (0, 1], one per epoch, "
                    "e.g. (0.015625, 0.004), or None")
    return tuple(float(v) for v in value)
