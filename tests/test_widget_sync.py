"""A figure widget refreshed from a watcher thread loses no delta while the kernel thread
applies a front-end message to it (``gtopk_lab.plotting.widget_sync``).

The oracle is a small front-end view written here: like plotly's JavaScript view, once
drawn it changes only by the deltas it receives (``_py2js_addTraces`` /
``_py2js_deleteTraces`` / ``_py2js_restyle`` / ``_py2js_update``; a new ``_widget_data``
state reaches the model, not a drawn view), and the test compares what it ends with
against the figure the Python side holds."""

from __future__ import annotations

import threading
import time
from typing import Any

import plotly.graph_objects as go
import pytest

from gtopk_lab.plotting.widget_sync import ThreadSafeFigureWidget, copy_into

pytestmark = pytest.mark.timeout(60)


class FrontEndView:
    """What a drawn plotly view shows of the deltas it received (drawn empty)."""

    def __init__(self) -> None:
        self.traces: list[dict[str, Any]] = []

    def receive(self, state: dict[str, Any]) -> None:
        if state.get("_py2js_deleteTraces") is not None:
            for i in sorted(state["_py2js_deleteTraces"]["delete_inds"], reverse=True):
                del self.traces[i]
        if state.get("_py2js_addTraces") is not None:
            self.traces += [dict(t) for t in state["_py2js_addTraces"]["trace_data"]]
        for delta, traces_key, data_key in (("_py2js_restyle", "restyle_traces", "restyle_data"),
                                            ("_py2js_update", "style_traces", "style_data")):
            msg = state.get(delta)
            if msg is not None:
                for j, i in enumerate(msg[traces_key] or range(len(self.traces))):
                    for key, values in msg[data_key].items():
                        self.traces[i][key] = values[j] if isinstance(values, list) else values


def _listen(widget: go.FigureWidget, front: FrontEndView) -> None:
    """Feed every state message the widget sends to ``front`` (no kernel here: the comm
    would drop them)."""
    def send(msg: dict[str, Any], buffers: Any = None) -> None:
        if msg.get("method") == "update":
            front.receive(msg["state"])

    object.__setattr__(widget, "_send", send)


def _slow_front_end_message(widget: go.FigureWidget, inside: threading.Event) -> threading.Thread:
    """The kernel thread applying a view's answer (``_js2py_layoutDelta``) slowly: it is
    inside ipywidgets' ``set_state`` for 0.5 s."""
    original = widget.set_trait

    def slow_set_trait(name: str, value: Any) -> None:
        inside.set()
        time.sleep(0.5)
        original(name, value)

    object.__setattr__(widget, "set_trait", slow_set_trait)
    thread = threading.Thread(target=widget.set_state,
                              args=({"_js2py_layoutDelta": {"layout_delta": {}, "layout_edit_id": 0}},))
    thread.start()
    return thread


def _figure(xs: list[float]) -> go.Figure:
    return go.Figure([go.Scatter(x=xs, y=xs, mode="lines+markers", name="a"),
                      go.Scatter(x=xs[:1], y=xs[:1], mode="markers", name="b")])


@pytest.mark.parametrize("replace", [False, True])
def test_a_refresh_made_while_a_front_end_message_is_applied_reaches_the_front_end(replace: bool) -> None:
    widget = ThreadSafeFigureWidget(go.Figure())
    front = FrontEndView()
    _listen(widget, front)
    copy_into(widget, _figure([1.0, 2.0]))
    assert [len(t["x"]) for t in front.traces] == [2, 1]

    inside = threading.Event()
    applying = _slow_front_end_message(widget, inside)
    assert inside.wait(5)
    copy_into(widget, _figure([1.0, 2.0, 3.0, 4.0]), replace=replace)  # the watcher's refresh
    applying.join(5)
    assert not applying.is_alive()
    assert [list(t["x"]) for t in front.traces] == [[1.0, 2.0, 3.0, 4.0], [1.0]]
    assert [list(t.x) for t in widget.data] == [[1.0, 2.0, 3.0, 4.0], [1.0]]


def test_a_new_trace_added_while_a_front_end_message_is_applied_reaches_the_front_end() -> None:
    widget = ThreadSafeFigureWidget(go.Figure())
    front = FrontEndView()
    _listen(widget, front)
    inside = threading.Event()
    applying = _slow_front_end_message(widget, inside)
    assert inside.wait(5)
    copy_into(widget, _figure([5.0, 6.0, 7.0]))  # trace list changed shape: delete + add
    applying.join(5)
    assert [len(t["x"]) for t in front.traces] == [3, 1]


class _FakeStudy:
    """What StudyFigure needs of a Study: wait, subscribe, and the state builds read."""

    def __init__(self) -> None:
        self.points_now = [1.0]

    def wait(self, timeout_s: float | None = None) -> bool:
        return True

    def subscribe(self, callback: Any) -> Any:
        return lambda: None


def test_a_watcher_refresh_that_read_the_study_before_finish_is_not_applied_after_it() -> None:
    """The quickstart's study figure once ended with 8 of 9 points: the watcher thread had
    built its refresh while the last run was ending, finish() then drew all 9, and the
    watcher's stale figure landed last."""
    from gtopk_lab.plotting.live_study import StudyFigure

    study = _FakeStudy()
    reading = threading.Event()

    def build(s: _FakeStudy) -> go.Figure:
        xs = list(s.points_now)  # what this build read of the study
        if threading.current_thread().name == "watcher":
            reading.set()
            time.sleep(0.4)  # a slow build, as on a loaded box
        return go.Figure([go.Scatter(x=xs, y=xs, mode="markers")])

    view = StudyFigure(study, build, live=True)
    watcher = threading.Thread(target=view._refresh, args=(study,), name="watcher")
    watcher.start()
    assert reading.wait(5)
    study.points_now = [1.0, 8.0]  # the last run ended meanwhile
    final = view.finish()
    watcher.join(5)
    assert list(final.data[0].x) == [1.0, 8.0]
    view._refresh(study)  # a watcher call after finish() changes nothing
    study.points_now = [1.0]
    view._refresh(study)
    assert list(view.figure.data[0].x) == [1.0, 8.0]
