"""The HTML report's outcome sections: time to a target accuracy with confidence intervals,
and the Pareto figures (final accuracy, or loss, against bytes sent per rank and against
virtual time; one point per run, the frontier drawn).

:func:`outcome_figures` builds the figures from the report's points (completed runs with
``seed``, ``source``, ``link``: :func:`~gtopk_lab.plotting.report_tables.with_points`) and
metric rows:

1. the target accuracy: the caller's, else
   :func:`~gtopk_lab.analysis.outcomes.auto_target_accuracy` (90% of dense's worst final
   accuracy at P > 1)
2. :func:`~gtopk_lab.analysis.outcomes.time_to_accuracy_table` ->
   :func:`~gtopk_lab.plotting.figures_outcomes.time_to_accuracy_figure`
3. :func:`~gtopk_lab.analysis.outcomes.run_outcomes` -> one
   :func:`~gtopk_lab.plotting.figures_outcomes.pareto_figure` per cost axis; accuracy where
   the runs have one, else the final loss

:func:`outcome_sections` wraps them into the report's sections. Cost: O(rows log rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd
import plotly.graph_objects as go

from gtopk_lab.analysis.outcomes import auto_target_accuracy, run_outcomes, time_to_accuracy_table
from gtopk_lab.plotting.figures_outcomes import pareto_figure, time_to_accuracy_figure

__all__ = ["outcome_figures", "outcome_sections"]


def outcome_figures(points: pd.DataFrame, metrics: pd.DataFrame, target_accuracy: float | None = None
                    ) -> tuple[float, list[tuple[str, go.Figure]]]:
    """Steps 1-3: (target used, [(file stem, figure), ...]); no figure where nothing applies."""
    outcomes = run_outcomes(points) if len(points) else pd.DataFrame()
    figures: list[tuple[str, go.Figure]] = []
    if outcomes.empty:
        return math.nan, figures
    target = auto_target_accuracy(outcomes) if target_accuracy is None else float(target_accuracy)
    if math.isfinite(target) and len(metrics) and "test_accuracy" in metrics.columns:
        table = time_to_accuracy_table(points, metrics, target)
        if len(table) and (table["reached"] > 0).any():
            figures.append(("time_to_accuracy", time_to_accuracy_figure(table)))
    y = "final_test_accuracy" if outcomes["final_test_accuracy"].notna().any() else "final_loss"
    for x, stem in (("bytes_sent_per_rank", "pareto_bytes"), ("virtual_time_s", "pareto_time")):
        if outcomes[x].notna().any() and outcomes[y].notna().any():
            figures.append((stem, pareto_figure(outcomes, x=x, y=y)))
    return target, figures


def outcome_sections(points: pd.DataFrame, metrics: pd.DataFrame, figure_div: Callable[[str, go.Figure], str],
                     section: Callable[..., str], target_accuracy: float | None = None) -> str:
    """The two sections' HTML; ``figure_div(stem, fig)`` and ``section(title, body, note,
    anchor=...)`` are the report's own."""
    target, figures = outcome_figures(points, metrics, target_accuracy)
    found = dict(figures)
    parts = ""
    if "time_to_accuracy" in found:
        how = "given" if target_accuracy is not None else "90% of dense S-SGD's worst final accuracy at P > 1"
        parts += section(
            "Time to accuracy", figure_div("time_to_accuracy", found["time_to_accuracy"]),
            f"Virtual seconds until a run's first evaluation reached {target:.0%} test accuracy ({how}); the mean "
            "over the seeds that reached it, error bars its 95% Student-t confidence interval (none with one seed). "
            "Points no seed reached are named under the title.", anchor="tta")
    pareto = "".join(figure_div(stem, found[stem]) for stem in ("pareto_bytes", "pareto_time") if stem in found)
    if pareto:
        parts += section(
            "Accuracy against cost (Pareto)", pareto,
            "One point per run: its final accuracy (or loss) against the bytes one rank sent over the whole run, "
            "and against the run's virtual time. The dashed staircase joins the runs that no other run beats on "
            "both axes at once.", anchor="pareto")
    return parts
