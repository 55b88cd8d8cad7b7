"""The what-if explorer (gtopk_lab.plotting.explorer): its curves are the alpha-beta model's
(predict_scaling and hand-written formulas as the oracles), moving a slider touches no
cluster, the methods select adds and removes traces, the link controls parse as a run
parses them, the costs say where they come from, and Run as study builds (and, on a
2-worker LocalCluster, runs) the setting's study, whose measured points join the axes."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest

from gtopk_lab.analysis.predict import predict_scaling
from gtopk_lab.network.model import PRESETS, network_model
from gtopk_lab.plotting.explorer import Explorer
from gtopk_lab.plotting.explorer_costs import (DEFAULT_COSTS, Costs, costs_from_calibration, costs_from_summaries,
                                               find_costs)
from gtopk_lab.plotting.explorer_model import FREE_RATE, WORKERS

pytestmark = pytest.mark.timeout(120)

COSTS = Costs(numel=1_048_576, compute_s=0.05, selection_s=0.004, source="test costs")


class Untouchable:
    """A Lab double that records every attribute asked for: the explorer may only read it
    when its button is pressed."""

    def __init__(self) -> None:
        object.__setattr__(self, "touched", [])

    def __getattr__(self, name: str) -> Any:
        self.touched.append(name)
        raise AttributeError(name)


def _curve(explorer: Explorer, method: str) -> list[float]:
    return list(next(t for t in explorer.efficiency_figure.data if t.name == method).y)


def _oracle(method: str, density: float, link: str = "1GbE", latency: str | None = None,
            costs: Costs = COSTS) -> list[float]:
    rows = predict_scaling(costs.numel, density, costs.compute_s, network_model(link, latency), list(WORKERS),
                           selection_s=costs.selection_s, gamma_s_per_element=costs.gamma_s_per_element,
                           methods=[(method, method, None)], selection_at_one=True)
    return [r["scaling_efficiency"] * 100 for r in rows]


def _by_hand(method: str, density: float) -> list[float]:
    """1GbE: dense's ring allreduce (2 (P - 1) rounds of ceil(4 d / P) bytes); gTop-k's
    exact-k butterfly (log2 P rounds of k pairs, 8 bytes each, no header); selection paid
    at every P for gTop-k."""
    alpha, bandwidth, _ = PRESETS["1GbE"]
    beta = 8 / bandwidth
    d, t_c, t_s = COSTS.numel, COSTS.compute_s, COSTS.selection_s
    k = max(1, math.floor(density * d))
    out = []
    for p in WORKERS:
        rounds = int(math.log2(p))
        if method == "dense":
            comm = 2 * (p - 1) * (alpha + beta * math.ceil(4 * d / p))
            out.append(100 * t_c / (t_c + comm))
        else:
            out.append(100 * t_c / (t_c + t_s + rounds * (alpha + beta * 8 * k)))
    return out


def test_rho_slider_changes_the_curves_to_the_model_and_submits_nothing() -> None:
    lab = Untouchable()
    explorer = Explorer(lab, costs=COSTS, methods=["dense", "topk", "gtopk"], density=0.001)
    touched_at_start = list(lab.touched)
    before = {m: _curve(explorer, m) for m in ("dense", "topk", "gtopk")}
    for m, curve in before.items():
        assert curve == pytest.approx(_oracle(m, 0.001), rel=1e-12), m
    redraws = explorer.redraws
    explorer.density.value = 0.05  # what moving the slider in the browser does
    assert explorer.redraws == redraws + 1
    after = {m: _curve(explorer, m) for m in ("dense", "topk", "gtopk")}
    for m in ("topk", "gtopk"):
        assert after[m] == pytest.approx(_oracle(m, 0.05), rel=1e-12), m
        assert after[m][-1] < before[m][-1] - 1, (m, before[m], after[m])  # 50x the pairs: visibly lower
    assert after["dense"] == before["dense"]  # dense sends everything whatever rho
    assert after["gtopk"] == pytest.approx(_by_hand("gtopk", 0.05), rel=1e-9)
    assert after["dense"] == pytest.approx(_by_hand("dense", 0.05), rel=1e-9)
    # the breakdown at the chosen P (32) is the same model's
    bars = {t.name: dict(zip(t.y, t.x)) for t in explorer.breakdown_figure.data}
    assert bars["compute"]["gtopk"] == COSTS.compute_s and bars["selection"]["gtopk"] == COSTS.selection_s
    assert bars["selection"]["dense"] == 0.0
    assert bars["communication"]["gtopk"] == pytest.approx(5 * (PRESETS["1GbE"][0] + 8 / PRESETS["1GbE"][1] * 8
                                                                * math.floor(0.05 * COSTS.numel)))
    assert lab.touched == touched_at_start == [], lab.touched  # no cluster, no client, no study


def test_methods_select_adds_and_removes_traces_and_names_methods_without_a_formula() -> None:
    explorer = Explorer(costs=COSTS, methods=["dense", "gtopk"])
    names = lambda: [t.name for t in explorer.efficiency_figure.data]  # noqa: E731
    assert names() == ["dense", "gtopk"]
    explorer.methods.value = ("dense", "gtopk", "oktopk")
    assert names() == ["dense", "gtopk", "oktopk"]
    assert _curve(explorer, "oktopk") == pytest.approx(_oracle("oktopk", 0.001), rel=1e-12)
    explorer.methods.value = ("gtopk",)
    assert names() == ["gtopk"] and list(explorer.breakdown_figure.data[0].y) == ["gtopk"]
    # PowerSGD's formula needs its layer layout: no curve, and the figure says so
    explorer.methods.value = ("gtopk", "powersgd")
    assert names() == ["gtopk"]
    note = explorer.efficiency_figure.layout.annotations[0].text
    assert "powersgd" in note and "test costs" in note
    explorer.methods.value = ()
    assert names() == [] and explorer.prediction is not None and explorer.prediction.rows == {}
    with pytest.raises(ValueError, match="methods=.*'nope' is not a registered method"):
        Explorer(costs=COSTS, methods=["nope"])


def test_link_presets_free_rate_latency_and_p_slider() -> None:
    explorer = Explorer(costs=COSTS, methods=["gtopk"])
    explorer.link.value = "10GbE"
    assert explorer.rate.value == pytest.approx(9.4) and explorer.latency.value == pytest.approx(50.0)
    assert explorer.setting().network() == network_model("10GbE")
    assert _curve(explorer, "gtopk") == pytest.approx(_oracle("gtopk", 0.001, "10GbE"), rel=1e-12)
    explorer.latency.value = 200.0  # a latency of one's own on the preset's rate
    assert explorer.setting().latency_text == "200us"
    assert _curve(explorer, "gtopk") == pytest.approx(_oracle("gtopk", 0.001, "10GbE", "200us"), rel=1e-12)
    explorer.rate.value = 2.5  # a rate of one's own: the link becomes that rate
    assert explorer.link.value == FREE_RATE and explorer.setting().bandwidth_text == "2.5Gbps"
    assert _curve(explorer, "gtopk") == pytest.approx(_oracle("gtopk", 0.001, "2.5Gbps", "200us"), rel=1e-12)
    explorer.link.value = "none"
    assert explorer.rate.disabled and explorer.latency.disabled
    assert _curve(explorer, "gtopk")[1:] == pytest.approx([100 * 0.05 / 0.054] * 10)  # selection only
    explorer.workers.value = 128
    assert explorer.efficiency_figure.layout.shapes[0].x0 == 128
    assert "P = 128" in explorer.breakdown_figure.layout.title.text
    assert list(explorer.workers.options) == [(str(p), p) for p in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)]
    # a link as a run takes it: a rate (its latency 0 unless given) and a latency
    typed = Explorer(costs=COSTS, methods=["gtopk"], link="2.5Gbps", latency="40ms")
    assert typed.link.value == FREE_RATE and typed.setting().network() == network_model("2.5Gbps", "40ms")
    assert _curve(typed, "gtopk") == pytest.approx(_oracle("gtopk", 0.001, "2.5Gbps", "40ms"), rel=1e-12)
    bare = Explorer(costs=COSTS, methods=["gtopk"], link="1Gbps")
    assert bare.setting().network() == network_model("1Gbps")  # latency 0: the slider's left end
    with pytest.raises(ValueError, match="bandwidth='fast' is invalid"):
        Explorer(costs=COSTS, link="fast")



def _snapped(slider: Any, value: float) -> float:
    """What a log slider's front end sends back for ``value``: its step's nearest exponent."""
    return float(10 ** (round(math.log10(value) / slider.step) * slider.step))


def test_a_sliders_snap_from_the_front_end_is_no_change() -> None:
    """A FloatLogSlider's front end rounds a value set from Python to its step and sends it
    back (seen in Chromium: 40 ms came back as 39.81 ms); within half a step that is the
    value Python set, so a preset's rate does not turn into a free rate."""
    explorer = Explorer(costs=COSTS, methods=["gtopk"], link="1GbE", latency="40ms", density=0.003)
    redraws = explorer.redraws
    for slider in (explorer.rate, explorer.latency, explorer.density):
        slider.value = _snapped(slider, slider.value)
        assert slider.value != pytest.approx(explorer._exact[slider.description], rel=1e-6)
    assert explorer.redraws == redraws and explorer.link.value == "1GbE"
    setting = explorer.setting()
    assert setting.network() == network_model("1GbE", "40000us") and setting.density == 0.003
    explorer.latency.value = 1000.0  # a real move: the person's value
    assert explorer.redraws == redraws + 1 and explorer.setting().latency_text == "1000us"


def test_costs_come_from_a_calibration_runs_or_the_stated_default(tmp_path: Path) -> None:
    assert find_costs(tmp_path) is DEFAULT_COSTS and find_costs(None) is DEFAULT_COSTS
    workload = {"model": "mlp", "dataset": "mnist1d", "batch_size": 32, "model_kwargs": {}, "device": "cpu"}
    entries = [{"workload": workload, "compute_time_s": 0.02, "selection_time_s": 0.001, "numel": 5210,
                "measured_at": "2026-12-02T10:00:00"},
               {"merge_workload": {**workload, "density": 0.01}, "merge_gamma_s_per_element": 2e-9},
               {"merge_workload": {**workload, "density": 0.001}, "merge_gamma_s_per_element": 5e-9}]
    (tmp_path / "calibration.json").write_text(json.dumps({"entries": entries}))
    costs = costs_from_calibration(tmp_path)
    assert costs is not None and find_costs(tmp_path) == costs
    assert (costs.numel, costs.compute_s, costs.selection_s) == (5210, 0.02, 0.001)
    assert costs.gamma_at(0.002) == 5e-9 and costs.gamma_at(0.008) == 2e-9  # nearest in log rho
    assert costs.source.startswith("calibration ") and "mlp/mnist1d" in costs.source
    assert dict(costs.workload) == {"model": "mlp", "dataset": "mnist1d", "batch_size": 32}
    explorer = Explorer(out=str(tmp_path), methods=["gtopk"])
    assert explorer.costs == costs
    assert "costs: calibration" in explorer.efficiency_figure.layout.annotations[0].text
    assert (tmp_path / "calibration.json").exists()  # read only: nothing moved, nothing measured
    # runs: dense P = 1's compute + update, the sparse runs' median selection
    runs = [{"method": "dense", "workers": 1, "numel": 100, "model": "mlp", "dataset": "d", "status": "completed",
             "time_breakdown_s": {"compute": 0.010, "update": 0.002, "selection": 0.0}},
            {"method": "gtopk", "workers": 2, "numel": 100, "status": "completed", "merge_gamma_s_per_element": 1e-9,
             "time_breakdown_s": {"compute": 0.5, "update": 0.0, "selection": 0.003}},
            {"method": "gtopk", "workers": 4, "numel": 100, "status": "failed",
             "time_breakdown_s": {"compute": 9.0, "selection": 9.0}}]
    from_runs = costs_from_summaries(runs, "stored runs")
    assert from_runs is not None and from_runs.compute_s == pytest.approx(0.012)
    assert (from_runs.selection_s, from_runs.gamma_s_per_element, from_runs.numel) == (0.003, 1e-9, 100)
    assert from_runs.source == "stored runs (mlp/d, 2 run(s))"
    assert costs_from_summaries([], "nothing") is None
    # a stored PowerSGD run carries its formula's inputs (the layout of the costs' d = 100), so
    # the explorer prices PowerSGD too; a run of another workload's d does not count
    inputs = {"layout": [[10, 9], [10]], "rank": 1, "min_compression_rate": 0.0}
    powersgd = {"method": "powersgd", "workers": 2, "numel": 100, "status": "completed", "comm_formula": inputs,
                "time_breakdown_s": {"compute": 0.5, "update": 0.0, "selection": 0.001}}
    other = {**powersgd, "numel": 24, "comm_formula": {**inputs, "layout": [[4, 5], [4]]}}
    with_powersgd = costs_from_summaries(runs[:2] + [other, powersgd], "stored runs")
    assert with_powersgd.formulas == {"powersgd": inputs}
    from gtopk_lab.plotting.explorer_model import Setting, predict

    setting = Setting(density=0.01, workers=4, methods=("dense", "powersgd"))
    prediction = predict(setting, with_powersgd)
    assert prediction.missing == [] and predict(setting, from_runs).missing == ["powersgd"]
    assert prediction.at_p["powersgd"]["comm_s"] == pytest.approx(predict_scaling(
        100, 0.01, with_powersgd.compute_s, setting.network(), [4], methods=[("powersgd", "powersgd", None)],
        formulas={"powersgd": inputs})[0]["comm_s"])
    # calibrated selections of sparse methods (orchestration.calibration) win over the one the
    # compute entry timed (its first method's: dense, ~0); their median, this workload's only
    entries += [{"selection_workload": {**workload, "method": m, "density": 0.01}, "selection_time_s": t}
                for m, t in (("topk", 0.004), ("gtopk", 0.005), ("ef21", 0.009), ("powersgd", 0.5))]
    entries.append({"selection_workload": {**workload, "batch_size": 64, "method": "gtopk", "density": 0.01},
                    "selection_time_s": 1.0})
    (tmp_path / "calibration.json").write_text(json.dumps({"entries": entries}))
    assert costs_from_calibration(tmp_path).selection_s == 0.005  # PowerSGD's projections are no selection
    with pytest.raises(ValueError, match="compute_s=0 is invalid"):
        Costs(numel=10, compute_s=0)


class FakeStudy:
    def __init__(self, points: pd.DataFrame) -> None:
        self._points = points
        self.points_list = list(range(len(points)))
        self.callbacks: list[Callable[[Any], None]] = []

    def points(self) -> pd.DataFrame:
        return self._points

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        self.callbacks.append(callback)
        return lambda: None


class FakeLab:
    def __init__(self, points: pd.DataFrame) -> None:
        self.calls: list[dict[str, Any]] = []
        self.points = points
        self.out = "unused"

    def study(self, **kwargs: Any) -> FakeStudy:
        self.calls.append(kwargs)
        return FakeStudy(self.points)

    def runs(self) -> pd.DataFrame:
        return pd.DataFrame()


def _points() -> pd.DataFrame:
    base = {"batch_size": 32, "numel": 5210, "bandwidth_bps": PRESETS["1GbE"][1], "latency_s": PRESETS["1GbE"][0],
            "status": "completed", "seed": 0, "source": "real", "final": True, "density": 0.01, "model": "mlp",
            "dataset": "mnist1d"}
    rows = [("dense", 1, 100.0, 0.020), ("dense", 2, 150.0, 0.020), ("gtopk", 1, 95.0, 0.020),
            ("gtopk", 2, 180.0, 0.020)]
    return pd.DataFrame([{**base, "method": m, "workers": p, "samples_per_s_virtual": speed,
                          "time_breakdown_s": {"compute": c, "update": 0.0, "selection": 0.001 if m == "gtopk" else 0}}
                         for m, p, speed, c in rows])


def test_run_as_study_builds_the_settings_study_and_overlays_its_points() -> None:
    lab = FakeLab(_points())
    explorer = Explorer(lab, costs=Costs(numel=5210, compute_s=0.02, source="test", workload={"model": "mlp"}),
                        methods=["dense", "gtopk"], base={"epochs": 1, "max_iterations": 8}, seeds=2)
    explorer.density.value = 0.01
    explorer.workers.value = 4
    explorer.latency.value = 500.0
    expected = {"methods": ["dense", "gtopk"], "workers": [1, 2, 4], "density": 0.01, "bandwidth": "1GbE",
                "latency": "500us", "seeds": 2, "base": {"model": "mlp", "epochs": 1, "max_iterations": 8}}
    assert explorer.study_arguments() == expected
    assert lab.calls == []  # building the spec submits nothing
    study = explorer.run_study().result(30)
    assert lab.calls == [{**expected, "progress": False, "refresh_s": 1.0}]
    assert explorer.study is study and study.callbacks == [explorer._on_study]
    measured = {t.name: (list(t.x), list(t.y)) for t in explorer.efficiency_figure.data if "measured" in t.name}
    # the project's rule: samples/s over P x dense P = 1's (100 samples/s)
    assert measured["dense measured"] == ([1, 2], pytest.approx([100.0, 75.0]))
    assert measured["gtopk measured"] == ([1, 2], pytest.approx([95.0, 90.0]))
    # its dense P = 1 run is done: the curves now use the study's costs, and say so
    assert explorer.costs.source.startswith("latest study") and explorer.costs.compute_s == pytest.approx(0.02)
    note = explorer.efficiency_figure.layout.annotations[0].text
    assert "latest study" in note and "diamonds: measured by the study at ρ=0.01, 1GbE, latency 500 us" in note
    explorer.density.value = 0.1  # the sliders move on: the note still names the study's setting
    assert "measured by the study at ρ=0.01," in explorer.efficiency_figure.layout.annotations[0].text
    assert Explorer(costs=COSTS).run_study() is None  # no Lab: the button is off and says so
    assert Explorer(costs=COSTS).run_button.disabled


def test_control_panel_has_the_explorer_as_a_tab() -> None:
    from gtopk_lab.plotting.controls import ControlPanel

    panel = ControlPanel(FakeLab(_points()), defaults={"methods": ["dense", "gtopk"], "model": "mlp"},
                         extra={"max_iterations": 8})
    assert panel.tabs.children[3] is panel.explorer.widget and panel.tabs.get_title(3) == "what-if"
    assert panel.explorer.study_arguments()["base"] == {"model": "mlp", "dataset": "mnist1d",
                                                        "epochs": panel.epochs.value, "max_iterations": 8}
    assert [t.name for t in panel.explorer.efficiency_figure.data] == ["dense", "gtopk"]
    # the form's first density, link and latency
    panel = ControlPanel(FakeLab(_points()), defaults={"methods": ["gtopk"], "density": [0.01, 0.1],
                                                       "bandwidth": "1Gbps", "latency": "40ms"})
    assert panel.explorer.setting().network() == network_model("1Gbps", "40ms")
    assert panel.explorer.setting().density == 0.01


@pytest.mark.timeout(400)
def test_run_as_study_on_a_local_cluster_lands_on_the_same_axes(tmp_path: Path) -> None:
    """One real small study: dense and gTop-k at P = 1, 2 on a 2-worker LocalCluster."""
    from gtopk_lab.orchestration.lab import Lab

    with Lab(n_workers=2, out=str(tmp_path / "res")) as lab:
        explorer = Explorer(lab, methods=["dense", "gtopk"], density=0.01, workers=2, refresh_s=0.2,
                            base={"model": "mlp", "epochs": 1, "train_samples": 400, "test_samples": 100,
                                  "max_iterations": 8, "sink_every": 2})
        assert explorer.costs is DEFAULT_COSTS  # an empty results folder: the stated default
        study = explorer.run_study().result(120)
        assert study.wait(240)
        assert all(h.status == "completed" for h in study.handles.values())
        deadline = time.monotonic() + 20
        while explorer.costs.source.startswith("stated") or len(explorer.measured) < 4:
            assert time.monotonic() < deadline, (explorer.costs, explorer.measured)
            time.sleep(0.1)
        table = study.efficiency()
        overlay = {t.name: dict(zip(t.x, t.y)) for t in explorer.efficiency_figure.data if "measured" in t.name}
        for row in table.itertuples():
            assert overlay[f"{row.method} measured"][row.workers] == pytest.approx(row.efficiency_mean * 100)
        # the curves are now the study's workload's (mlp: d = numel of its runs)
        assert explorer.costs.source.startswith("latest study") and "mlp" in explorer.costs.source
        assert explorer.costs.numel == int(study.points()["numel"].iloc[0])
        assert threading.active_count() >= 1


def test_predict_scaling_prices_local_steps_once_per_h() -> None:
    """The explorer's diloco curve: the dense ring allreduce once every H iterations."""
    from gtopk_lab.methods import get_method

    net, d, k = network_model("1GbE"), 1_000_000, 1000
    row = predict_scaling(d, k / d, 0.1, net, [8], selection_s=0.01, methods=[("diloco", "diloco", None)])[0]
    alpha, beta = net.latency_s, 8 / net.bandwidth_bps
    ring = 2 * 7 * (alpha + beta * math.ceil(4 * d / 8))
    h = get_method("diloco").sync_every
    assert h > 1 and row["comm_s"] == pytest.approx(ring / h)


def test_stored_runs_give_the_latest_workloads_costs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A results home holds many models' runs: the costs are the latest run's workload's."""
    from gtopk_lab.orchestration import reading

    def run(model: str, numel: int, at: str, compute: float) -> dict[str, Any]:
        return {"run_id": f"{model}-{at}", "submitted_at": at, "status": "completed", "method": "dense",
                "workers": 1, "model": model, "dataset": "mnist1d", "batch_size": 32, "numel": numel,
                "time_breakdown_s": {"compute": compute, "update": 0.0, "selection": 0.0}}

    frame = pd.DataFrame([run("mlp", 100, "2026-12-02T10:00:01", 0.01), run("cnn", 5000, "2026-12-02T10:00:03", 0.5),
                          run("cnn", 5000, "2026-12-02T10:00:02", 0.3), run("mlp", 100, "2026-12-01T09:00:00", 9.0)])
    monkeypatch.setattr(reading, "load_summaries", lambda out: frame)
    costs = find_costs(tmp_path)
    assert (costs.numel, costs.compute_s) == (5000, pytest.approx(0.4))  # the two cnn runs, not the mlp ones
    assert costs.source == f"stored runs in {tmp_path} (cnn/mnist1d, 2 run(s))"
