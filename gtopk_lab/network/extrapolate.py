"""Predicted iteration time and scaling efficiency from the alpha-beta(-gamma) model.

For a model of ``d`` parameters, density ``rho`` (``k = max(1, floor(rho d))``), per-worker
compute time ``t_c`` (forward + backward of one mini-batch) and selection time ``t_s``
(sparse methods only), the iteration time on P workers with no overlap of compute and
communication is::

    t(P) = t_c + [t_s if sparse and P > 1] + T_collective(P)        t(1) = t_c

and, since every worker processes one mini-batch per iteration,
``scaling_efficiency(P) = throughput(P) / (P * throughput(1)) = t(1) / t(P)``.

The baseline ``t(1)`` is plain single-worker SGD (no selection, no communication), as in
Shi et al. Rows for Ok-Topk and the sparse lower bound use their formulas from
:mod:`gtopk_lab.network.model` and are for orientation (this project's ``oktopk``
collective may differ).

Worker-side safe (standard library only), used by ``gtopk-lab model scaling``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gtopk_lab.network.model import NetworkModel

__all__ = ["SCALING_METHODS", "predict_scaling", "parse_count", "parse_workers"]

#: (method label, collective, algorithm) rows of a scaling table.
SCALING_METHODS: tuple[tuple[str, str, str | None], ...] = (
    ("dense", "dense", None),
    ("topk", "topk", None),
    ("gtopk-butterfly", "gtopk", "butterfly"),
    ("gtopk-tree", "gtopk", "tree"),
    ("oktopk", "oktopk", None),
    ("lower-bound", "lower_bound", None),
)
_COUNT_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9}


def parse_count(text: str, field_name: str = "model_size") -> int:
    """"25M" -> 25_000_000, "1.5K" -> 1500, "138357544" -> 138357544 (decimal multiples)."""
    s = str(text).strip().upper()
    number, suffix = (s[:-1], s[-1]) if s and s[-1] in _COUNT_SUFFIX else (s, "")
    try:
        value = float(number) * _COUNT_SUFFIX[suffix]
    except ValueError:
        raise ValueError(f"{field_name}={text!r} is invalid: expected a count like 25M, 1.5K or 270000") from None
    if not (value >= 1 and math.isfinite(value)):
        raise ValueError(f"{field_name}={text!r} is invalid: expected a count >= 1")
    return int(round(value))


def parse_workers(text: str) -> list[int]:
    """"1,2,4,...,1024" -> powers of two from 4 to 1024 after 1, 2; "2,3,8" as written.

    ``...`` continues the sequence by doubling the previous value up to the next one.
    """
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
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
                    methods: Sequence[tuple[str, str, str | None]] = SCALING_METHODS) -> list[dict[str, Any]]:
    """One row per (method, P): predicted times and scaling efficiency (see module doc).

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
            comm_s = network.collective_time_s(collective, numel, k, p, algorithm, gamma_s_per_element)
            sel_s = selection_s if (sparse and p > 1) else 0.0
            iteration_s = compute_s + sel_s + comm_s
            efficiency = compute_s / iteration_s
            rows.append({
                "method": label, "workers": p, "numel": numel, "k": k, "density": density,
                "compute_s": compute_s, "selection_s": sel_s, "comm_s": comm_s,
                "iteration_s": iteration_s, "throughput_ratio": p * efficiency,
                "scaling_efficiency": efficiency,
            })
    return rows
