"""figures_studies / panel_studies: two studies on one efficiency and one convergence figure,
each a legend group (title, togglegroup), the earlier faded, legend names that tell them
apart; oracles: the names and groups written out by hand, bands only for the 2-seed study."""

from __future__ import annotations

import pandas as pd
import pytest

from gtopk_lab.plotting.controls import ControlPanel
from gtopk_lab.plotting.figures_studies import FADED_OPACITY, ShownStudy, convergence_studies_figure, \
    scaling_studies_figure
from gtopk_lab.plotting.panel_studies import PanelStudies
from test_figures import synthetic_run

pytestmark = pytest.mark.timeout(60)

LINKS = {"1GbE": (8 / 9e-9, 0.436e-3), "10GbE": (9.4e9, 50e-6)}


def _points(density: float, link: str, seeds: int) -> pd.DataFrame:
    bps, lat = LINKS[link]
    rows = []
    for seed in range(seeds):
        for method, p, speed in (("dense", 1, 100.0), ("dense", 4, 200.0 + 10 * seed), ("gtopk", 4, 300.0 + 20 * seed)):
            rows.append({"method": method, "workers": p, "density": density, "seed": seed, "source": "simulated",
                         "final": True, "run_id": f"{method}{p}{seed}{link}", "status": "completed",
                         "samples_per_s_virtual": speed, "bandwidth_bps": bps, "latency_s": lat})
    return pd.DataFrame(rows)


def _metrics_status(density: float, link: str, seeds: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, status = [], []
    for seed in range(seeds):
        for method in ("dense", "gtopk"):
            run = f"{method}-{link}-s{seed}"
            r, _ = synthetic_run(run, method, 2, density, seed=seed)
            rows += [dict(x, run_id=run, seed=seed, source="simulated") for x in r]
            status.append({"run_id": run, "method": method, "workers": 2, "density": density, "algorithm": None,
                           "bandwidth": link, "latency": None, "seed": seed, "source": "simulated"})
    return pd.DataFrame(rows), pd.DataFrame(status)


def _two() -> list[ShownStudy]:
    first = ShownStudy(_points(0.001, "1GbE", 1), *_metrics_status(0.001, "1GbE", 1), key="a",
                       title="study 1 (a)")
    second = ShownStudy(_points(0.01, "10GbE", 2), *_metrics_status(0.01, "10GbE", 2), key="b",
                        title="study 2 (b)")
    return [first, second]


def test_two_studies_on_one_efficiency_figure_grouped_faded_and_named_apart() -> None:
    fig = scaling_studies_figure(_two())
    shown = [t for t in fig.data if t.showlegend is not False]
    assert [(t.name, t.legendgroup) for t in shown] == [
        ("dense 1GbE 1 seed", "a"), ("gtopk ρ=0.001 1GbE 1 seed", "a"),
        ("dense 10GbE 2 seeds", "b"), ("gtopk ρ=0.01 10GbE 2 seeds", "b")]
    assert {t.opacity for t in fig.data if t.legendgroup == "a"} == {FADED_OPACITY}
    assert {t.opacity for t in fig.data if t.legendgroup == "b"} == {1.0}
    titles = [t.legendgrouptitle.text for t in fig.data if t.legendgrouptitle.text]
    assert titles == ["study 1 (a)", "study 2 (b)"] and fig.layout.legend.groupclick == "togglegroup"
    bars = {t.legendgroup: t.error_y.visible for t in shown}
    assert bars == {"a": False, "b": True}  # intervals only over 2 seeds


def test_two_studies_on_one_convergence_figure_bands_for_the_two_seed_study() -> None:
    fig = convergence_studies_figure(_two())
    lines = [t for t in fig.data if t.mode == "lines"]
    assert [(t.name, t.legendgroup) for t in lines] == [
        ("dense 1GbE 1 seed", "a"), ("gtopk ρ=0.001 1GbE 1 seed", "a"),
        ("dense 10GbE 2 seeds", "b"), ("gtopk ρ=0.01 10GbE 2 seeds", "b")]
    bands = [t for t in fig.data if t.fill == "toself"]
    assert [t.legendgroup for t in bands] == ["b", "b"] and all(t.opacity == pytest.approx(0.15) for t in bands)


class _Done:
    """A finished study as the panel reads it (counts how often its frames are read)."""

    def __init__(self, name: str, density: float, link: str, seeds: int) -> None:
        self.study_id = name
        self._points = _points(density, link, seeds)
        self._metrics, self._status = _metrics_status(density, link, seeds)
        self.reads = 0

    def points(self) -> pd.DataFrame:
        self.reads += 1
        return self._points

    def metrics(self) -> pd.DataFrame:
        return self._metrics

    def status(self) -> pd.DataFrame:
        return self._status.assign(status="completed (stored)", rows=None, queue_reason=None)

    def done(self) -> bool:
        return True

    def subscribe(self, callback):  # noqa: ANN001, ANN201 - a finished study never calls back
        return lambda: None


def test_a_panel_overlays_studies_each_read_once_after_it_ended() -> None:
    from test_controls import FakeLab

    panel = ControlPanel(FakeLab())
    a, b = _Done("a", 0.001, "1GbE", 1), _Done("b", 0.01, "10GbE", 2)
    panel.overlay(a)
    panel.overlay(b)
    panel.overlay(a)  # already shown: nothing changes
    names = [t.name for t in panel.efficiency_figure.data if t.showlegend is not False]
    assert names == ["dense 1GbE 1 seed", "gtopk ρ=0.001 1GbE 1 seed", "dense 10GbE 2 seeds",
                     "gtopk ρ=0.01 10GbE 2 seeds"]
    assert "<b>study 2</b> (overlaid)" in panel.run_lines.value and "<b>study 1</b> (overlaid)" in panel.run_lines.value
    assert a.reads == 1 and b.reads == 1  # an ended study is read once
    assert panel.cancel() == 0  # overlaid studies are not the panel's to cancel
    with pytest.raises(TypeError, match="expected a gtopk_lab Study"):
        panel.overlay(object())
    one = PanelStudies()
    one.add(a, launched=True)
    assert not [t for t in one.figures()[0].data if t.legendgrouptitle.text]  # one study: no group title



@pytest.mark.timeout(30)
def test_convergence_band_holds_only_losses_a_loss_can_take() -> None:
    metrics, status = _metrics_status(0.01, "10GbE", 2)
    # seeds 10x apart: the 2-seed Student-t interval (t = 12.7) of their mean reaches far below 0
    metrics.loc[metrics["seed"] == 1, "train_loss"] *= 10.0
    noisy = ShownStudy(_points(0.01, "10GbE", 2), metrics, status, key="n", title="noisy")
    bands = [t for t in convergence_studies_figure([noisy]).data if t.fill == "toself"]
    assert bands and min(min(t.y) for t in bands) == 0.0
