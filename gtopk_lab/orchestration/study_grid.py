"""A study's grid: ``RunConfig`` fields given as scalars or lists, expanded into points.

``expand_grid(base, axes, real_max_workers=...)`` returns the study's
:class:`StudyPoint` list (a config and its source, real or simulated):

1. every axis is a ``RunConfig`` field (``methods`` is accepted for ``method``) given a
   scalar or a non-empty list; ``seeds`` is an int n (seeds ``seed .. seed+n-1``) or a list
2. the product of the axes, in the order given; a dense method has nothing to select, so
   its density, gTop-k pattern and selector collapse to the first value listed (one run,
   not one per density), and a method with no pattern to choose (``Method.patterns`` empty:
   Top-k's allgather, Ok-Topk, which fixes its own) runs once, not once per pattern listed
3. a point's source: ``"real"`` (Dask-launched ranks) when P <= ``real_max_workers``,
   else ``"simulated"`` (the simulator, as a Dask task); P values in ``both_ways`` run
   both ways (the fidelity check); ``simulate=True`` makes every point simulated
4. baselines: when dense is among the methods, dense at P = 1 joins every group of the
   other axes (network, seed, ...) for every source present in that group, since a
   point's efficiency divides by the dense P = 1 run measured under its own conditions
5. order: baselines first, then real points, then simulated ones, P ascending

Cost: O(product of the axes' lengths) configs, each validated by ``RunConfig``.
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gtopk_lab.config import RunConfig
from gtopk_lab.methods import BASELINE_METHOD, get_method
from gtopk_lab.orchestration.reading import point_key
from gtopk_lab.orchestration.run_files import config_hash

__all__ = ["StudyPoint", "expand_grid", "FIELD_ALIASES", "SOURCES"]

#: Study keywords that name a RunConfig field by another name.
FIELD_ALIASES = {"methods": "method", "densities": "density", "bandwidths": "bandwidth",
                 "latencies": "latency", "algorithms": "algorithm"}
SOURCES: tuple[str, ...] = ("real", "simulated")
#: Fields that mean nothing to a method without selection (collapsed to one value).
_SELECTION_FIELDS = ("density", "algorithm", "selector")


@dataclass(frozen=True)
class StudyPoint:
    """One run of a study: its config (without a run id) and where it runs."""

    config: RunConfig
    source: str

    @property
    def key(self) -> str:
        """Identity in the results folder (config hash, plus the source when simulated)."""
        return point_key(config_hash(self.config), self.source)

    @property
    def is_baseline(self) -> bool:
        return self.config.method == BASELINE_METHOD and self.config.workers == 1

    @property
    def simulated(self) -> bool:
        return self.source == "simulated"


def _as_list(name: str, value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{name}={list(value)!r} is invalid: expected a value or a non-empty list")
        return list(value)
    return [value]


#: The most seeds a count may ask for (``seeds=n``); a list may name more.
MAX_SEED_COUNT = 1000


def _seeds(value: Any, base_seed: int) -> list[int]:
    if isinstance(value, bool):
        raise TypeError(f"seeds={value!r} has type bool: expected an int n >= 1 or a list of seeds")
    if isinstance(value, numbers.Integral):
        if not 1 <= value <= MAX_SEED_COUNT:
            raise ValueError(f"seeds={value!r} is invalid: expected 1 <= n <= {MAX_SEED_COUNT} "
                             "(seeds seed .. seed+n-1) or a list of seeds")
        return [base_seed + i for i in range(int(value))]
    seeds = _as_list("seeds", value)
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in seeds):
        raise TypeError(f"seeds={seeds!r} is invalid: expected integers")
    return [int(s) for s in seeds]


def _workers(values: Iterable[Any], name: str) -> list[int]:
    out = []
    for p in values:
        if isinstance(p, bool) or not isinstance(p, numbers.Integral):
            raise TypeError(f"{name}={p!r} has type {type(p).__name__}: expected an int >= 1")
        if p < 1:
            raise ValueError(f"{name}={p!r} is invalid: expected P >= 1")
        out.append(int(p))
    return out


def expand_grid(base: RunConfig | dict[str, Any] | None, axes: dict[str, Any], *,
                real_max_workers: int, both_ways: Sequence[int] = (), simulate: bool = False
                ) -> list[StudyPoint]:
    """Steps 1-5 of the module docstring. ``base``: the fields every point shares."""
    base_fields = (base.to_dict() if isinstance(base, RunConfig) else dict(base or {}))
    base_fields.pop("run_id", None)
    known = {f.name for f in dataclasses.fields(RunConfig)}
    grid: dict[str, list[Any]] = {}
    seeds: Any = None
    for raw_name, value in axes.items():
        if raw_name == "seeds":
            seeds = value
            continue
        name = FIELD_ALIASES.get(raw_name, raw_name)
        if name not in known or name == "run_id":
            raise TypeError(f"{raw_name}= is not a RunConfig field: expected one of "
                            f"{', '.join(sorted(known - {'run_id'}))} (or seeds)")
        if name in grid:
            raise TypeError(f"{raw_name}= repeats the field {name!r}")
        grid[name] = _as_list(raw_name, value)
    grid.setdefault("method", [base_fields.get("method", RunConfig().method)])
    grid.setdefault("workers", [base_fields.get("workers", 1)])
    grid["workers"] = _workers(grid["workers"], "workers")
    for method in grid["method"]:
        get_method(method)  # an unknown method: ValueError listing the known ones
    seed_list = _seeds(seeds, int(base_fields.get("seed", RunConfig().seed))) if seeds is not None \
        else [int(base_fields.get("seed", RunConfig().seed))]
    grid["seed"] = seed_list
    if not isinstance(both_ways, (list, tuple, set, frozenset, range)):
        raise TypeError(f"both_ways={both_ways!r} has type {type(both_ways).__name__}: expected a list "
                        "of P values")
    both = set(_workers(both_ways, "both_ways"))
    if isinstance(real_max_workers, bool) or not isinstance(real_max_workers, numbers.Integral) \
            or real_max_workers < 0:
        raise ValueError(f"real_max_workers={real_max_workers!r} is invalid: expected an int >= 0")

    def sources_for(p: int) -> list[str]:
        if simulate:
            return ["simulated"]
        real = p <= real_max_workers
        return ["real", "simulated"] if (p in both and real) else (["real"] if real else ["simulated"])

    names = list(grid)
    points: dict[str, StudyPoint] = {}
    for values in itertools.product(*(grid[n] for n in names)):
        fields = dict(zip(names, values))
        method = get_method(fields["method"])
        for name in _SELECTION_FIELDS if method.dense else () if method.patterns else ("algorithm",):
            if name in grid:
                fields[name] = grid[name][0]
        for source in sources_for(fields["workers"]):
            point = StudyPoint(RunConfig(**{**base_fields, **fields}), source)
            points.setdefault(point.key, point)
    if BASELINE_METHOD in grid["method"]:
        # one dense P = 1 per group of the other axes and per source present in it
        others = [n for n in names if n not in ("method", "workers") + _SELECTION_FIELDS]
        for point in list(points.values()):
            group = {n: getattr(point.config, n) for n in others}
            fields = {**base_fields, **group, "method": BASELINE_METHOD, "workers": 1}
            for name in _SELECTION_FIELDS:
                if name in grid:
                    fields[name] = grid[name][0]
            baseline = StudyPoint(RunConfig(**fields), point.source)
            points.setdefault(baseline.key, baseline)
    ordered = sorted(points.values(), key=lambda pt: (
        not pt.is_baseline, pt.source != "real", pt.config.workers))
    return ordered
