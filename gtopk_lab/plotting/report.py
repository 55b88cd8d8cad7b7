"""Self-contained HTML report of a results folder.

:func:`write_report` reads ``<results_dir>/<run_id>/{config,metrics,summary}`` with
``gtopk_lab.orchestration.results.load_runs`` and writes one HTML file that opens
offline: plotly.js (from the installed plotly package) is inlined once in ``<head>``, each
figure is a ``<div>`` drawn by it, and tables are plain HTML. No CDN, no kernel.

Sections: runs table (status, accuracy, throughput), convergence (vs iteration and vs
virtual time), scaling efficiency (measured on the virtual clock, the alpha-beta model's
prediction dashed, the paper's 32-worker 1 GbE points) with its table, time breakdown,
communication volume, and the paper's 32-worker table for comparison.

Cost: O(rows) pandas work plus about 4.7 MB of inlined plotly.js.

Example::

    from gtopk_lab.plotting.report import write_report
    write_report("results/demo", "results/demo/report.html")
"""

from __future__ import annotations

import datetime as _dt
import html
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
import plotly
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from gtopk_lab.analysis.predict import predict_scaling
from gtopk_lab.analysis.scaling import BASELINE_NONE, BASELINES, add_scaling_efficiency
from gtopk_lab.methods import available_methods, get_method
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.network.model import format_bandwidth, format_latency
from gtopk_lab.orchestration.results import load_runs
from gtopk_lab.plotting import figures
from gtopk_lab.analysis.scaling import baseline_note

__all__ = ["write_report", "measured_scaling_table", "predicted_scaling_table", "render_report"]


def _completed(summaries: pd.DataFrame) -> pd.DataFrame:
    if "status" not in summaries.columns:
        return summaries
    return summaries[summaries["status"] == "completed"]


def _throughput_column(time_basis: str) -> str:
    if time_basis not in ("virtual", "wall"):
        raise ValueError(f"time_basis={time_basis!r} is invalid: expected 'virtual' or 'wall'")
    return f"samples_per_s_{time_basis}"


def _network_key(row: pd.Series) -> tuple[float, float]:
    bw = row.get("bandwidth_bps")
    bw = math.inf if bw is None or (isinstance(bw, float) and math.isnan(bw)) else float(bw)
    lat = row.get("latency_s")
    lat = 0.0 if lat is None or (isinstance(lat, float) and math.isnan(lat)) else float(lat)
    return bw, lat


def network_label(bandwidth_bps: float, latency_s: float) -> str:
    """"1 Gbit/s, 0.44 ms" style label of a link (or "unthrottled")."""
    if math.isinf(bandwidth_bps):
        return "unthrottled"
    return f"{format_bandwidth(bandwidth_bps)}, {format_latency(latency_s)}"


def measured_scaling_table(summaries: pd.DataFrame, time_basis: str = "virtual",
                           baseline: str = "dense") -> pd.DataFrame:
    """Measured scaling efficiency ``throughput(P) / (P * throughput(dense, 1))``, one row per run.

    Long-format and network-aware, for figures. The baseline follows the project's rule,
    ``gtopk_lab.analysis.scaling.add_scaling_efficiency`` (as ``gtopk-lab sweep`` prints it):
    dense S-SGD at P=1 with the same model, batch and network, else the method's own P=1
    run; the ``baseline`` column says which ("dense P=1" / "own P=1"). A method whose P=1
    iteration is cheaper than dense's can exceed 100%. ``baseline="own"`` is an explicit
    opt-out that prefers the method's own P=1 run (every curve then starts at 100%).
    Runs without a baseline are left out. Columns: ``method, workers, density, bandwidth,
    samples_per_s, baseline_samples_per_s, scaling_efficiency, baseline, run_id``. O(runs).
    """
    col = _throughput_column(time_basis)
    if baseline not in BASELINES:
        raise ValueError(f"baseline={baseline!r} is invalid: expected one of {', '.join(map(repr, BASELINES))}")
    columns = ["method", "workers", "density", "bandwidth", "samples_per_s", "baseline_samples_per_s",
               "scaling_efficiency", "baseline", "run_id"]
    done = _completed(summaries)
    done = done[done[col].notna()] if col in done.columns else done.iloc[:0]
    if not len(done):
        return pd.DataFrame(columns=columns)
    ranked = add_scaling_efficiency(done, times=time_basis, baseline=baseline)
    ranked = ranked[ranked["baseline"] != BASELINE_NONE]
    rows = [{
        "method": run["method"], "workers": int(run["workers"]), "density": float(run["density"]),
        "bandwidth": network_label(*_network_key(run)), "samples_per_s": float(run[col]),
        "baseline_samples_per_s": float(run[f"baseline_{col}"]),
        "scaling_efficiency": float(run[f"efficiency_{time_basis}"]), "baseline": run["baseline"],
        "run_id": run.get("run_id"),
    } for _, run in ranked.iterrows()]
    return pd.DataFrame(rows, columns=columns).sort_values(["bandwidth", "method", "workers"]).reset_index(drop=True)


def predicted_scaling_table(summaries: pd.DataFrame, workers: list[int] | None = None) -> pd.DataFrame:
    """The alpha-beta model's scaling efficiency for the measured configurations.

    For each (method, density, network) of the completed runs: compute time per
    iteration from the single-worker runs' breakdown (compute + update), selection time
    from the method's runs, then ``gtopk_lab.analysis.predict.predict_scaling`` over
    ``workers`` (default 1, 2, 4, ... up to max(32, largest P)). GaussianK travels as
    ``topk`` (an allgather of about k pairs). Columns as :func:`measured_scaling_table` (without the throughputs).
    """
    done = _completed(summaries)
    if not len(done) or "time_breakdown_s" not in done.columns:
        return pd.DataFrame(columns=["method", "workers", "density", "bandwidth", "scaling_efficiency"])
    max_p = max(32, int(done["workers"].max()))
    grid = workers or [p for p in (2 ** i for i in range(0, 21)) if p <= max_p]
    rows: list[dict[str, Any]] = []
    keys = ["method", "density", "bandwidth_bps", "latency_s", "numel"]
    done = done.assign(bandwidth_bps=done["bandwidth_bps"].fillna(math.inf), latency_s=done["latency_s"].fillna(0.0))
    for key, group in done.groupby(keys, dropna=False):
        method, density, bw, lat, numel = key
        if pd.isna(numel):
            continue
        singles = done[(done["workers"] == 1) & (done["numel"] == numel)]
        source = singles if len(singles) else group
        compute_s = _mean_part(source, ("compute", "update"))
        if method not in available_methods():  # a plugin's run read without its plugin
            continue
        entry = get_method(method)
        selection_s = _mean_part(group[group["workers"] > 1], ("selection",)) if entry.sparse else 0.0
        if not compute_s or compute_s <= 0:
            continue
        algorithm = None
        if entry.comm.algorithms:
            algorithm = str(group["algorithm"].iloc[0]) if "algorithm" in group.columns and \
                pd.notna(group["algorithm"].iloc[0]) else entry.comm.algorithms[0]
        collective = method
        net = NetworkModel(latency_s=float(lat), bandwidth_bps=float(bw))
        for row in predict_scaling(int(numel), float(density), compute_s, net, grid,
                                   selection_s=selection_s or 0.0,
                                   methods=[(method, collective, algorithm)]):
            rows.append({"method": method, "workers": row["workers"], "density": float(density),
                         "bandwidth": network_label(float(bw), float(lat)),
                         "scaling_efficiency": row["scaling_efficiency"]})
    return pd.DataFrame(rows, columns=["method", "workers", "density", "bandwidth", "scaling_efficiency"])


def _mean_part(summaries: pd.DataFrame, parts: tuple[str, ...]) -> float | None:
    values = []
    for _, s in summaries.iterrows():
        tb = s.get("time_breakdown_s")
        if isinstance(tb, dict) and all(p in tb and tb[p] is not None for p in parts):
            values.append(sum(float(tb[p]) for p in parts))
    return sum(values) / len(values) if values else None


def _figure_div(fig: go.Figure) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"responsive": True})


def _section(title: str, body: str, note: str = "") -> str:
    note_html = f"<p class='note'>{html.escape(note)}</p>" if note else ""
    return f"<section><h2>{html.escape(title)}</h2>{note_html}{body}</section>\n"


def _table(frame: pd.DataFrame, percent: tuple[str, ...] = ()) -> str:
    shown = frame.copy()
    for col in percent:
        if col in shown.columns:
            shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{100 * float(v):.2f}%")
    return shown.to_html(index=False, border=0, classes="runs", na_rep="", float_format=lambda v: f"{v:.4g}")


def render_report(summaries: pd.DataFrame, metrics: pd.DataFrame, title: str = "gtopk-lab report") -> str:
    """The report's HTML text from ``(summaries, metrics)`` frames (see :func:`write_report`)."""
    parts: list[str] = []
    completed = _completed(summaries)
    run_cols = [c for c in ("run_id", "status", "method", "workers", "density", "k", "numel", "bandwidth_bps",
                            "latency_s", "iterations", "final_train_loss", "final_test_accuracy",
                            "samples_per_s_wall", "samples_per_s_virtual", "bytes_sent_per_rank_per_iter")
                if c in summaries.columns]
    parts.append(_section(f"Runs ({len(completed)} completed of {len(summaries)})",
                          _table(summaries[run_cols], percent=("final_test_accuracy",))
                          if len(summaries) else "<p>No runs in this folder.</p>"))
    done_ids = set(completed["run_id"]) if "run_id" in completed.columns else set()
    m = metrics[metrics["run_id"].isin(done_ids)] if "run_id" in metrics.columns else metrics
    if len(m) and "kind" in m.columns:
        parts.append(_section("Convergence", _figure_div(figures.convergence_figure(m, x="iteration"))
                              + _figure_div(figures.convergence_figure(m, x="virtual_time_s")),
                              "Train loss (mean over ranks) and test accuracy per run; colour = method, "
                              "dash = density."))
    if len(completed):
        measured = measured_scaling_table(summaries, "virtual")
        try:
            predicted = predicted_scaling_table(summaries)
        except (ImportError, ValueError, TypeError) as exc:  # model unavailable or bad sizes
            predicted = None
            parts.append(f"<p class='note'>model prediction unavailable: {html.escape(str(exc))}</p>")
        if len(measured):
            parts.append(_section(
                "Scaling efficiency",
                _figure_div(figures.scaling_efficiency_figure(measured, predicted, time_basis="virtual"))
                + _table(measured.drop(columns=["run_id"]), percent=("scaling_efficiency",)),
                "throughput(P) / (P * throughput(1)) on the virtual clock (compute measured, "
                "communication modelled on each run's network). Dashed: alpha-beta model. Open markers: "
                "the paper's 32 workers on 1 GbE. " + baseline_note(measured["baseline"])))
        try:
            parts.append(_section("Time per iteration", _figure_div(figures.time_breakdown_figure(completed))))
        except ValueError:
            pass
        if "bytes_sent_per_rank_per_iter" in completed.columns and completed["bytes_sent_per_rank_per_iter"].notna().any():
            vol = completed[completed["bytes_sent_per_rank_per_iter"].notna()]
            parts.append(_section("Communication volume", _figure_div(figures.comm_volume_figure(vol))))
    paper = figures.paper_scaling_table().pivot(index="model", columns="method", values="scaling_efficiency")
    paper = paper.reset_index()[["model", "dense", "topk", "gtopk"]]
    paper.columns.name = None
    parts.append(_section("Paper: scaling efficiency at 32 workers, 1 GbE (Shi et al., ICDCS'19)",
                          _table(paper, percent=("dense", "topk", "gtopk"))))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = (f"<meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script>"
            "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px}"
            "table.runs{border-collapse:collapse;font-size:13px;margin:1em 0}"
            "table.runs td,table.runs th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}"
            ".note{color:#555}</style>")
    return (f"<!DOCTYPE html>\n<html><head>{head}</head><body>\n<h1>{html.escape(title)}</h1>\n"
            f"<p class='note'>generated {stamp} with plotly {plotly.__version__}</p>\n"
            + "".join(parts) + "</body></html>\n")


def write_report(results_dir: str | os.PathLike[str], html_path: str | os.PathLike[str]) -> Path:
    """Write the self-contained HTML report of every run under ``results_dir``.

    Raises ``ValueError`` when ``results_dir`` is not a directory. Returns the path written
    (atomically: a temporary file in the same folder, then ``os.replace``).
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise ValueError(f"results_dir={str(results_dir)!r} is invalid: no such directory "
                         "(expected a folder of runs written by gtopk-lab run/sweep)")
    summaries, metrics = load_runs(root)
    text = render_report(summaries, metrics, title=f"gtopk-lab report: {root.resolve().name}")
    out = Path(html_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out
