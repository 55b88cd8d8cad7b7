"""The what-if explorer's numbers, without widgets: a setting, its prediction, its study.

A :class:`Setting` is what the explorer's controls say: density rho, the chosen P, the link
(a preset of :data:`gtopk_lab.network.model.PRESETS` or a free rate) with its latency, and
the methods to show (names of the method registry). Everything the figure draws comes from

1. :func:`predict`: per method, :func:`~gtopk_lab.analysis.predict.predict_scaling` over
   :data:`WORKERS` (P = 1, 2, 4, ..., 1024), which prices each method by its
   :meth:`~gtopk_lab.methods.base.Method.predicted_time_s` (exact-k rounds, fixed
   patterns, local steps), selection charged at P = 1 too (gtopk-lab's runs select
   there, so a study launched from the setting measures what is predicted); a method
   whose formula needs more than the model size (PowerSGD's layer layout) takes it from
   the costs (:attr:`~gtopk_lab.plotting.explorer_costs.Costs.formulas`: a stored run of
   it), else is listed in ``missing``. Cost: O(methods x 11) formula evaluations, no I/O;
2. :func:`study_arguments`: the keyword arguments of ``Lab.study`` for the same setting
   (methods, P = 1, 2, ..., P, rho, the link and latency as the prediction parsed them, the
   costs' workload as the base), so its measured points belong on the same axes;
3. :func:`measured_points`: a study's measured efficiency per (method, P), mean over seeds.

Pure: no widgets, no cluster. Client side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gtopk_lab.analysis.predict import predict_scaling
from gtopk_lab.methods import available_methods
from gtopk_lab.network.model import PRESETS, NetworkModel, format_bandwidth, format_latency, network_model
from gtopk_lab.plotting.explorer_costs import Costs

__all__ = ["WORKERS", "FREE_RATE", "Setting", "Prediction", "predict", "study_arguments", "measured_points"]

#: The P axis: powers of two from 1 to 1024.
WORKERS: tuple[int, ...] = tuple(2 ** i for i in range(11))
#: The link choice meaning "the rate slider's value" (any other choice is a preset's name).
FREE_RATE = "free rate"


@dataclass(frozen=True)
class Setting:
    """One state of the explorer's controls. ``link``: a preset name or :data:`FREE_RATE`
    (then ``rate_bps``); ``latency_s``: None keeps the preset's (a free rate's is 0)."""

    density: float = 0.001
    workers: int = 32
    link: str = "1GbE"
    rate_bps: float = 1e9
    latency_s: float | None = None
    methods: tuple[str, ...] = ("dense", "topk", "gtopk")

    def __post_init__(self) -> None:
        if isinstance(self.density, bool) or not isinstance(self.density, (int, float)) \
                or not 0 < self.density <= 1:
            raise ValueError(f"density={self.density!r} is invalid: expected a number in (0, 1]")
        if self.workers not in WORKERS:
            raise ValueError(f"workers={self.workers!r} is invalid: expected a power of two in 1 ... 1024")
        if self.link != FREE_RATE and self.link not in PRESETS:
            raise ValueError(f"link={self.link!r} is invalid: expected one of {', '.join(PRESETS)} or {FREE_RATE!r}")
        if self.link == FREE_RATE and not (self.rate_bps > 0 and math.isfinite(self.rate_bps)):
            raise ValueError(f"rate_bps={self.rate_bps!r} is invalid: expected a rate > 0 in bit/s")
        if self.latency_s is not None and not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"latency_s={self.latency_s!r} is invalid: expected a latency >= 0 in seconds or None")
        unknown = [m for m in self.methods if m not in available_methods()]
        if unknown:
            raise ValueError(f"methods={list(self.methods)!r} is invalid: {unknown[0]!r} is not a registered "
                             f"method ({', '.join(available_methods())})")

    @property
    def bandwidth_text(self) -> str:
        """The link as ``RunConfig.bandwidth`` takes it (a preset name, or the rate in bps)."""
        return self.link if self.link != FREE_RATE else f"{self.rate_bps / 1e9:.6g}Gbps"

    @property
    def latency_text(self) -> str | None:
        """The latency as ``RunConfig.latency`` takes it (None: the preset's own)."""
        if self.latency_s is None or self.link == "none":
            return None
        return f"{self.latency_s * 1e6:.6g}us"

    def network(self) -> NetworkModel:
        """The link model of the prediction, parsed as a run parses these strings."""
        return network_model(self.bandwidth_text, self.latency_text)

    def describe(self) -> str:
        """One line: rho, the link and its latency."""
        net = self.network()
        link = self.link if self.link != FREE_RATE else format_bandwidth(net.bandwidth_bps)
        if self.link == "none":
            return f"ρ={self.density:.3g}, no modelled network"
        return f"ρ={self.density:.3g}, {link}, latency {format_latency(net.latency_s)}"


@dataclass
class Prediction:
    """:func:`predict`'s result: ``rows[method]`` = predict_scaling's rows over :data:`WORKERS`,
    ``at_p[method]`` = the row at the setting's P, ``missing`` = methods without a formula."""

    setting: Setting
    costs: Costs
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    @property
    def at_p(self) -> dict[str, dict[str, Any]]:
        return {m: next(r for r in rows if r["workers"] == self.setting.workers) for m, rows in self.rows.items()}


def predict(setting: Setting, costs: Costs) -> Prediction:
    """Step 1 of the module docstring."""
    net = setting.network()
    gamma = costs.gamma_at(setting.density)
    out = Prediction(setting, costs)
    for method in setting.methods:
        try:
            out.rows[method] = predict_scaling(costs.numel, setting.density, costs.compute_s, net, WORKERS,
                                               selection_s=costs.selection_s, gamma_s_per_element=gamma,
                                               methods=[(method, method, None)], selection_at_one=True,
                                               formulas=costs.formulas)
        except ValueError:  # a formula that needs what the model size does not say
            out.missing.append(method)
    return out


def study_arguments(setting: Setting, costs: Costs, base: Mapping[str, Any] | None = None,
                    seeds: int = 1) -> dict[str, Any]:
    """Step 2: ``Lab.study(**study_arguments(...))`` runs the setting. ``base``: RunConfig
    fields every point gets (over the costs' workload: model, dataset, batch size)."""
    if not setting.methods:
        raise ValueError("methods=() is invalid: expected at least one method to run")
    workers = [p for p in WORKERS if p <= setting.workers]
    return {"methods": list(setting.methods), "workers": workers, "density": setting.density,
            "bandwidth": setting.bandwidth_text, "latency": setting.latency_text, "seeds": seeds,
            "base": {**dict(costs.workload), **dict(base or {})}}


def measured_points(points: Any) -> list[dict[str, Any]]:
    """Step 3: ``[{method, workers, efficiency, n, provisional}]`` from ``Study.points()``
    (the project's efficiency rule, mean over seeds; virtual clock)."""
    from gtopk_lab.analysis.study_tables import aggregate_seeds, point_efficiency

    if points is None or not len(points):
        return []
    table = aggregate_seeds(point_efficiency(points, "virtual"), "virtual")
    table = table[table["efficiency_mean"].notna()]
    return [{"method": str(r.method), "workers": int(r.workers), "efficiency": float(r.efficiency_mean),
             "n": int(r.n), "provisional": bool(r.provisional)} for r in table.itertuples()]


def methods_in(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` that the registry knows, in the registry's order."""
    wanted = set(names)
    return tuple(m for m in available_methods() if m in wanted)
