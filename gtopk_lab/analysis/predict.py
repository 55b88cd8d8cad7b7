"""Predicted iteration time and scaling efficiency from the alpha-beta(-gamma) model.

For a model of ``d`` parameters, density ``rho`` (``k = max(1, floor(rho d))``), per-worker
compute time ``t_c`` (forward + backward of one mini-batch) and selection time ``t_s``
(sparse methods only), the iteration time on P workers with no overlap of compute and
communication is::

    t(P) = t_c + [t_s if sparse and P > 1] + T_collective(P)        t(1) = t_c

and, since every worker processes one mini-batch per iteration,
``scaling_efficiency(P) = throughput(P) / (P * throughput(1)) = t(1) / t(P)``.

The baseline ``t(1)`` is plain single-worker SGD (no selection, no communication), as in
Shi et al. Each method's collective time comes from the method registry
(:mod:`gtopk_lab.methods`: every collective carries its alpha-beta(-gamma) formula); the
Ok-Topk paper bound and the sparse lower bound are extra rows for orientation.
Used by ``gtopk-lab model scaling``, the report and the notebooks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gtopk_lab import counts
from gtopk_lab.methods import formulas as F
from gtopk_lab.methods.registry import available_methods, get_collective, get_method
from gtopk_lab.network.formulas import check_sizes
from gtopk_lab.network.model import NetworkModel

__all__ = ["SCALING_METHODS", "BOUNDS", "collective_time_s", "predict_scaling", "parse_count", "parse_workers"]

#: Reference bounds that are no method's collective: name -> formula (net, numel, k, workers).
BOUNDS = {
    "oktopk_paper_bound": F.oktopk_paper_bound_time_s,
    "lower_bound": F.sparse_allreduce_lower_bound_time_s,
    "lowerbound": F.sparse_allreduce_lower_bound_time_s,
}


def collective_time_s(net: NetworkModel, name: str, numel: int, k: int, workers: int,
                      algorithm: str | None = None, gamma_s_per_element: float | None = None,
                      host_cores: float | None = None, exact_k: bool = False) -> float:
    """Predicted duration of one collective on ``net`` (max over ranks), from the registry.

    ``name``: a method (``"gtopk"``, ``"gaussiank"``, a plugin's), a collective or alias
    (``"allreduce"``, ``"dense_allreduce"``, ``"topk_allgather"``, ...), or a bound of
    :data:`BOUNDS`. ``algorithm``: the collective's pattern (gTop-k: butterfly (default) or
    tree; ``"ring"`` or None for the library collectives). ``gamma_s_per_element``
    (default: the network's) charges merge compute on the critical path; ``host_cores``: the
    ranks share this many cores, fractional when other jobs take part of them (a merge phase that m ranks run at once lasts
    ``max(1, m / cores)`` times longer); ``exact_k=True``: header-free exact-k rounds and no
    count allgather. The formulas are in :mod:`gtopk_lab.methods.formulas`.
    """
    if not isinstance(exact_k, bool):
        raise TypeError(f"exact_k={exact_k!r} has type {type(exact_k).__name__}: expected bool")
    if host_cores is not None and (isinstance(host_cores, bool) or not isinstance(host_cores, (int, float))
                                   or not 0 < host_cores < float("inf")):
        raise ValueError(f"host_cores={host_cores!r} is invalid: expected a number of cores > 0 or None")
    gamma = net.gamma_s_per_element if gamma_s_per_element is None else float(gamma_s_per_element)
    if name in BOUNDS:
        check_sizes(numel, k, workers)
        return BOUNDS[name](net, numel, k, workers, gamma)
    try:
        collective = get_method(name).comm if name in available_methods() else get_collective(name)
    except ValueError:
        known = sorted(set(available_methods()) | set(BOUNDS))
        raise ValueError(f"collective={name!r} is invalid: expected a method, a collective or a bound: "
                         f"{', '.join(known)}") from None
    if not collective.algorithms and algorithm not in (None, "ring"):
        raise ValueError(f"algorithm={algorithm!r} is invalid for {name}: expected ring or None")
    return collective.time_s(net, numel, k, workers, algorithm=collective.algorithm_for(
        algorithm if collective.algorithms else None), gamma_s_per_element=gamma, host_cores=host_cores,
        exact_k=exact_k)

#: (method label, collective, algorithm) rows of a scaling table.
SCALING_METHODS: tuple[tuple[str, str, str | None], ...] = (
    ("dense", "dense", None),
    ("topk", "topk", None),
    ("gtopk-butterfly", "gtopk", "butterfly"),
    ("gtopk-tree", "gtopk", "tree"),
    ("oktopk", "oktopk", None),
    ("lower-bound", "lower_bound", None),
)


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


def predict_scaling(numel: int, density: float, compute_s: float, network: NetworkModel,
                    workers: Sequence[int], selection_s: float = 0.0,
                    gamma_s_per_element: float | None = None,
                    methods: Sequence[tuple[str, str, str | None]] = SCALING_METHODS,
                    selection_at_one: bool = False) -> list[dict[str, Any]]:
    """One row per (method, P): predicted times and scaling efficiency (see module doc).

    A sparse method pays ``selection_s`` at P > 1 (the paper: one worker compresses
    nothing); ``selection_at_one=True`` charges it at P = 1 too, for runs that select there
    (gtopk-lab's do, so a study's check predicts what it measures).

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
    for label, collective, algorithm in methods:
        sparse = collective != "dense"
        for p in workers:
            comm_s = collective_time_s(network, collective, numel, k, p, algorithm, gamma_s_per_element)
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
