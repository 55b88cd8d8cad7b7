"""The ControlPanel (gtopk_lab.plotting.controls) and its pieces: the form's list fields
(panel_fields), the runs table (runs_table), launching studies without blocking, run lines
that never overwrite each other, a closed Lab, and one real study on a 2-worker cluster
from the panel to the report."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import plotly.graph_objects as go
import pytest

from gtopk_lab.plotting import controls
from gtopk_lab.plotting.controls import ControlPanel
from gtopk_lab.plotting.panel_fields import (FieldError, parse_float_list, parse_int_list, parse_text_list,
                                             study_request)
from gtopk_lab.plotting.runs_table import RUN_COLUMNS, compare_frame, runs_frame

pytestmark = pytest.mark.timeout(120)


# --- the form's fields ---------------------------------------------------------------------
def test_list_fields_parse_and_name_the_field_on_error() -> None:
    assert parse_int_list("1, 2,4;8 2", "P list") == [1, 2, 4, 8]
    assert parse_float_list("0.01,0.001", "densities") == [0.01, 0.001]
    assert parse_text_list("1GbE, 10GbE", "bandwidths") == ["1GbE", "10GbE"]
    assert parse_text_list("", "latencies", allow_empty=True) == []
    for call, start in ((lambda: parse_int_list("1,x", "P list"), "P list: 'x' is not an integer"),
                        (lambda: parse_int_list("0,2", "P list"), "P list: '0' is invalid"),
                        (lambda: parse_int_list("1.5", "P list"), "P list: '1.5' is invalid"),
                        (lambda: parse_int_list(" ", "P list"), "P list: ' ' is empty"),
                        (lambda: parse_float_list("0", "densities"), "densities: '0' is invalid"),
                        (lambda: parse_float_list("2", "densities"), "densities: '2' is invalid"),
                        (lambda: parse_text_list(",", "bandwidths"), "bandwidths: ',' is empty")):
        with pytest.raises(FieldError) as info:
            call()
        assert str(info.value).startswith(start) and "\n" not in str(info.value), str(info.value)


def _request(**changes: Any) -> Any:
    values = dict(methods=["dense", "gtopk"], workers="1,2,4,8", densities="0.01", bandwidths="1GbE",
                  latencies="", seeds=2, model="mlp", dataset="mnist1d", epochs=1, max_iterations=10)
    values.update(changes)
    return study_request(**values)


def test_study_request_checks_every_field_before_anything_runs() -> None:
    request = _request()
    assert request.axes == {"method": ["dense", "gtopk"], "workers": [1, 2, 4, 8], "density": [0.01],
                            "bandwidth": ["1GbE"], "seeds": 2}
    assert request.base["max_iterations"] == 10 and request.points == 16
    assert request.describe() == "2 method(s) x P 1,2,4,8 x 2 seeds: 16 point(s)"
    assert _request(latencies="0.5ms, 5ms").axes["latency"] == ["0.5ms", "5ms"]
    assert "max_iterations" not in _request(max_iterations=0).base
    for changes, start in (({"methods": []}, "methods: nothing selected"),
                           ({"bandwidths": "1GbE,fast"}, "bandwidths: bandwidth='fast' is invalid"),
                           ({"latencies": "soon"}, "latencies: latency='soon' is invalid"),
                           ({"seeds": 0}, "seeds: 0 is invalid"),
                           ({"model": "nope"}, "model: model='nope' is invalid"),
                           ({"model": "resnet20"}, "dataset: 'mnist1d' does not fit model 'resnet20'"),
                           ({"workers": "2,-1"}, "P list: '-1' is invalid")):
        with pytest.raises(FieldError) as info:
            _request(**changes)
        assert str(info.value).startswith(start) and "\n" not in str(info.value), (changes, str(info.value))


# --- the runs table ------------------------------------------------------------------------
def _summaries() -> pd.DataFrame:
    base = {"bandwidth": "1GbE", "latency": None, "bandwidth_bps": 8.9e8, "latency_s": 4e-4,
            "iterations": 10, "final_test_accuracy": 0.5, "samples_per_s_virtual": 1234.56,
            "final_train_loss": 1.0, "k": 5, "network": "1GbE"}
    return pd.DataFrame([
        {**base, "run_id": "b-run", "method": "gtopk", "workers": 4, "density": 0.01, "status": "queued",
         "submitted_at": "2026-01-01T00:00:02", "source": "simulated"},
        {**base, "run_id": "a-run", "method": "dense", "workers": 1, "density": 0.01, "status": "completed",
         "submitted_at": "2026-01-01T00:00:01", "source": "real", "bandwidth": "none"}])


def test_runs_frame_is_readable_newest_last_with_live_statuses() -> None:
    live = pd.DataFrame([{"run_id": "b-run", "status": "running", "seed": 3, "source": "simulated"},
                         {"run_id": "c-new", "status": "queued", "seed": 0, "source": "real", "method": "topk",
                          "workers": 2, "bandwidth": "10GbE", "latency": "5ms"}])
    frame = runs_frame(_summaries(), live)
    assert list(frame.columns) == list(RUN_COLUMNS)
    assert frame["run_id"].tolist() == ["a-run", "b-run", "c-new"]  # submitted first, first
    a, b, c = frame.to_dict("records")
    assert (a["status"], a["density"], a["network"], a["test acc"]) == ("completed", "", "unthrottled", "50.0%")
    assert (b["status"], b["seed"], b["test acc"], b["network"]) == ("running", 3, "", "1GbE")
    assert (c["status"], c["network"], c["P"]) == ("queued", "10GbE, 5ms", 2)
    side = compare_frame(_summaries(), ["b-run", "a-run", "missing"])
    assert list(side.columns) == ["gtopk P=4 [-run]", "dense P=1 [-run]"]
    assert side.loc["samples/s (virtual)"].tolist() == ["1234.6", "1234.6"]
    assert side.loc["network"].tolist() == ["1GbE", "unthrottled"]


# --- the panel without a cluster -------------------------------------------------------------
class FakeStudy:
    """What the panel reads of a Study, with statuses the test sets."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.handles: dict[str, Any] = {}
        self.points_list = list(rows)
        self.callbacks: list[Callable[[Any], None]] = []
        self.cancelled = False

    def status(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def points(self) -> pd.DataFrame:
        return pd.DataFrame()

    def metrics(self) -> pd.DataFrame:
        return pd.DataFrame()

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        self.callbacks.append(callback)
        return lambda: None

    def done(self) -> bool:
        return False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLab:
    """A Lab whose study() records calls and, given a ``gate``, waits until the test opens
    it (a large grid's submission that takes as long as the test needs, whatever the load)."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.closed = False
        self.gate = gate
        self.calls: list[dict[str, Any]] = []
        self.out = "unused"

    def study(self, **kwargs: Any) -> FakeStudy:
        if self.closed:
            raise RuntimeError("this Lab is closed")
        if self.gate is not None:
            assert self.gate.wait(30), "the test never opened the gate"
        self.calls.append(kwargs)
        n = len(self.calls)
        return FakeStudy([{"method": m, "workers": p, "density": 0.01, "bandwidth": "1GbE", "latency": None,
                           "seed": 0, "source": "real", "run_id": f"s{n}-{m}-{p}", "status": "queued", "rows": 0}
                          for m in kwargs["method"] for p in kwargs["workers"]])

    def runs(self) -> pd.DataFrame:
        return pd.DataFrame()


def _message(panel: ControlPanel) -> str:
    import html
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", panel.message.value))


def test_panel_launch_returns_at_once_and_lines_of_studies_never_overwrite() -> None:
    submitting = threading.Event()
    lab = FakeLab(gate=submitting)
    panel = ControlPanel(lab, defaults={"method": ["dense", "gtopk"], "workers": [1, 2], "latencies": "5ms",
                                        "max_iterations": 7}, extra={"train_samples": 400})
    assert panel.workers.value == "1,2" and panel.latencies.value == "5ms"
    future = panel.launch()
    # launch() returned while Lab.study is still submitting: the kernel is not blocked
    assert future is not None and not future.done() and not lab.calls
    assert panel.launch_button.disabled  # until the study is submitted
    submitting.set()
    first = future.result(10)
    assert not panel.launch_button.disabled and "study 1: 2 method(s) x P 1,2" in _message(panel)
    call = lab.calls[0]
    assert call["base"]["train_samples"] == 400 and call["base"]["max_iterations"] == 7
    assert call["latency"] == ["5ms"] and call["skip_completed"] and call["progress"] is False
    assert first.callbacks == [panel._on_study]
    panel.workers.value = "4"
    second = panel.launch().result(10)
    first.rows[0]["status"] = "completed"
    first.callbacks[0](first)  # the first study's watcher thread reports a change
    text = panel.run_lines.value
    assert text.count("[s1-") == 4 and text.count("[s2-") == 2  # every run of both studies
    assert text.index("study 2") < text.index("study 1")  # newest on top
    assert "✓ dense P=1" in text and "completed" in text
    assert panel.study is second and panel.cancel() == 0 and first.cancelled and second.cancelled


def test_panel_bad_values_and_closed_lab_say_so_in_one_line() -> None:
    lab = FakeLab()
    with pytest.raises(ValueError, match="unknown field"):
        ControlPanel(lab, defaults={"flavour": 1})
    with pytest.raises(TypeError, match="expected a gtopk_lab Lab"):
        ControlPanel(object())
    panel = ControlPanel(lab)
    panel.workers.value = "1,x"
    assert panel.launch() is None and _message(panel).startswith("P list: 'x' is not an integer")
    panel.workers.value = "1,2"
    panel.densities.value = "0.5,7"
    assert panel.launch() is None and _message(panel).startswith("densities: '7' is invalid")
    assert lab.calls == []
    lab.closed = True
    assert panel.launch() is None and "Lab is closed" in _message(panel) and panel.launch_button.disabled
    assert "Lab is closed" in _message(ControlPanel(lab))  # a panel made for a closed Lab says so at once


def test_panel_closes_its_lab_at_exit_once_and_weakly(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[Any] = []
    monkeypatch.setattr(controls.atexit, "register", lambda fn, *args: registered.append((fn, args)))
    closed: list[str] = []

    class Closable(FakeLab):
        def close(self) -> None:
            closed.append("closed")

    lab = Closable()
    ControlPanel(lab)
    ControlPanel(lab)
    assert len(registered) == 1
    fn, args = registered[0]
    fn(*args)
    assert closed == ["closed"]
    other = Closable()
    controls.close_lab_at_exit(other)  # registered without a panel, then dropped
    fn, args = registered[1]
    del other  # the registration holds no strong reference: a dropped Lab is not kept alive
    import gc

    gc.collect()
    fn(*args)
    assert closed == ["closed"]


# --- one real study from the panel, on a 2-worker cluster ------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_panel_study_on_a_cluster_live_figures_compare_and_report(tmp_path: Path) -> None:
    """Launched from the panel: dense and gTop-k at P = 2 on real ranks (dense P = 1 joins as
    the baseline; simulated points are the browser test's); the panel's FigureWidgets are updated in
    place, the runs table and the comparison see the runs, a closed Lab is reported, and the
    report covers the runs. A LiveFigure over the same handles is updated in place too."""
    from gtopk_lab.orchestration.lab import Lab
    from gtopk_lab.plotting.live import LiveFigure, live_convergence
    from gtopk_lab.plotting.report import write_report

    out = tmp_path / "res"
    with Lab(n_workers=2, out=str(out)) as lab:
        panel = ControlPanel(lab, defaults={"methods": ["dense", "gtopk"], "workers": "2", "density": 0.01,
                                            "epochs": 1, "model": "mlp"},
                             extra={"train_samples": 400, "test_samples": 100, "sink_every": 2,
                                    "max_iterations": 8}, refresh_s=0.2)
        panel.bandwidths.value = "fast"
        assert panel.launch() is None and _message(panel).startswith("bandwidths: bandwidth='fast' is invalid")
        panel.bandwidths.value = "1GbE"
        efficiency, convergence = panel.efficiency_figure, panel.convergence_figure
        future = panel.launch()
        study = future.result(60)
        handles = list(study.handles.values())
        assert sorted((h.config.method, h.config.workers, h.source) for h in handles) == [
            ("dense", 1, "real"), ("dense", 2, "real"), ("gtopk", 2, "real")]
        live = LiveFigure(handles, live=True, display=False, min_interval_s=0.0)
        widget = live.figure
        static = live_convergence(handles[-1], live=False, min_interval_s=0.0)
        assert study.wait(180)
        for handle in handles:
            assert handle.status == "completed", handle.error
        table = study.efficiency()
        expected = int(table["efficiency_mean"].notna().sum())

        def measured() -> int:
            return sum(len(t.x) for t in efficiency.data if "markers" in (t.mode or ""))

        # the watchers' last calls come after the last run ended; the efficiency and the
        # convergence figures each have their own (seen under load: 3 points, no lines yet)
        deadline = time.monotonic() + 20
        while ((measured() < expected or panel.run_lines.value.count(": completed") < 3
                or len(convergence.data) < 3) and time.monotonic() < deadline):
            time.sleep(0.1)
        assert measured() == expected == 3, (table, efficiency.data)
        assert panel.run_lines.value.count(": completed") == 3, panel.run_lines.value
        assert "study 1: 2 method(s) x P 2: 3 point(s) launched" in _message(panel)
        assert panel.efficiency_figure is efficiency and panel.convergence_figure is convergence
        assert len(convergence.data) == 3  # one line per (method, P)
        final_live, final_static = live.finish(), static.finish()
        assert live.figure is widget and live.refreshes >= 2 and static.refreshes >= 2
        assert [len(t.x) for t in widget.data] == [len(t.x) for t in final_live.data]
        assert len([t for t in final_static.data if t.xaxis == "x"]) == 1
        frame = panel.refresh_runs()
        assert set(frame["run_id"]) == {h.run_id for h in handles}
        assert set(frame["status"]) == {"completed"} and set(frame["seed"]) == {0}
        assert panel.compare() is None and "select runs" in _message(panel)
        panel.runs_table.selected_rows = [0, 1]
        fig = panel.compare()
        assert fig is not None and len(fig.data) == 4 and len(panel.compare_box.children) == 2
        assert panel.compare_box.children[1].df.shape[1] == 2  # the two runs side by side
        # a second launch of the same grid runs nothing again
        again = panel.launch().result(60)
        assert again.handles == {} and "3 already completed" in _message(panel)
    assert panel.launch() is None and "Lab is closed" in _message(panel)
    text = write_report(out, tmp_path / "report.html").read_text()
    assert all(h.run_id in text for h in handles) and "Convergence" in text


def test_panel_field_threads_are_daemons() -> None:
    """The launch thread never keeps a kernel from exiting."""
    submitting = threading.Event()
    panel = ControlPanel(FakeLab(gate=submitting))
    future = panel.launch()
    threads = [t for t in threading.enumerate() if t.name == "gtopk-lab-panel-launch"]
    submitting.set()
    assert threads and all(t.daemon for t in threads)
    future.result(10)
