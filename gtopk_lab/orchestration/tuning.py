"""Each method at its best learning rate: tune on a validation split, then compare.

Comparing methods at one learning rate (the recipe's) can make "X beats Y" an artefact of
the LR: sparse and local-steps methods often want their own. :func:`tune_and_compare` gives
every method the same budget and reports it:

1. **tune**: for every method, every LR of ``lrs`` and every seed, one run of ``base`` with
   ``model_options.validation_fraction = f``: it trains on the training set minus a held-out
   ``f`` of it and evaluates on that part (:func:`~gtopk_lab.training.data.validation_split`);
   the test split is never seen;
2. **pick**: per method the LR whose runs have the best mean of ``metric`` over the seeds
   (lowest loss, or highest accuracy for an ``*accuracy`` metric); a failed or non-finite run
   counts as the worst possible; ties go to the smaller LR;
3. **compare**: every method once per seed at its chosen LR on the full training set,
   evaluated on the test split;
4. the comparison's rows record the budget: ``best_lr``, ``lr_budget`` (the LRs tried),
   ``tuning_seeds``, ``tuning_runs``, ``validation_fraction`` and ``tuning_metric``.

Cost: ``len(methods) * len(lrs) * seeds`` tuning runs plus ``len(methods) * seeds``
comparison runs, each a normal run of ``base``. ``run`` is any callable that trains a list
of configs and returns their summaries in the same order (None for a run that produced
none): :meth:`Lab.tune <gtopk_lab.orchestration.lab.Lab.tune>` passes the cluster's sweep.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gtopk_lab.config import RunConfig
from gtopk_lab.config_options import coerce_options, with_legacy_extra

__all__ = ["TuneResult", "tune_and_compare", "DEFAULT_VALIDATION_FRACTION", "DEFAULT_TUNING_METRIC"]

#: Share of the training set held out for validation while tuning.
DEFAULT_VALIDATION_FRACTION = 0.2
#: What the LR is chosen by: the final loss on the validation split (lower is better).
DEFAULT_TUNING_METRIC = "final_test_loss"

Runner = Callable[[list[RunConfig]], Sequence[dict[str, Any] | None]]


@dataclass
class TuneResult:
    """The tuning runs (``trials``: one row per method, LR and seed with ``value``), the LR
    chosen per method (``best_lr``), the comparison at those LRs (``comparison``: its runs'
    summaries plus the budget columns) and the ``budget`` itself."""

    trials: pd.DataFrame
    best_lr: dict[str, float]
    comparison: pd.DataFrame
    budget: dict[str, Any]


def _seeds(seeds: int | Sequence[int], first: int) -> list[int]:
    if isinstance(seeds, bool):
        raise TypeError(f"seeds={seeds!r} has type bool: expected an int >= 1 or a list of seeds")
    if isinstance(seeds, int):
        if seeds < 1:
            raise ValueError(f"seeds={seeds!r} is invalid: expected an int >= 1 or a list of seeds")
        return list(range(first, first + seeds))
    out = [int(s) for s in seeds]
    if not out or len(set(out)) != len(out) or min(out) < 0:
        raise ValueError(f"seeds={list(seeds)!r} is invalid: expected distinct seeds >= 0")
    return out


def _lrs(lrs: Sequence[float]) -> list[float]:
    try:
        out = sorted({float(lr) for lr in lrs})
    except (TypeError, ValueError):
        out = []
    if not out or not all(lr > 0 and math.isfinite(lr) for lr in out):
        raise ValueError(f"lrs={lrs!r} is invalid: expected a non-empty list of learning rates > 0")
    return out


def _score(summary: dict[str, Any] | None, metric: str, maximise: bool) -> float:
    """The summary's ``metric`` as "smaller is better" (a missing or non-finite value: +inf)."""
    value = None if summary is None or summary.get("status", "completed") != "completed" else summary.get(metric)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.inf
    if not math.isfinite(value):
        return math.inf
    return -value if maximise else value


def tune_and_compare(run: Runner, methods: str | Sequence[str], lrs: Sequence[float],
                     seeds: int | Sequence[int] = 1, base: RunConfig | dict[str, Any] | None = None, *,
                     metric: str = DEFAULT_TUNING_METRIC,
                     validation_fraction: float = DEFAULT_VALIDATION_FRACTION) -> TuneResult:
    """Steps 1-4 of the module docstring. ``base``: the fields every run shares (a
    ``RunConfig`` gives the fields its caller gave). ``ValueError`` / ``TypeError`` name a
    bad argument before anything runs."""
    method_list = [methods] if isinstance(methods, str) else list(methods)
    if not method_list or len(set(method_list)) != len(method_list):
        raise ValueError(f"methods={methods!r} is invalid: expected one method or distinct methods")
    lr_list = _lrs(lrs)
    if isinstance(base, RunConfig):
        base_fields = {name: getattr(base, name) for name in getattr(base, "_given", ())}
    else:
        base_fields = dict(base or {})
    for name in ("method", "lr", "seed", "run_id"):
        base_fields.pop(name, None)
    seed_list = _seeds(seeds, 0)
    if not (isinstance(metric, str) and metric):
        raise TypeError(f"metric={metric!r} is invalid: expected a summary column name")
    maximise = metric.endswith("accuracy")
    if isinstance(validation_fraction, bool) or not isinstance(validation_fraction, (int, float)) \
            or not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction={validation_fraction!r} is invalid: expected a fraction in (0, 1)")
    if "extra" in base_fields:  # a legacy extra dict: onto the typed options
        base_fields = with_legacy_extra(base_fields)
    given = coerce_options("model_options", base_fields.pop("model_options", {}))
    held_out = dataclasses.replace(given, validation_fraction=float(validation_fraction))
    # every config is validated before any run starts
    tuning = [RunConfig(**base_fields, method=m, lr=lr, seed=s, model_options=held_out)
              for m in method_list for lr in lr_list for s in seed_list]
    summaries = list(run(tuning))
    if len(summaries) != len(tuning):
        raise RuntimeError(f"run returned {len(summaries)} summaries for {len(tuning)} configs")
    trials = pd.DataFrame([{"method": c.method, "lr": c.lr, "seed": c.seed,
                            "value": (math.nan if _score(s, metric, maximise) == math.inf else
                                      float(s[metric]))}
                           for c, s in zip(tuning, summaries)])
    scores = pd.Series([_score(s, metric, maximise) for s in summaries], index=trials.index)
    best: dict[str, float] = {}
    for method in method_list:
        rows = trials["method"] == method
        mean = scores[rows].groupby(trials.loc[rows, "lr"]).mean()  # inf stays inf
        best[method] = float(mean.idxmin())  # idxmin takes the first (smallest LR) of ties
    budget = {"lr_budget": lr_list, "tuning_seeds": seed_list, "tuning_runs": len(tuning),
              "validation_fraction": validation_fraction, "tuning_metric": metric}
    final = [RunConfig(**base_fields, method=m, lr=best[m], seed=s, model_options=given)
             for m in method_list for s in seed_list]
    compared = list(run(final))
    if len(compared) != len(final):
        raise RuntimeError(f"run returned {len(compared)} summaries for {len(final)} configs")
    rows = [{**(summary or {"status": "failed"}), "method": c.method, "seed": c.seed, "lr": c.lr,
             "best_lr": best[c.method], **{k: (list(v) if isinstance(v, list) else v) for k, v in budget.items()}}
            for c, summary in zip(final, compared)]
    return TuneResult(trials=trials, best_lr=best, comparison=pd.DataFrame(rows), budget=budget)
