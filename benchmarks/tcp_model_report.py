"""Tables and the figure of ``benchmarks/tcp_model.py``: model error before and after the TCP terms."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gtopk_lab.provenance import cpu_model, short_commit

LABELS = {"ring_allreduce": "dense ring", "topk_allgather": "Top-k allgather", "gtopk_butterfly": "gTop-k butterfly",
          "gtopk_tree": "gTop-k tree", "oktopk_allreduce": "Ok-Topk", "incast": "incast (P-1 -> 1)"}


def environment() -> dict[str, Any]:
    """CPU model, cores, commit and load average, for every figure."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)), "commit": short_commit(), "load": load}


def _err(pred: float, meas: float) -> str:
    return f"{(pred - meas) / meas:+.0%}"


def error_table(rows: list[dict[str, Any]]) -> str:
    """One line per call: measured, the three predictions (ms) and their relative errors; then
    the mean absolute error per group (fitted on / held out)."""
    lines = ["| case | collective | numel | rho | P | cores | measured ms | ab ms | +cpu ms | +tcp ms "
             "| err ab | err +cpu | err +tcp | role |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[str, list[tuple[float, float, float]]] = {}
    for r in rows:
        role = "fit" if r["kind"] == "sweep" and r["workers"] <= 4 else "held out"
        m = r["median_s"]
        rho = "-" if r["collective"] == "ring_allreduce" else f"{r['density']:g}"
        lines.append(f"| {r['kind']} | {LABELS[r['collective']]} | {r['numel'] / 1e6:g}M | {rho} | {r['workers']} "
                     f"| {r['cores']:.2f} | {m * 1e3:.2f} | {r['ab_s'] * 1e3:.2f} | {r['ab_cpu_s'] * 1e3:.2f} "
                     f"| {r['all_s'] * 1e3:.2f} | {_err(r['ab_s'], m)} | {_err(r['ab_cpu_s'], m)} "
                     f"| {_err(r['all_s'], m)} | {role} |")
        key = f"{r['kind']}, P = {r['workers']}" if r["kind"] == "sweep" else r["kind"]
        groups.setdefault(key, []).append(tuple(abs(x - m) / m for x in (r["ab_s"], r["ab_cpu_s"], r["all_s"])))
    lines += ["", "| group | calls | mean abs err ab | +cpu | +tcp | within 15% (+tcp) |", "|---|---|---|---|---|---|"]
    for key, errs in groups.items():
        n = len(errs)
        means = [sum(e[i] for e in errs) / n for i in range(3)]
        within = sum(1 for e in errs if e[2] <= 0.15)
        lines.append(f"| {key} | {n} | {means[0]:.0%} | {means[1]:.0%} | {means[2]:.0%} | {within}/{n} |")
    return "\n".join(lines) + "\n"


def write_figure(rows: list[dict[str, Any]], stem: Path) -> str:
    """Measured vs predicted per call (log-log, y = x dashed): plain alpha-beta and all terms.
    PNG through kaleido when it works, and always HTML; returns the paths written."""
    import plotly.graph_objects as go

    fig = go.Figure()
    meas = [r["median_s"] * 1e3 for r in rows]
    text = [f"{r['kind']}: {LABELS[r['collective']]} {r['numel'] / 1e6:g}M rho {r['density']:g} P={r['workers']}"
            for r in rows]
    fig.add_trace(go.Scatter(x=meas, y=[r["ab_s"] * 1e3 for r in rows], mode="markers", name="alpha-beta (calibrated)",
                             text=text, marker={"symbol": "circle-open", "size": 9}))
    fig.add_trace(go.Scatter(x=meas, y=[r["all_s"] * 1e3 for r in rows], mode="markers",
                             name="+ CPU contention + TCP terms", text=text, marker={"size": 7}))
    lo, hi = min(meas + [r["ab_s"] * 1e3 for r in rows]) * 0.7, max(meas) * 1.4
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="measured = predicted",
                             line={"dash": "dash", "color": "grey"}))
    fig.update_layout(title="Collective call time on the testbed: measured vs predicted",
                      xaxis={"title": "measured ms (median, slowest rank)", "type": "log"},
                      yaxis={"title": "predicted ms", "type": "log"}, width=900, height=650)
    return save_figure(fig, stem)


def save_figure(fig: Any, stem: Path) -> str:
    """``stem``.html always and ``stem``.png through kaleido when it works; the paths written."""
    html = stem.with_suffix(".html")
    fig.write_html(str(html), include_plotlyjs="cdn")
    written = [str(html)]
    try:
        fig.write_image(str(stem.with_suffix(".png")))
        written.append(str(stem.with_suffix(".png")))
    except Exception as exc:  # kaleido without a Chromium it can start: the HTML stands alone
        written.append(f"(no PNG: {type(exc).__name__}: {str(exc)[:120]})")
    return ", ".join(written)
