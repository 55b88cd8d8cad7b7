"""Self-contained HTML report of a results folder.

:func:`write_report` reads ``<results_dir>/<run_id>/{config,metrics,summary}`` with
``gtopk_lab.orchestration.results.load_runs`` and writes one HTML file that opens
offline: plotly.js (from the installed plotly package) is inlined once in ``<head>``, each
figure is a ``<div>`` drawn by it, and tables are plain HTML. No CDN, no kernel.

Every run is a point of a study: its ``seed`` (from config.json) and ``source`` (real ranks /
simulator) join the summary (:func:`~gtopk_lab.plotting.report_tables.with_points`), so a
point divides by the dense P = 1 run of its own link, seed and source, and seeds average.
Sections, after a one-line overview and links to each:

1. scaling efficiency (:mod:`~gtopk_lab.plotting.report_figures`): mean over seeds with
   +- std error bars, the alpha-beta(-gamma) prediction dashed, a panel per link, the
   paper's 32-worker values as markers on 1 GbE; the method x P table (mean +- std (n))
   and the model check (which points not to trust)
2. convergence vs iteration and vs virtual time, per link: a line per point, its shade
   of the method's colour = P, seeds averaged with a +- std band
3. time per iteration by phase (per link), communication volume
4. runs: at most a dozen narrow columns with short run ids (the full id on hover), the
   fields every run shares said once above, a folded detail view (full ids, sizes,
   timings, errors)
5. time to a target accuracy with confidence intervals, and the Pareto figures (final
   accuracy against bytes sent per rank and against virtual time, one point per run, the
   frontier drawn): :mod:`~gtopk_lab.plotting.report_outcomes`
6. the paper's 32-worker 1 GbE table

``write_report(..., figures_dir=DIR)`` (``gtopk-lab report --figures DIR``) also writes each
figure as a file (PNG by default; :func:`~gtopk_lab.plotting.export.save_figures`).

:func:`measured_scaling_table` / :func:`predicted_scaling_table` (the sweep-era tables, one
baseline per network, no seeds or sources) live in :mod:`~gtopk_lab.plotting.scaling_tables`
and stay importable from here.

Cost: O(rows) pandas work, one small JSON read per run, plus about 4.8 MB of inlined plotly.js.

Example::

    from gtopk_lab.plotting.report import write_report
    write_report(results_home("demo"), results_home("demo") / "report.html")   # gtopk_lab.results_home
"""

from __future__ import annotations

import datetime as _dt
import html
import math
import os
from pathlib import Path

import pandas as pd
import plotly
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from gtopk_lab.analysis.intervals import ONE_SEED_NOTE, interval_note
from gtopk_lab.methods import display_order
from gtopk_lab.orchestration.results import load_runs
from gtopk_lab.plotting import figures
from gtopk_lab.plotting.export import save_figures
from gtopk_lab.plotting.report_figures import efficiency_figure, paper_applies, point_convergence_figure
from gtopk_lab.plotting.report_outcomes import outcome_sections
from gtopk_lab.plotting.report_tables import (check_lines, constant_fields, efficiency_pivot, run_details,
                                              runs_table, study_tables, with_points)
from gtopk_lab.plotting.scaling_tables import completed as _completed
from gtopk_lab.plotting.scaling_tables import measured_scaling_table, predicted_scaling_table

__all__ = ["write_report", "measured_scaling_table", "predicted_scaling_table", "render_report"]


def _figure_div(fig: go.Figure, sink: list[tuple[str, go.Figure]] | None = None, stem: str = "figure") -> str:
    """The figure's ``<div>``; ``sink`` (the report's list of figures to write) gets it too."""
    if sink is not None:
        sink.append((stem, fig))
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"responsive": True})


def _section(title: str, body: str, note: str = "", anchor: str = "") -> str:
    note_html = f"<p class='note'>{html.escape(note)}</p>" if note else ""
    anchor_attr = f" id='{anchor}'" if anchor else ""
    return f"<section{anchor_attr}><h2>{html.escape(title)}</h2>{note_html}{body}</section>\n"


def _table(frame: pd.DataFrame, percent: tuple[str, ...] = (), classes: str = "runs") -> str:
    shown = frame.copy()
    for col in percent:
        if col in shown.columns:
            shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{100 * float(v):.2f}%")
    return shown.to_html(index=False, border=0, classes=classes, na_rep="", float_format=lambda v: f"{v:.4g}")


def _runs_html(points: pd.DataFrame) -> str:
    """The compact runs table (full ids as tooltips), the fields all runs share said once
    above it, and the detail view (full ids, timings, errors) folded below it."""
    table = runs_table(points)
    details = run_details(points)
    full = dict(zip(details["run"], details["run id"]))
    # Cells are escaped here and the table written with escape=False, so that the run cell
    # can carry its full id as a tooltip and a failed status its colour.
    shown = table.apply(lambda col: col.map(lambda v: html.escape("" if v is None or (isinstance(v, float)
                                                                                      and math.isnan(v)) else str(v))))
    shown["run"] = [f"<span class='id' title='{html.escape(full[r])}'>{html.escape(r)}</span>" for r in table["run"]]
    shown["status"] = [f"<span class='bad'>{html.escape(v)}</span>" if v in ("failed", "cancelled", "crashed") else html.escape(v)
                       for v in table["status"].astype(str)]
    body = shown.to_html(index=False, border=0, classes="runs compact", na_rep="", escape=False)
    shared = constant_fields(points)
    head = ("<p class='note'>every run: " + ", ".join(f"{html.escape(k)} {html.escape(v)}" for k, v in shared.items())
            + ". Hover a run for its full id.</p>") if shared else "<p class='note'>Hover a run for its full id.</p>"
    folded = ("<details><summary>Run details: full ids, sizes, timings, errors</summary>"
              + details.to_html(index=False, border=0, classes="runs details", na_rep="") + "</details>")
    return head + body + folded


def _scaling_html(points: pd.DataFrame, sink: list[tuple[str, go.Figure]] | None = None) -> str:
    """Figure (error bars over seeds, model dashed, paper markers), the method x P table
    and the model check, from the seed- and source-aware study tables."""
    table, predicted, check = study_tables(points, "virtual")
    if table.empty:
        return ""
    fig = efficiency_figure(table, predicted)
    seeds = int(table["n"].max())
    paper = paper_applies(table)
    note = ("throughput(P) / (P x throughput of dense S-SGD at P=1) on the virtual clock (compute measured, "
            "communication modelled on each run's link); every point against the dense P=1 run of its own link, "
            "seed and source (real ranks / simulator). "
            + (f"Mean over seeds; {interval_note(seeds)}. " if seeds > 1 else f"One seed per point ({ONE_SEED_NOTE}). ")
            + "Thin dashed: the alpha-beta(-gamma) prediction from this folder's own dense P=1 compute. "
            + ("Open markers at P=32: the paper's measured values on 1 GbE (Shi et al., ICDCS'19)."
               if paper else "The paper's 32-worker values are for 1 GbE, which no run here used: not drawn."))
    lines = check_lines(check)
    check_html = ("<ul class='check'>" + "".join(
        f"<li class='{'bad' if 'do not trust' in line else 'ok'}'>{html.escape(line)}</li>" for line in lines)
        + "</ul>") if lines else ""
    return _section("Scaling efficiency", _figure_div(fig, sink, "scaling_efficiency")
                    + "<h3>Efficiency per method and P (percent; mean [95% confidence interval] (n) over seeds)</h3>"
                    + _table(efficiency_pivot(table), classes="runs pivot")
                    + ("<h3>Model check (measured vs alpha-beta, 10-point tolerance)</h3>" + check_html
                       if check_html else ""),
                    note, anchor="scaling")


def render_report(summaries: pd.DataFrame, metrics: pd.DataFrame, title: str = "gtopk-lab report", *,
                  target_accuracy: float | None = None,
                  figures_out: list[tuple[str, go.Figure]] | None = None) -> str:
    """The report's HTML text from ``(summaries, metrics)`` frames (see :func:`write_report`);
    ``figures_out`` receives every figure as ``(file stem, figure)``."""
    parts: list[str] = []
    sink = figures_out
    points = with_points(summaries) if len(summaries) else summaries
    completed = _completed(points)
    parts.append(_scaling_html(completed, sink) if len(completed) else "")
    done_ids = set(completed["run_id"]) if "run_id" in completed.columns else set()
    m = metrics[metrics["run_id"].isin(done_ids)] if "run_id" in metrics.columns else metrics
    if len(m) and "kind" in m.columns:
        seeds = int(completed.groupby(["method", "workers", "link", "source"], dropna=False)["run_id"]
                    .count().max()) if len(completed) else 1
        # one pair of figures per link: the legend of one figure stays a few rows long
        by_link = _by_link(completed)
        body = ""
        for link, runs in by_link:
            suffix = f", {link}" if len(by_link) > 1 else ""
            for x, name in (("iteration", "iteration"), ("virtual_time_s", "virtual time (s)")):
                if x not in m.columns:  # rows written without a clock column: iterations only
                    continue
                stem = "convergence_" + ("iteration" if x == "iteration" else "time") + _stem(link, len(by_link))
                body += _figure_div(point_convergence_figure(m, runs, x=x, title=f"Convergence vs {name}{suffix}"),
                                    sink, stem)
        parts.append(_section(
            "Convergence", body,
            "Train loss (mean over ranks) and test accuracy (rank 0) per point; colour = method, its shade = P "
            "(light: smallest P, dark: largest; marker symbol = P on the accuracy panel), dash = density."
            + (f" The seeds of a point are averaged; {interval_note(seeds)}." if seeds > 1
               else f" {ONE_SEED_NOTE[0].upper() + ONE_SEED_NOTE[1:]}."),
            anchor="convergence"))
    if len(completed):
        by_link = _by_link(completed)
        figs = ""
        for link, runs in by_link:
            try:
                figs += _figure_div(figures.time_breakdown_figure(
                    runs, title=f"Time per iteration by phase{', ' + str(link) if len(by_link) > 1 else ''}"),
                    sink, "time_breakdown" + _stem(link, len(by_link)))
            except ValueError:  # runs without a breakdown (e.g. written by an older version)
                pass
        if figs:
            parts.append(_section("Time per iteration", figs, "Mean seconds per iteration of each phase, "
                                  "averaged over the runs (seeds, sources) of a method and P.", anchor="time"))
        if "bytes_sent_per_rank_per_iter" in completed.columns and completed["bytes_sent_per_rank_per_iter"].notna().any():
            vol = completed[completed["bytes_sent_per_rank_per_iter"].notna()]
            parts.append(_section("Communication volume", _figure_div(figures.comm_volume_figure(vol), sink,
                                                                      "communication_volume"), anchor="volume"))
        parts.append(outcome_sections(completed, m, lambda stem, fig: _figure_div(fig, sink, stem), _section,
                                      target_accuracy))
    parts.append(_section(f"Runs ({len(completed)} completed of {len(summaries)})",
                          _runs_html(points) if len(summaries) else "<p>No runs in this folder.</p>",
                          anchor="runs"))
    paper = figures.paper_scaling_table().pivot(index="model", columns="method", values="scaling_efficiency")
    shown_methods = sorted(paper.columns, key=display_order)  # the paper's methods, in display order
    paper = paper.reset_index()[["model", *shown_methods]]
    paper.columns.name = None
    parts.append(_section("Paper: scaling efficiency at 32 workers, 1 GbE (Shi et al., ICDCS'19)",
                          _table(paper, percent=tuple(shown_methods)), anchor="paper"))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = (f"<meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script>"
            f"<style>{_CSS}</style>")
    toc = " · ".join(f"<a href='#{a}'>{t}</a>" for a, t in (
        ("scaling", "scaling efficiency"), ("convergence", "convergence"), ("time", "time per iteration"),
        ("volume", "communication volume"), ("tta", "time to accuracy"), ("pareto", "Pareto"), ("runs", "runs"),
        ("paper", "paper"))
        if f"id='{a}'" in "".join(parts))
    return (f"<!DOCTYPE html>\n<html><head>{head}</head><body>\n<h1>{html.escape(title)}</h1>\n"
            f"<p class='note'>{html.escape(_overview(summaries, points))} · generated {stamp} with plotly "
            f"{plotly.__version__}</p>\n<nav>{toc}</nav>\n"
            + "".join(parts) + "</body></html>\n")


#: Narrow, readable tables: small type, no wrapping inside numbers, ids in monospace.
_CSS = ("body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1250px;padding:0 1em;color:#222}"
        "h2{margin-top:1.6em;border-bottom:1px solid #ccc}h3{font-size:15px;margin:1.2em 0 .3em}"
        "nav a{margin-right:.2em}"
        "table.runs{border-collapse:collapse;font-size:13px;margin:.6em 0}"
        "table.runs td,table.runs th{padding:3px 9px;border-bottom:1px solid #e3e3e3;text-align:right;"
        "white-space:nowrap}"
        "table.runs th{background:#f4f4f4;position:sticky;top:0}"
        "table.runs tbody tr:hover{background:#f7faff}"
        "span.id{font-family:ui-monospace,monospace;color:#555;cursor:help}"
        "span.bad,li.bad{color:#b00020}li.ok{color:#236b23}"
        "table.details td{white-space:normal;max-width:28em;word-break:break-word;text-align:left}"
        "details{margin:.6em 0}summary{cursor:pointer;color:#345}"
        ".note{color:#555;max-width:75em}ul.check{font-size:14px}")


def _by_link(points: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """``points`` split by link, slowest link first (the paper's 1 GbE before 10 GbE)."""
    if "link" not in points.columns or points.empty:
        return [("", points)]
    speed = pd.to_numeric(points["bandwidth_bps"], errors="coerce").fillna(math.inf) \
        if "bandwidth_bps" in points.columns else pd.Series(0.0, index=points.index)
    order = points.assign(_bps=speed).groupby("link")["_bps"].min().sort_values(kind="stable")
    return [(str(link), points[points["link"] == link]) for link in order.index]


def _overview(summaries: pd.DataFrame, points: pd.DataFrame) -> str:
    """One line: how many runs, which methods, P, links, seeds and sources."""
    if summaries.empty:
        return "no runs"
    status = summaries["status"].value_counts().to_dict() if "status" in summaries.columns else {}
    parts = [f"{len(summaries)} runs (" + ", ".join(f"{n} {s}" for s, n in status.items()) + ")"]
    parts.append("links " + ", ".join(link for link, _ in _by_link(points)))
    for col, name in (("method", "methods"), ("workers", "P"), ("seed", "seeds"), ("source", "sources")):
        if col in points.columns:
            values = sorted(points[col].dropna().unique(), key=lambda v: display_order(v)
                            if isinstance(v, str) else (0, v))
            parts.append(f"{name} " + ", ".join(str(v) for v in values))
    return "; ".join(parts)


def _stem(link: str, links: int) -> str:
    """``_1GbE`` for a figure of one link among several (a safe file name), else nothing."""
    return "" if links <= 1 else "_" + "".join(c if c.isalnum() or c in "-." else "_" for c in str(link))


def write_report(results_dir: str | os.PathLike[str], html_path: str | os.PathLike[str], *,
                 figures_dir: str | os.PathLike[str] | None = None, figure_format: str = "png",
                 target_accuracy: float | None = None) -> Path:
    """Write the self-contained HTML report of every run under ``results_dir``.

    Raises ``ValueError`` when ``results_dir`` is not a directory. Returns the path written
    (atomically: a temporary file in the same folder, then ``os.replace``). With
    ``figures_dir``, every figure of the report is also written there as
    ``<stem>.<figure_format>`` ("png", "svg", "pdf" or "html"; PNG/SVG/PDF need kaleido
    and a Chromium, a ``RuntimeError`` in one line otherwise), before the report is.
    ``target_accuracy``: the time-to-accuracy figure's target (default: 90% of dense's
    worst final accuracy at P > 1).
    """
    if figure_format not in ("png", "svg", "pdf", "html"):
        raise ValueError(f"figure_format={figure_format!r} is invalid: expected png, svg, pdf or html")
    root = Path(results_dir)
    if not root.is_dir():
        raise ValueError(f"results_dir={str(results_dir)!r} is invalid: no such directory "
                         "(expected a folder of runs written by gtopk-lab run/sweep)")
    summaries, metrics = load_runs(root)
    collected: list[tuple[str, go.Figure]] = []
    text = render_report(summaries, metrics, title=f"gtopk-lab report: {root.resolve().name}",
                         target_accuracy=target_accuracy, figures_out=collected)
    if figures_dir is not None:
        folder = Path(figures_dir)
        save_figures([(fig, folder / f"{stem}.{figure_format}") for stem, fig in collected])
    out = Path(html_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out
