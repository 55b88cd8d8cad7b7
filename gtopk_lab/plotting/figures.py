"""Plotly figure builders: DataFrames in, ``go.Figure`` out.

Every function here is pure (no Dask, no torch, no I/O): it reads frames in the schemas
of docs/architecture.md and returns a ``plotly.graph_objects.Figure``. The live variants
in :mod:`gtopk_lab.plotting.live` and the HTML report in :mod:`gtopk_lab.plotting.report` reuse
these builders, so a figure looks the same in a notebook, a live widget and a report.

Inputs
------
- ``metrics``: metric rows (``kind`` = "iter" | "epoch", ``rank``, ``iteration``, ``epoch``,
  ``method``, ``workers``, ``density``, ``k``, ``train_loss``, ``test_accuracy``,
  ``wall_time_s``, ``virtual_time_s``, ...) optionally with a ``run_id`` column (as
  ``results.load_runs`` returns them); without one, runs are told apart by
  (method, density, workers).
- ``summaries``: one row per run (``summary.json`` fields).
- scaling tables: ``method``, ``workers``, ``scaling_efficiency`` (fraction 0..1), and
  optionally ``bandwidth`` (a label) to draw one line per network.

Cost: every builder is O(rows) in pandas plus the size of the traces it emits.

Where the builders live (this module re-exports them, so ``figures.<name>`` keeps working):

- :mod:`.figures_base`         method colours, legend labels, run grouping, frame checks;
- :mod:`.figures_convergence`  train loss / test accuracy against iteration, epoch or time;
- :mod:`.figures_scaling`      scaling efficiency, time per phase, bytes per rank, the paper's numbers;
- :mod:`.figures_topk`         gradient histogram, Top-k error, GaussianK's count;
- :mod:`.figures_methods`      time to a target loss per network, loss against the virtual clock;
- :mod:`.figures_outcomes`     time to a target accuracy with confidence intervals, Pareto figures.

Example::

    from gtopk_lab.plotting import figures
    fig = figures.convergence_figure(metrics_df, x="epoch")
    fig.show()
"""

from __future__ import annotations

from gtopk_lab.plotting.figures_base import X_AXES, method_color, run_label
from gtopk_lab.plotting.figures_convergence import convergence_figure, convergence_frames
from gtopk_lab.plotting.figures_methods import loss_vs_time_figure, time_to_target_figure
from gtopk_lab.plotting.figures_outcomes import pareto_figure, time_to_accuracy_figure
from gtopk_lab.plotting.figures_scaling import (
    PAPER_BREAKDOWN_GTOPK_32_1GBE_S, PAPER_SCALING_EFFICIENCY_32_1GBE, comm_bytes_per_rank_formula,
    comm_volume_figure, paper_scaling_table, scaling_efficiency_figure, time_breakdown_figure,
)
from gtopk_lab.plotting.figures_topk import (
    gaussiank_count_figure, gradient_histogram_figure, topk_error_figure, topk_error_table,
)

__all__ = [
    "method_color",
    "PAPER_SCALING_EFFICIENCY_32_1GBE",
    "PAPER_BREAKDOWN_GTOPK_32_1GBE_S",
    "X_AXES",
    "run_label",
    "convergence_figure",
    "convergence_frames",
    "scaling_efficiency_figure",
    "time_breakdown_figure",
    "comm_volume_figure",
    "comm_bytes_per_rank_formula",
    "gradient_histogram_figure",
    "topk_error_table",
    "topk_error_figure",
    "gaussiank_count_figure",
    "paper_scaling_table",
    "time_to_target_figure",
    "loss_vs_time_figure",
    "time_to_accuracy_figure",
    "pareto_figure",
]
