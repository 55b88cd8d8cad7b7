"""Figures of the HTML report (:mod:`gtopk_lab.plotting.report`) that tell points apart:
one shade of the method's colour per P, mean over seeds with its 95% Student-t confidence
interval (:mod:`~gtopk_lab.analysis.intervals`), the paper's markers.

1. :func:`point_convergence_figure`: train loss and test accuracy per *point* (method,
   density, P, link, source), the seeds of a point averaged (a band of the confidence
   interval when there are several). Colour = method, its shade = P (light for the smallest P, dark for the
   largest), dash = density, marker symbol = P on the accuracy panel, so that P = 2 and
   P = 16 of one method never look alike
2. :func:`efficiency_figure`: scaling efficiency vs P from
   :func:`~gtopk_lab.plotting.report_tables.study_tables` (mean over seeds with error
   bars of the confidence interval, ``efficiency_ci_low`` / ``_high``, when n > 1; simulated points dotted), the alpha-beta(-gamma) prediction as a
   thin dashed line per series, and the paper's 32-worker 1 GbE values
   (:data:`~gtopk_lab.plotting.figures_scaling.PAPER_SCALING_EFFICIENCY_32_1GBE`) as
   open markers where they apply: for the methods the paper ran, when a series is on a
   1 GbE-class link (:func:`paper_applies`)

Pure (pandas + plotly). Cost: O(rows) for the convergence, O(points) for the efficiency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gtopk_lab.analysis.intervals import interval_bounds, interval_columns
from gtopk_lab.methods import display_order, is_dense
from gtopk_lab.plotting.figures_base import density_dash, method_color
from gtopk_lab.plotting.figures_scaling import PAPER_SCALING_EFFICIENCY_32_1GBE

__all__ = ["shade", "point_convergence_figure", "efficiency_figure", "paper_applies",
           "PAPER_MODELS_SHOWN", "PAPER_LINK_BPS"]

#: The paper's models drawn as reference markers (their 32-worker values span the range).
PAPER_MODELS_SHOWN: tuple[str, ...] = ("ResNet-20 / CIFAR-10", "VGG-16 / CIFAR-10")
#: The paper's 1 GbE link (alpha-beta fit: beta = 9e-6 ms/B); links within 30% count as 1 GbE.
PAPER_LINK_BPS = 8.0 / 9e-9
_PAPER_SYMBOLS = ("circle-open", "square-open", "diamond-open", "triangle-up-open")
_P_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "x", "star", "hexagon")
#: Point identity in the convergence figure (seeds are averaged over).
_POINT_KEYS = ("method", "density", "workers", "link", "source")


def legend_below(fig: go.Figure, height: int, per_row: int = 5) -> go.Figure:
    """Put the legend under the plot, in a bottom margin sized to its rows, so that a long
    legend neither squeezes the plot nor covers the x axis title (as ``y=-0.2`` does)."""
    entries = sum(1 for t in fig.data if t.showlegend is not False and t.name)
    rows = max(1, math.ceil(entries / per_row))
    fig.update_layout(height=height + 24 * rows,
                      legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom",
                              "x": 0, "xanchor": "left"},
                      margin={"t": 80, "b": 70 + 24 * rows})
    return fig


def shade(color: str, i: int, n: int) -> str:
    """The ``i``-th of ``n`` shades of ``color`` (#rrggbb): mixed towards white for i = 0,
    towards black for i = n - 1, the colour itself in the middle."""
    r, g, b = (int(color[j:j + 2], 16) for j in (1, 3, 5))
    t = 0.0 if n <= 1 else i / (n - 1) * 2 - 1  # -1 .. 1
    if t < 0:
        mix = [c + (255 - c) * 0.55 * -t for c in (r, g, b)]
    else:
        mix = [c * (1 - 0.45 * t) for c in (r, g, b)]
    return "#" + "".join(f"{int(round(c)):02x}" for c in mix)


def _label(key: dict, several: dict[str, bool]) -> str:
    parts = [str(key["method"])]
    if key["density"] != "-":
        parts.append(f"ρ={key['density']}")
    parts.append(f"P={int(key['workers'])}")
    for field in ("link", "source"):
        if several[field]:
            parts.append(str(key[field]))
    return " ".join(parts)


def _run_curves(metrics: pd.DataFrame, x: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, test) per run: rank-mean train loss per iteration; rank-0 test accuracy."""
    it = metrics[metrics["kind"] == "iter"]
    agg = {"train_loss": "mean"} | ({} if x == "iteration" else {x: "max"})
    train = it.groupby(["run_id", "iteration"], sort=True).agg(agg).reset_index()
    ep = metrics[(metrics["kind"] == "epoch")]
    if "rank" in ep.columns:
        ep = ep[ep["rank"] == 0]
    columns = list(dict.fromkeys(["run_id", "iteration", x, "test_accuracy"]))  # x may be "iteration"
    test = ep[columns].dropna(subset=["test_accuracy"]) if "test_accuracy" in ep.columns \
        else pd.DataFrame(columns=columns)
    return train, test


def point_convergence_figure(metrics: pd.DataFrame, points: pd.DataFrame, x: str = "iteration",
                             title: str | None = None) -> go.Figure:
    """Step 1 of the module docstring. ``points``: one row per run with ``run_id`` and the
    point fields (:func:`~gtopk_lab.plotting.report_tables.with_points`); ``x``:
    "iteration" or a time column ("virtual_time_s", "wall_time_s")."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("train loss (mean over ranks)", "test accuracy"),
                        horizontal_spacing=0.09)
    if metrics.empty or points.empty or "run_id" not in metrics.columns:
        return fig.update_layout(title=title or "Convergence (no rows)", template="plotly_white")
    meta = points.set_index("run_id")[[c for c in _POINT_KEYS if c in points.columns]].copy()
    meta["density"] = [("-" if is_dense(str(m)) or pd.isna(d) else f"{float(d):g}")
                       for m, d in zip(meta["method"], meta["density"])]
    train, test = _run_curves(metrics[metrics["run_id"].isin(meta.index)], x)
    train, test = train.join(meta, on="run_id"), test.join(meta, on="run_id")
    several = {f: meta[f].nunique() > 1 for f in ("link", "source")}
    sparse = sorted({float(d) for d in meta["density"] if d != "-"}, reverse=True)
    # dash = density when the sparse runs have several, else dash = source (simulated
    # dotted) when there are both; dense and the densest sparse density draw solid
    dashes = density_dash(sparse) if len(sparse) > 1 else {}
    keys = list(meta.columns)
    ps_of = {m: sorted(g["workers"].unique()) for m, g in meta.groupby("method")}
    # every point's curves aggregated in one groupby each (group g = the g-th point in
    # order of appearance, as ngroup numbers them), not one per point
    by_point = train.groupby(keys, sort=False)
    train = train.assign(_g=by_point.ngroup())
    agg_x = {} if x == "iteration" else {"x": (x, "mean")}
    loss_of = train.groupby(["_g", "iteration"]).agg(loss=("train_loss", "mean"), std=("train_loss", "std"),
                                                     n=("train_loss", "size"), **agg_x)
    point_ids = train.dropna(subset=["_g"]).drop_duplicates("_g")[keys + ["_g"]]
    acc_of = test.merge(point_ids, on=keys, how="inner").groupby(["_g", "iteration"]).agg(
        acc=("test_accuracy", "mean"), **agg_x)
    with_acc = set(acc_of.index.get_level_values("_g"))
    groups = sorted(enumerate(by_point), key=lambda t: (display_order(str(t[1][0][0])), str(t[1][0][1:])))
    for g, (key_values, _) in groups:
        key = dict(zip(keys, key_values))
        ps = ps_of[key["method"]]
        i = ps.index(key["workers"])
        color = shade(method_color(str(key["method"])), i, len(ps))
        if dashes:
            dash = "solid" if key["density"] == "-" else dashes[float(key["density"])]
        else:
            dash = "dot" if several["source"] and key.get("source") == "simulated" else "solid"
        label = _label(key, several)
        stats = loss_of.xs(g, level="_g")
        xs = stats.index.to_numpy() if x == "iteration" else stats["x"].to_numpy()
        seeds = int(stats["n"].max())
        fig.add_trace(go.Scatter(x=xs, y=stats["loss"].to_numpy(), mode="lines", name=label, legendgroup=label,
                                 line={"color": color, "dash": dash, "width": 2},
                                 hovertemplate=f"{label}<br>{x}=%{{x:.4g}}<br>loss=%{{y:.4f}}"
                                               f"{' (mean of ' + str(seeds) + ' seeds)' if seeds > 1 else ''}"
                                               "<extra></extra>"), row=1, col=1)
        if seeds > 1:
            low, high = interval_columns(stats["loss"], stats["std"], stats["n"])
            upper, lower = high.fillna(stats["loss"]).to_numpy(), low.fillna(stats["loss"]).to_numpy()
            fig.add_trace(go.Scatter(x=list(xs) + list(xs[::-1]), y=list(upper) + list(lower[::-1]),
                                     fill="toself", mode="none", fillcolor=color, opacity=0.18,
                                     legendgroup=label, showlegend=False, hoverinfo="skip"), row=1, col=1)
        if g in with_acc:
            a = acc_of.xs(g, level="_g").reset_index()
            ax = a["iteration"] if x == "iteration" else a["x"]
            fig.add_trace(go.Scatter(x=ax.to_numpy(), y=a["acc"].to_numpy(), mode="lines+markers", name=label,
                                     legendgroup=label, showlegend=False,
                                     line={"color": color, "dash": dash, "width": 2},
                                     marker={"symbol": _P_SYMBOLS[i % len(_P_SYMBOLS)], "size": 8},
                                     hovertemplate=f"{label}<br>{x}=%{{x:.4g}}<br>accuracy=%{{y:.1%}}"
                                                   "<extra></extra>"), row=1, col=2)
    xtitle = {"iteration": "iteration", "virtual_time_s": "virtual time on the modelled network (s)",
              "wall_time_s": "wall-clock time (s)"}.get(x, x)
    fig.update_xaxes(title_text=xtitle)
    fig.update_yaxes(title_text="loss", row=1, col=1)
    fig.update_yaxes(title_text="accuracy", tickformat=".1~%", row=1, col=2)  # 30.5%, not 31% twice
    fig.update_layout(title=title or f"Convergence vs {xtitle}", template="plotly_white")
    return legend_below(fig, 440)


def _is_paper_link(bandwidth_bps: float, tolerance: float = 0.3) -> bool:
    return bool(abs(float(bandwidth_bps) - PAPER_LINK_BPS) <= tolerance * PAPER_LINK_BPS)


def paper_applies(table: pd.DataFrame, tolerance: float = 0.3) -> bool:
    """True when a point of ``table`` (``bandwidth_bps``) is on a 1 GbE-class link: within
    ``tolerance`` of the paper's fitted 1 GbE bandwidth, where its 32-worker values hold."""
    if table.empty or "bandwidth_bps" not in table.columns:
        return False
    bps = pd.to_numeric(table["bandwidth_bps"], errors="coerce").dropna()
    return any(_is_paper_link(b, tolerance) for b in bps)


def _links(table: pd.DataFrame) -> list[tuple[str, float]]:
    """(link name, bandwidth) of the table's links, slowest first (the paper's 1 GbE first)."""
    if table.empty:
        return []
    firsts = table.groupby("link", sort=False)["bandwidth_bps"].first()
    return sorted(((str(k), float(v)) for k, v in firsts.items()), key=lambda t: (t[1], t[0]))


def efficiency_figure(table: pd.DataFrame, predicted: pd.DataFrame | None = None,
                      paper_models: Sequence[str] = PAPER_MODELS_SHOWN, time: str = "virtual",
                      title: str | None = None) -> go.Figure:
    """Step 2 of the module docstring. ``table``: the ``efficiency`` frame of
    :func:`~gtopk_lab.plotting.report_tables.study_tables` (with ``link``); ``predicted``
    its ``predicted`` frame (same point columns + ``predicted``). Several links: one panel
    per link (slowest first), sharing the y axis and the legend."""
    table = table[table["efficiency_mean"].notna()] if len(table) else table
    links = _links(table)
    panels = len(links) > 1
    fig = make_subplots(rows=1, cols=len(links), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[name for name, _ in links]) if panels else go.Figure()
    col_of = {name: i + 1 for i, (name, _) in enumerate(links)}
    where = (lambda link: {"row": 1, "col": col_of[link]}) if panels else (lambda link: {})  # noqa: E731
    several = {"density": table["density"].nunique() > 1 if len(table) else False,
               "source": table["source"].nunique() > 1 if len(table) else False}
    keys = ["method", "_d", "link", "source", "bandwidth_bps", "latency_s"]
    frame = table.assign(_d=table["density"].fillna(-1.0)) if len(table) else table
    groups = sorted(frame.groupby(keys, sort=False), key=lambda t: (display_order(str(t[0][0])), str(t[0]))) \
        if len(frame) else []
    seen: set[str] = set()
    for (method, density, link, source, bps, lat), rows in groups:
        rows = rows.sort_values("workers")
        label = " ".join([str(method)] + ([f"ρ={density:g}"] if several["density"] and density >= 0 else [])
                         + ([str(source)] if several["source"] else []))
        color = method_color(str(method))
        if "efficiency_ci_low" in rows.columns:
            up, down = interval_bounds(rows["efficiency_mean"], rows["efficiency_ci_low"],
                                       rows["efficiency_ci_high"])
        else:  # a table from before the intervals: no bars rather than the wrong ones
            up = down = rows["efficiency_mean"].to_numpy() * 0.0
        up, down = up * 100, down * 100
        seeds = int(rows["n"].max())
        name = f"{label} ({link})" if panels else label
        fig.add_trace(go.Scatter(
            x=rows["workers"].to_numpy(), y=(rows["efficiency_mean"] * 100).to_numpy(), mode="lines+markers",
            name=label, legendgroup=label, showlegend=label not in seen,
            line={"color": color, "dash": "dot" if source == "simulated" else "solid", "width": 2.5},
            marker={"size": 9, "symbol": "circle" if source == "real" else "diamond"},
            error_y={"type": "data", "symmetric": False, "array": up, "arrayminus": down,
                     "visible": seeds > 1, "thickness": 1.5, "width": 6},
            customdata=list(zip(rows["n"].astype(int), up)),
            hovertemplate=f"{name}<br>P=%{{x}}<br>%{{y:.1f}}%"
                          + (" ± %{customdata[1]:.1f} (95% CI)" if seeds > 1 else "")
                          + " (n=%{customdata[0]})<extra></extra>"),
            **where(link))
        seen.add(label)
        if predicted is not None and len(predicted):
            pred = predicted[(predicted["method"] == method) & (predicted["source"] == source)
                             & (predicted["bandwidth_bps"] == bps) & (predicted["latency_s"] == lat)]
            pred = pred[pred["density"].fillna(-1.0) == density]
            if len(pred):
                pred = pred.groupby("workers", as_index=False)["predicted"].mean()
                fig.add_trace(go.Scatter(x=pred["workers"], y=pred["predicted"] * 100, mode="lines",
                                         name=f"{name}: alpha-beta", legendgroup=label, showlegend=False,
                                         line={"color": color, "dash": "dash", "width": 1},
                                         hovertemplate=f"{name}, alpha-beta model<br>P=%{{x}}<br>%{{y:.1f}}%"
                                                       "<extra></extra>"), **where(link))
    methods = set(table["method"]) if len(table) else set()
    paper_links = [name for name, bps in links if _is_paper_link(bps)]
    for link in paper_links:
        for i, model in enumerate(paper_models):
            values = [(m, v) for m, v in PAPER_SCALING_EFFICIENCY_32_1GBE[model].items() if m in methods]
            if not values:
                continue
            symbol = _PAPER_SYMBOLS[i % len(_PAPER_SYMBOLS)]
            name = f"paper, 32 workers, 1 GbE: {model.split(' /')[0]}"
            fig.add_trace(go.Scatter(
                x=[32] * len(values), y=[100 * v for _, v in values], mode="markers", name=name,
                legendgroup=name, showlegend=False,
                marker={"symbol": symbol, "size": 13, "color": [method_color(m) for m, _ in values],
                        "line": {"width": 2.5}},
                text=[m for m, _ in values],
                hovertemplate=f"paper (Shi et al. ICDCS'19), {model}<br>32 workers, 1 GbE<br>"
                              "%{text}: %{y:.1f}%<extra></extra>"), **where(link))
            if name not in seen:
                # The markers take their method's colour; the legend entry is grey, so it
                # names the paper's model (the symbol) without pretending to be one method.
                fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, legendgroup=name,
                                         marker={"symbol": symbol, "size": 12, "color": "#666",
                                                 "line": {"width": 2}}), **where(link))
                seen.add(name)
    for name, _ in links or [("", 0.0)]:
        ps = sorted(set(table[table["link"] == name]["workers"]) if len(table) else {1})
        if name in paper_links:
            ps = sorted(set(ps) | {32})
        fig.update_xaxes(title_text="workers P", type="log", tickvals=ps, ticktext=[str(p) for p in ps],
                         **where(name) if name else {})
    fig.update_yaxes(title_text=f"scaling efficiency (%, {time} clock)", rangemode="tozero",
                     **({"row": 1, "col": 1} if panels else {}))
    fig.update_layout(title=title or f"Scaling efficiency vs P ({time} clock; dense P=1 of the same link, "
                                     "seed and source = 100%)",
                      template="plotly_white")
    return legend_below(fig, 460)
