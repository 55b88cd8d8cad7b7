"""Figure builders on synthetic frames in the schema of docs/architecture.md."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from gtopk_lab.plotting import figures

pytestmark = pytest.mark.timeout(60)


def synthetic_run(run_id: str, method: str, workers: int, density: float, iterations: int = 20,
                  iters_per_epoch: int = 10, numel: int = 10_000, seed: int = 0) -> tuple[list[dict], dict]:
    """Metric rows of every rank and the summary of one run, shaped like train_rank's output."""
    rng = np.random.default_rng(seed)
    k = max(1, int(math.floor(density * numel)))
    bytes_sent = figures.comm_bytes_per_rank_formula(method, workers, numel, k)
    rows: list[dict] = []
    wall = virt = 0.0
    for it in range(iterations):
        wall += 0.01
        virt += 0.01 + bytes_sent * 8e-9
        for rank in range(workers):
            rows.append({
                "kind": "iter", "rank": rank, "iteration": it, "epoch": it / iters_per_epoch,
                "method": method, "workers": workers, "density": density, "k": k,
                "train_loss": 2.3 * math.exp(-it / 15) + 0.05 * rng.random(), "lr": 0.05,
                "compute_s": 0.006, "selection_s": 0.001, "comm_s": 0.002, "update_s": 0.001,
                "comm_model_s": bytes_sent * 8e-9, "bytes_sent": int(bytes_sent), "bytes_recv": int(bytes_sent),
                "wall_time_s": wall, "virtual_time_s": virt, "run_id": run_id,
            })
        if (it + 1) % iters_per_epoch == 0:
            rows.append({
                "kind": "epoch", "rank": 0, "iteration": it, "epoch": (it + 1) / iters_per_epoch,
                "method": method, "workers": workers, "density": density, "k": k,
                "train_loss": 2.3 * math.exp(-it / 15), "test_loss": 2.0 * math.exp(-it / 15),
                "test_accuracy": min(0.95, 0.1 + it / 25), "test_perplexity": float("nan"),
                "wall_time_s": wall, "virtual_time_s": virt, "run_id": run_id,
            })
    summary = {
        "run_id": run_id, "method": method, "workers": workers, "density": density, "k": k,
        "numel": numel, "bandwidth_bps": 1e9, "latency_s": 1e-4, "epochs": iterations // iters_per_epoch,
        "iterations": iterations, "final_train_loss": rows[-1]["train_loss"],
        "final_test_accuracy": rows[-1]["test_accuracy"], "wall_time_s": wall, "virtual_time_s": virt,
        "samples_per_s_wall": 32 * workers * iterations / wall,
        "samples_per_s_virtual": 32 * workers * iterations / virt,
        "bytes_sent_per_rank_per_iter": bytes_sent,
        "time_breakdown_s": {"compute": 0.006, "selection": 0.001, "communication": 0.002, "update": 0.001},
        "status": "completed", "error": None,
    }
    return rows, summary


def synthetic_frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summaries, metrics) of a small sweep: 4 methods x P in {1, 2, 4}."""
    all_rows, summaries = [], []
    for method, density in (("dense", 1.0), ("topk", 0.01), ("gtopk", 0.01), ("gaussiank", 0.01)):
        for workers in (1, 2, 4):
            rows, summary = synthetic_run(f"{method}-p{workers}", method, workers, density,
                                          seed=workers)
            all_rows += rows
            summaries.append(summary)
    return pd.DataFrame(summaries), pd.DataFrame(all_rows)


def _points(fig: go.Figure) -> int:
    return sum(len(t.x) for t in fig.data if t.x is not None)


@pytest.mark.parametrize("x", list(figures.X_AXES))
def test_convergence_one_trace_pair_per_run(x: str) -> None:
    summaries, metrics = synthetic_frames()
    fig = figures.convergence_figure(metrics, x=x)
    assert len(fig.data) == 2 * len(summaries)
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert "gtopk ρ=0.01 P=4" in names and "dense P=2" in names
    train = next(t for t in fig.data if t.name == "gtopk ρ=0.01 P=4" and t.xaxis == "x")
    assert len(train.x) == 20  # rank-mean: one point per iteration, not per rank
    rows = metrics[(metrics.run_id == "gtopk-p4") & (metrics.kind == "iter") & (metrics.iteration == 3)]
    assert train.y[3] == pytest.approx(rows.train_loss.mean())
    test = next(t for t in fig.data if t.name == "gtopk ρ=0.01 P=4" and t.xaxis == "x2")
    assert list(test.y) == pytest.approx([0.1 + 9 / 25, 0.1 + 19 / 25])


def test_convergence_without_run_id_groups_by_method_density_workers() -> None:
    _, metrics = synthetic_frames()
    fig = figures.convergence_figure(metrics.drop(columns="run_id"))
    assert len(fig.data) == 24


def test_convergence_rejects_bad_input() -> None:
    _, metrics = synthetic_frames()
    with pytest.raises(ValueError, match="x='time'"):
        figures.convergence_figure(metrics, x="time")
    with pytest.raises(ValueError, match="missing column"):
        figures.convergence_figure(metrics.drop(columns="kind"))
    with pytest.raises(TypeError, match="pandas.DataFrame"):
        figures.convergence_figure(metrics.to_dict("records"))  # type: ignore[arg-type]


def test_scaling_efficiency_measured_model_and_paper_points() -> None:
    measured = pd.DataFrame({"method": ["dense", "dense", "gtopk", "gtopk"], "workers": [1, 4, 1, 4],
                             "scaling_efficiency": [1.0, 0.4, 1.0, 0.8]})
    predicted = measured.assign(scaling_efficiency=[1.0, 0.35, 1.0, 0.85])
    fig = figures.scaling_efficiency_figure(measured, predicted, time_basis="wall",
                                            paper_models=["ResNet-20 / CIFAR-10"])
    dashed = [t for t in fig.data if t.line.dash == "dash"]
    assert {t.name for t in dashed} == {"dense (model)", "gtopk (model)"}
    paper = [t for t in fig.data if t.name.startswith("paper")]
    assert sorted(t.y[0] for t in paper) == [0.313, 0.756, 0.857]
    assert all(t.x[0] == 32 for t in paper)
    assert "wall" in fig.layout.yaxis.title.text
    with pytest.raises(ValueError, match="time_basis"):
        figures.scaling_efficiency_figure(measured, time_basis="cpu")
    with pytest.raises(ValueError, match="paper_models"):
        figures.scaling_efficiency_figure(measured, paper_models=["GPT-4"])


def test_time_breakdown_is_stacked_per_method_and_p() -> None:
    summaries, _ = synthetic_frames()
    fig = figures.time_breakdown_figure(summaries)
    assert fig.layout.barmode == "stack"
    assert [t.name for t in fig.data] == ["compute", "selection", "communication", "update"]
    assert len(fig.data[0].y) == 12
    # flattened columns work as well as the dict column
    flat = summaries.drop(columns="time_breakdown_s").assign(**{
        f"time_breakdown_s.{p}": 0.5 for p in ("compute", "selection", "communication", "update")})
    assert figures.time_breakdown_figure(flat).data[2].y[0] == 0.5
    with pytest.raises(ValueError, match="time breakdown"):
        figures.time_breakdown_figure(summaries.drop(columns="time_breakdown_s"))


def test_comm_volume_formula_and_figure() -> None:
    d, k = 1_000_000, 1_000
    assert figures.comm_bytes_per_rank_formula("dense", 4, d, k) == pytest.approx(2 * 3 / 4 * 4 * d)
    assert figures.comm_bytes_per_rank_formula("topk", 8, d, k) == 7 * k * 8
    assert figures.comm_bytes_per_rank_formula("gtopk", 8, d, k) == 3 * k * 8
    # P = 6: 4-rank butterfly (2 rounds) plus fold/unfold of the 2 extra ranks
    assert figures.comm_bytes_per_rank_formula("gtopk", 6, d, k) == pytest.approx((4 * 2 * k + 4 * k) / 6 * 8)
    assert figures.comm_bytes_per_rank_formula("gtopk", 1, d, k) == 0
    with pytest.raises(ValueError, match="method='sgd'"):
        figures.comm_bytes_per_rank_formula("sgd", 4, d, k)
    summaries, _ = synthetic_frames()
    fig = figures.comm_volume_figure(summaries)
    assert fig.layout.yaxis.type == "log"
    measured = next(t for t in fig.data if t.name == "gtopk (measured)")
    formula = next(t for t in fig.data if t.name == "gtopk (formula)")
    assert list(measured.x) == [2, 4]
    assert dict(zip(formula.x, formula.y))[4] == pytest.approx(measured.y[1])


def test_topk_operator_figures() -> None:
    rng = np.random.default_rng(0)
    u = rng.normal(0.0, 1e-3, 20_000)
    fig = figures.gradient_histogram_figure(u, density=0.01)
    assert any(isinstance(t, go.Scatter) and t.name.startswith("N(") for t in fig.data)
    table = figures.topk_error_table(u, [0.001, 0.01, 0.1, 0.5, 1.0], label="gaussian")
    assert table.relative_error.is_monotonic_decreasing
    assert table.relative_error.iloc[-1] == 0
    # bell-shaped vectors: the Top-k error lies below even the tighter (1 - k/d)^2 bound
    assert (table.relative_error <= table.bound_gaussian + 1e-12).all()
    # and the exact value for a vector we can do by hand
    small = figures.topk_error_table([3.0, -4.0, 0.0, 1.0], [0.25, 0.5])
    assert list(small.relative_error) == pytest.approx([10 / 26, 1 / 26])
    fig = figures.topk_error_figure(table)
    assert {"1 - k/d (Random-k bound)", "(1 - k/d)² (tighter bound)"} <= {t.name for t in fig.data}
    counts = pd.DataFrame({"k": [10, 100, 1000], "selected": [12, 95, 1040]})
    fig = figures.gaussiank_count_figure(counts)
    assert _points(fig) > 0
    with pytest.raises(ValueError, match="NaN"):
        figures.gradient_histogram_figure([1.0, float("nan")])
    with pytest.raises(ValueError, match="densities"):
        figures.topk_error_table(u, [0.0])


def test_figures_module_imports_no_dask() -> None:
    """The figures read byte formulas from the method registry (which holds the collectives,
    hence torch) but never the Dask client side."""
    import subprocess
    import sys

    code = ("import sys, gtopk_lab.plotting.figures; "
            "print(sorted(m for m in ('distributed', 'dask') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# --- live helpers (no cluster; the real-run path is in test_report.py) ----------------------
def test_live_frontend_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    from gtopk_lab.plotting import live

    monkeypatch.delenv(live.LIVE_ENV, raising=False)
    monkeypatch.setenv(live.STATIC_ENV, "1")
    assert live.live_frontend_present() is False
    monkeypatch.delenv(live.STATIC_ENV)
    monkeypatch.setenv(live.LIVE_ENV, "1")
    assert live.live_frontend_present() is True
    monkeypatch.delenv(live.LIVE_ENV)
    monkeypatch.setenv("JPY_SESSION_NAME", "x.ipynb")
    assert live.live_frontend_present() is False  # plain Python: no kernel, no widgets


def test_copy_into_updates_a_figure_widget_in_place() -> None:
    from gtopk_lab.plotting.live import static_bundle
    from gtopk_lab.plotting.widget_sync import copy_into

    _, metrics = synthetic_frames()
    small = metrics[metrics.iteration < 5]
    widget = go.FigureWidget(figures.convergence_figure(small))
    before = id(widget)
    copy_into(widget, figures.convergence_figure(metrics))  # same runs, more points
    assert id(widget) == before and len(widget.data[0].x) == 20
    one_run = metrics[metrics.run_id == "gtopk-p4"]
    copy_into(widget, figures.convergence_figure(one_run))  # trace list changed shape
    assert len(widget.data) == 2 and widget.data[0].name == "gtopk ρ=0.01 P=4"
    bundle = static_bundle(go.Figure(widget))
    assert set(bundle) == {"application/vnd.plotly.v1+json", "text/html", "text/plain"}
    assert len(bundle["application/vnd.plotly.v1+json"]["data"]) == 2


def test_live_figure_rejects_non_handles() -> None:
    from gtopk_lab.plotting.live import LiveFigure, live_convergence

    with pytest.raises(TypeError, match="RunHandle"):
        LiveFigure([object()], live=False)
    with pytest.raises(ValueError, match="min_interval_s"):
        LiveFigure([], live=False, min_interval_s=-1)
    with pytest.raises(ValueError, match="x='steps'"):
        live_convergence([], x="steps", live=False)
