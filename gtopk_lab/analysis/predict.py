"""Predicted iteration time and scaling efficiency from the alpha-beta(-gamma) model.

For a model of ``d`` parameters, density ``rho`` (``k = max(1, floor(rho d))``), per-worker
compute time ``t_c`` (forward + backward of one mini-batch) and selection time ``t_s``
(sparse methods only), the iteration time on P workers with no overlap of compute and
communication is::

    t(P) = t_c + [t_s if sparse and P > 1] + T_collective(P) / H        t(1) = t_c

(H: the method's ``sync_every``, 1 but for local-steps methods) and, since every worker
processes one mini-batch per iteration,
``scaling_efficiency(P) = throughput(P) / (P * throughput(1)) = t(1) / t(P)``.

The baseline ``t(1)`` is plain single-worker SGD (no selection, no communication), as in
Shi et al. There is one prediction path: a method's collective time is
``Method.predicted_time_s`` (:mod:`gtopk_lab.methods`: the method's or its collective's
alpha-beta(-gamma) formula, with the method's exact-k and pattern), which
:func:`collective_time_s` calls for a method's name and the study's check
(:mod:`gtopk_lab.analysis.study_tables`) calls directly. The rows are the registry's
methods (:func:`scaling_rows`); the Ok-Topk paper bound and the sparse lower bound are
extra rows for orientation. Used by ``gtopk-lab model scaling``, the report, the benchmark
tables and the notebooks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gtopk_lab import counts
from gtopk_lab.methods import formulas as F
from gtopk_lab.methods.base import Method
from gtopk_lab.methods.registry import available_methods, display_order, get_collective, get_method
from gtopk_lab.network.formulas import check_sizes
from gtopk_lab.network.model import NetworkModel

__all__ = ["BOUNDS", "BOUND_ROWS", "collective_time_s", "formula_of", "scaling_rows", "predict_scaling", "parse_count",
           "parse_workers", "selection_per_iteration_s"]

#: Reference bounds that are no method's collective: name -> formula (net, numel, k, workers).
BOUNDS = {
    "oktopk_paper_bound": F.oktopk_paper_bound_time_s,
    "lower_bound": F.sparse_allreduce_lower_bound_time_s,
    "lowerbound": F.sparse_allreduce_lower_bound_time_s,
}


def collective_time_s(net: NetworkModel, name: str, numel: int, k: int, workers: int,
                      algorithm: str | None = None, gamma_s_per_element: float | None = None,
                      host_cores: float | None = None, exact_k: bool | None = None,
                      formula: Mapping[str, Any] | None = None) -> float:
    """Predicted duration of one collective on ``net`` (max over ranks), from the registry.

    ``name``: a registered method (``"gtopk"``, ``"gaussiank"``, a plugin's): then this is
    :meth:`Method.predicted_time_s <gtopk_lab.methods.base.Method.predicted_time_s>`, the one
    prediction path (the method's own formula, pattern and exact-k); a collective or alias that
    is no method (``"allreduce"``, ``"dense_allreduce"``, ``"topk_allgather"``, ...): its
    formula; or a bound of :data:`BOUNDS`. ``algorithm``: the pattern (gTop-k: butterfly
    (default) or tree; ``"ring"`` or None for the library collectives). ``gamma_s_per_element``
    (default: the network's) charges merge compute on the critical path; ``host_cores``: the
    ranks share this many cores, fractional when other jobs take part of them (a merge phase
    that m ranks run at once lasts ``max(1, m / cores)`` times longer); ``exact_k``: header-free
    exact-k rounds and no count allgather, None = the method's own (its selector promises
    exactly k), False for a bare collective. ``formula``: a method's keywords beyond the model
    size (a run summary's ``comm_formula``, ``Method.formula_kwargs``: PowerSGD's layout). The
    formulas are in :mod:`gtopk_lab.methods.formulas`.
    """
    if exact_k is not None and not isinstance(exact_k, bool):
        raise TypeError(f"exact_k={exact_k!r} has type {type(exact_k).__name__}: expected bool or None")
    if host_cores is not None and (isinstance(host_cores, bool) or not isinstance(host_cores, (int, float))
                                   or not 0 < host_cores < float("inf")):
        raise ValueError(f"host_cores={host_cores!r} is invalid: expected a number of cores > 0 or None")
    gamma = net.gamma_s_per_element if gamma_s_per_element is None else float(gamma_s_per_element)
    if name in BOUNDS:
        check_sizes(numel, k, workers)
        return BOUNDS[name](net, numel, k, workers, gamma)
    method = get_method(name) if name in available_methods() else None
    try:
        collective = method.comm if method is not None else get_collective(name)
    except ValueError:
        known = sorted(set(available_methods()) | set(BOUNDS))
        raise ValueError(f"collective={name!r} is invalid: expected a method, a collective or a bound: "
                         f"{', '.join(known)}") from None
    if not collective.algorithms and algorithm not in (None, "ring"):
        raise ValueError(f"algorithm={algorithm!r} is invalid for {name}: expected ring or None")
    options: dict[str, Any] = {"gamma_s_per_element": gamma, "host_cores": host_cores}
    if method is not None:
        if exact_k is not None:
            options["exact_k"] = exact_k
        return method.predicted_time_s(net, numel, k, workers, algorithm=algorithm, **options, **dict(formula or {}))
    return collective.time_s(net, numel, k, workers, algorithm=collective.algorithm_for(
        algorithm if collective.algorithms else None), exact_k=bool(exact_k), **options)


#: The bound rows every default scaling table ends with: (label, bound, algorithm).
BOUND_ROWS: tuple[tuple[str, str, str | None], ...] = (("lower-bound", "lower_bound", None),)


def scaling_rows(methods: Sequence[str] | None = None) -> list[tuple[str, str, str | None]]:
    """The rows of a scaling table: ``(label, method or bound, pattern)``.

    1. the methods: ``methods`` (names of registered methods or bounds), default every
       registered method, in display order (:func:`gtopk_lab.methods.display_order`);
    2. a method that lets a run choose among several patterns gets one row per pattern,
       labelled ``name-pattern`` (``gtopk-butterfly``, ``gtopk-tree``); others one row;
    3. a bound is one row under its name; without ``methods``, :data:`BOUND_ROWS` end the list.
    ``ValueError`` naming an unknown name. O(registered methods)."""
    names = list(methods) if methods is not None else sorted(available_methods(), key=display_order)
    rows: list[tuple[str, str, str | None]] = []
    for name in names:
        if name in BOUNDS:
            rows.append((name, name, None))
            continue
        method = get_method(name)  # ValueError listing the known
        patterns = method.patterns
        if len(patterns) > 1:
            rows.extend((f"{name}-{pattern}", name, pattern) for pattern in patterns)
        else:
            rows.append((name, name, None))
    return rows if methods is not None else rows + list(BOUND_ROWS)

def parse_count(text: str, field_name: str = "model_size") -> int:
    """A model size as typed ("25M" -> 25_000_000): :func:`gtopk_lab.counts.parse_count`."""
    return counts.parse_count(text, field_name)


def parse_workers(text: str) -> list[int]:
    """"1,2,4,...,1024" -> powers of two from 4 to 1024 after 1, 2; "2,3,8" as written.

    ``...`` continues the sequence by doubling the previous value up to the next one.
    """
    parts = counts.split_list(text)  # commas, spaces or both
    out: list[int] = []
    allowed = "comma-separated integers >= 1, '...' doubles up to the next value (1,2,4,...,1024)"
    for i, part in enumerate(parts):
        if part == "...":
            if not out or i + 1 >= len(parts) or parts[i + 1] == "...":
                raise ValueError(f"workers={text!r} is invalid: expected {allowed}")
            continue
        try:
            value = int(part)
        except ValueError:
            raise ValueError(f"workers={text!r} is invalid: expected {allowed}") from None
        if value < 1:
            raise ValueError(f"workers={text!r} is invalid: expected {allowed}")
        if i > 0 and parts[i - 1] == "...":
            nxt = out[-1] * 2
            while nxt < value:
                out.append(nxt)
                nxt *= 2
        out.append(value)
    if not out:
        raise ValueError(f"workers={text!r} is invalid: expected {allowed}")
    return sorted(set(out))


def formula_of(values: Iterable[Any] | None) -> dict[str, Any]:
    """The first non-empty ``comm_formula`` (``Method.formula_kwargs``: what a method's formula
    needs beyond the model size) among one method's run summaries' ``values``; {} without one
    (a formula that needs none, or runs from before the field)."""
    return next((dict(v) for v in (values if values is not None else ()) if isinstance(v, Mapping) and v), {})


def selection_per_iteration_s(method: Method, breakdown: Any) -> float | None:
    """The selection one iteration of ``method`` waits for, from a run summary's
    ``time_breakdown_s``: 0 for a method that does not select; else the mean over the
    iterations the rank selected (``selection_when_selected``: CLT-k's leader's, where rank 0's
    mean over all iterations is a P-th of it); a summary from before that field: every
    iteration's mean where every rank selects (a sparse method), else None (unknown)."""
    if not method.selects:
        return 0.0
    parts = breakdown if isinstance(breakdown, Mapping) else {}
    for key in ("selection_when_selected",) + (("selection",) if method.sparse else ()):
        value = parts.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def predict_scaling(numel: int, density: float, compute_s: float, network: NetworkModel,
                    workers: Sequence[int], selection_s: float = 0.0,
                    gamma_s_per_element: float | None = None,
                    methods: Sequence[tuple[str, str, str | None]] | None = None,
                    selection_at_one: bool = False,
                    formulas: Mapping[str, Mapping[str, Any] | None] | None = None) -> list[dict[str, Any]]:
    """One row per (method, P): predicted times and scaling efficiency (see module doc).

    ``methods``: ``(label, method or bound, pattern)`` rows, default :func:`scaling_rows`
    (every registered method, one row per pattern it may choose, then the lower bound); a
    default row whose formula needs what these arguments lack (PowerSGD's parameter layout)
    is left out, a row asked for raises its ``ValueError``. ``formulas``: method name -> its
    formula's keywords beyond the model size (:func:`collective_time_s`'s ``formula``: a run's
    ``comm_formula``, or ``Method.formula_kwargs`` of a model's layout).

    1. ``k = max(1, floor(density numel))``;
    2. per row and P: ``comm_s`` = :func:`collective_time_s` (for a method: its
       ``Method.predicted_time_s``, so its own exact-k and pattern) divided by the method's
       ``sync_every`` (a local-steps method synchronises every H iterations), 0 at P = 1;
    3. a method that selects (``Method.selects``; every bound) pays ``selection_s`` at P > 1
       (the paper: one worker compresses nothing); ``selection_at_one=True`` charges it at
       P = 1 too, for runs that select there (gtopk-lab's do, so a study's check predicts what
       it measures);
    4. ``iteration_s = compute_s + selection + comm_s``, ``efficiency = compute_s / iteration_s``.

    Row keys: ``method, workers, numel, k, density, compute_s, selection_s, comm_s,
    iteration_s, throughput_ratio`` (t(1)/t(P) * P: speed-up over one worker),
    ``scaling_efficiency`` (t(1)/t(P)). O(len(methods) * len(workers)).
    """
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1:
        raise ValueError(f"numel={numel!r} is invalid: expected an integer >= 1")
    if not (0.0 < density <= 1.0):
        raise ValueError(f"density={density!r} is invalid: expected a number in (0, 1]")
    if not (compute_s > 0 and math.isfinite(compute_s)):
        raise ValueError(f"compute_s={compute_s!r} is invalid: expected a time > 0 in seconds")
    if not (selection_s >= 0 and math.isfinite(selection_s)):
        raise ValueError(f"selection_s={selection_s!r} is invalid: expected a time >= 0 in seconds")
    if not workers or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in workers):
        raise ValueError(f"workers={list(workers)!r} is invalid: expected integers >= 1")
    k = max(1, int(math.floor(density * numel)))
    rows: list[dict[str, Any]] = []
    for label, name, algorithm in (scaling_rows() if methods is None else methods):
        method = None if name in BOUNDS else get_method(name)
        sparse = method is None or method.selects
        sync_every = 1 if method is None else method.sync_every
        try:
            comm = [collective_time_s(network, name, numel, k, p, algorithm, gamma_s_per_element,
                                      formula=(formulas or {}).get(name) if method is not None else None)
                    / sync_every
                    if p > 1 else 0.0 for p in workers]
        except ValueError:
            if methods is not None:
                raise
            continue  # a default row whose formula needs more than a model size (PowerSGD's layout)
        for p, comm_s in zip(workers, comm):
            sel_s = selection_s if (sparse and (p > 1 or selection_at_one)) else 0.0
            iteration_s = compute_s + sel_s + comm_s
            efficiency = compute_s / iteration_s
            rows.append({
                "method": label, "workers": p, "numel": numel, "k": k, "density": density,
                "compute_s": compute_s, "selection_s": sel_s, "comm_s": comm_s,
                "iteration_s": iteration_s, "throughput_ratio": p * efficiency,
                "scaling_efficiency": efficiency,
            })
    return rows
