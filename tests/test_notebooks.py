"""Execute every notebook with papermill and small parameters (CI sizes: P <= 4, few iterations).

Each run must finish without a cell error and leave at least one figure that renders
without a live kernel (``application/vnd.plotly.v1+json`` or plotly ``text/html``), which
``GTOPK_LAB_STATIC=1`` guarantees for the live figures (see gtopk_lab.plotting.live), and
its ``jupyter nbconvert --to html`` export must carry plotly.js exactly once and load
nothing from a CDN for its figures.

:func:`test_exported_html_renders_offline` opens such an export in Chromium with every
network request aborted and checks that each figure drew SVG traces: in notebook order,
with the plotly.js carrier moved below a figure (out-of-order execution), and, as the
control that shows the network really is off, not at all with the old CDN bundles.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"

#: Small parameters per notebook; every notebook's parameters cell is overridden here.
CI_PARAMETERS: dict[str, dict[str, Any]] = {
    "00_quickstart.ipynb": {"n_workers": 2, "workers": 2, "epochs": 1, "train_samples": 600,
                            "max_iterations": 12, "study_workers": [1, 2, 4], "study_max_iterations": 8},
    "01_convergence.ipynb": {"n_workers": 2, "workers": 2, "methods": ["dense", "topk", "gtopk", "gaussiank"],
                             "densities": [0.01], "seeds": 1, "model": "mlp", "epochs": 1, "train_samples": 640,
                             "test_samples": 200},
    # P = 4 runs as a simulator task on the 2-worker cluster: both sources in ~7 tiny runs
    "02_scaling_efficiency.ipynb": {"n_workers": 2, "workers": [1, 2, 4], "real_max_workers": None,
                                    "both_ways": [], "methods": ["dense", "gtopk"], "bandwidths": ["1GbE"],
                                    "density": 0.01, "seeds": 1, "model": "mlp", "max_iterations": 8,
                                    "train_samples": 600, "extrapolate_to": 1024},
    "03_topk_operator.ipynb": {"iterations": 30, "snapshots": [5, 29], "speed_numel": 200_000,
                               "speed_repeats": 2, "densities": [0.001, 0.01, 0.1, 0.5]},
    "04_cluster.ipynb": {"n_workers": 2, "workers": 2, "max_iterations": 8},
    # every method on both workloads at P = 2 simulated on the 2-worker cluster (dense P = 1
    # real): 2 x 11 tiny runs
    # one method of each kind (per step, layer-wise, local steps) keeps CI inside its budget;
    # every method runs through the same cells, and each has its own tests
    "05_modern_methods.ipynb": {"n_workers": 2, "workers": [2], "gpt_workers": [2], "real_max_workers": 1,
                                "methods": ["dense", "gtopk", "powersgd", "sparseloco"], "gpt_iterations": 6,
                                "gpt_batch_size": 4, "gpt_val_sequences": 32, "mnist_model": "mlp", "mnist_iterations": 8,
                                "mnist_train_samples": 400, "sync_every": 2},
}


def _figure_outputs(nb: nbformat.NotebookNode) -> list[dict]:
    found = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "application/vnd.plotly.v1+json" in data or "plotly" in str(data.get("text/html", "")).lower():
                found.append(output)
    return found


def test_every_notebook_has_ci_parameters_and_a_parameters_cell() -> None:
    names = sorted(p.name for p in NOTEBOOK_DIR.glob("0*.ipynb"))
    assert names == sorted(CI_PARAMETERS)
    for name in names:
        nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, name
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{name} stored with outputs"
        declared = tagged[0].source
        for key in CI_PARAMETERS[name]:
            assert f"{key} =" in declared, f"{name}: CI parameter {key} is not in the parameters cell"


def test_papermill_reads_every_ci_parameter_from_the_parameters_cell() -> None:
    """papermill's own parser (what ``papermill -p`` and its "Passed unknown parameter"
    warning use) finds each CI parameter: a second ``=`` on a line, even in its comment,
    makes it skip that line."""
    papermill = pytest.importorskip("papermill")
    for name, params in CI_PARAMETERS.items():
        declared = set(papermill.inspect_notebook(str(NOTEBOOK_DIR / name)))
        assert set(params) <= declared, f"{name}: papermill does not see {sorted(set(params) - declared)}"


def test_notebooks_are_generated_from_build_script(tmp_path: Path) -> None:
    sys.path.insert(0, str(NOTEBOOK_DIR))
    try:
        import _build  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(NOTEBOOK_DIR))
    for path in _build.build(tmp_path):
        assert path.read_text() == (NOTEBOOK_DIR / path.name).read_text(), \
            f"{path.name} differs from notebooks/_build.py: run `python notebooks/_build.py`"


def test_plotlyjs_is_embedded_once_per_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first displayed static figure carries plotly.js, later ones only their div;
    a re-run of the carrier cell (its old outputs replaced) carries it again."""
    import plotly.graph_objects as go

    from gtopk_lab.plotting import static_figures as live

    fig = go.Figure(go.Scatter(x=[1, 2], y=[2, 1]), layout={"title": "</script><b>x</b>", "height": 300})
    monkeypatch.setattr(live, "_plotlyjs_carrier", None)
    monkeypatch.delenv(live.PLOTLYJS_ENV, raising=False)
    request = {"cell": "c1", "msg": "m1"}
    monkeypatch.setattr(live, "_current_request", lambda: (request["cell"], request["msg"]))
    first = live.kernel_bundle(fig)["text/html"]
    assert "window.PlotlyConfig" in first and len(first) > 3_000_000
    request["msg"] = "m1"  # a second figure of the same execution: no second copy
    assert "window.PlotlyConfig" not in live.kernel_bundle(fig)["text/html"]
    request.update(cell="c2", msg="m2")
    later = live.kernel_bundle(fig)["text/html"]
    assert "window.PlotlyConfig" not in later and len(later) < 20_000
    assert "window.Plotly.newPlot" in later and "GTOPK_LAB_PLOTLYJS=every" in later  # draws late, or says why
    assert "</script><b>" not in later and "height:300px" in later  # the title cannot end the script early
    request.update(cell="c1", msg="m3")  # the carrier cell runs again: its outputs are replaced
    assert "window.PlotlyConfig" in live.kernel_bundle(fig)["text/html"]
    monkeypatch.setenv(live.PLOTLYJS_ENV, "every")
    assert "window.PlotlyConfig" in live.kernel_bundle(fig)["text/html"]
    monkeypatch.setenv(live.PLOTLYJS_ENV, "cdn")
    assert "cdn.plot.ly" in live.kernel_bundle(fig)["text/html"]
    monkeypatch.setenv(live.PLOTLYJS_ENV, "sometimes")
    with pytest.raises(ValueError, match="GTOPK_LAB_PLOTLYJS='sometimes' is invalid"):
        live.kernel_bundle(fig)
    with pytest.raises(ValueError, match="plotlyjs='directory'"):
        live.static_bundle(fig, plotlyjs="directory")


#: the notebooks this file executes; tests/test_notebooks_more.py executes the others (two
#: files, so that pytest-xdist's ``--dist loadfile`` can give them to both workers)
HERE: tuple[str, ...] = ("00_quickstart.ipynb", "02_scaling_efficiency.ipynb")


def notebook_execution_test(names: tuple[str, ...]) -> Any:
    """The test that executes each of ``names`` (:func:`execute_and_check`); each file binds
    it to ``test_notebook_executes``."""

    @pytest.mark.notebook
    @pytest.mark.slow
    @pytest.mark.timeout(150)
    @pytest.mark.parametrize("name", names)
    def test_notebook_executes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        execute_and_check(name, tmp_path, monkeypatch)

    return test_notebook_executes


test_notebook_executes = notebook_execution_test(HERE)


#: what jupyter_client says when the kernel could not start; one cause is a race no test
#: controls: the client picks five free ports, and before the kernel binds them another
#: process on the box (the suite's other worker, a Dask or gloo listener) may take one
#: ("zmq.error.ZMQError: Address already in use", seen once in a fresh clone's make test)
KERNEL_START_FAILED = "Kernel died before replying to kernel_info"


def execute(papermill: Any, source: str, output: str, **kwargs: Any) -> None:
    """``papermill.execute_notebook`` with one retry when the kernel failed to start (ports
    taken between choosing and binding them: :data:`KERNEL_START_FAILED`); a notebook whose
    cells fail still fails at once. A second start failure raises."""
    try:
        papermill.execute_notebook(source, output, **kwargs)
    except RuntimeError as exc:
        if KERNEL_START_FAILED not in str(exc):
            raise
        papermill.execute_notebook(source, output, **kwargs)


def execute_and_check(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Execute ``name`` with its CI parameters and check its figures and HTML export (the
    module docstring)."""
    papermill = pytest.importorskip("papermill")
    monkeypatch.setenv("GTOPK_LAB_STATIC", "1")  # the kernel inherits it: static figures
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    params = dict(CI_PARAMETERS[name])
    nb_source = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    if "out =" in next(c.source for c in nb_source.cells if "parameters" in c.metadata.get("tags", [])):
        params["out"] = str(tmp_path / "results")
    executed = tmp_path / name
    started = time.monotonic()
    execute(papermill, str(NOTEBOOK_DIR / name), str(executed), parameters=params,
            kernel_name="python3", cwd=str(tmp_path), progress_bar=False, execution_timeout=120)
    elapsed = time.monotonic() - started
    nb = nbformat.read(executed, as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    figures = _figure_outputs(nb)
    assert figures, f"{name}: no figure output that renders without a live kernel"
    plotly_json = [o for o in figures if "application/vnd.plotly.v1+json" in o["data"]]
    assert plotly_json and plotly_json[0]["data"]["application/vnd.plotly.v1+json"]["data"], name
    html = _export_html(nb)
    # the embed's own script tag (widget bundles that nbconvert inlines for a notebook with
    # widgets mention window.PlotlyConfig inside their JavaScript too)
    assert html.count('<script type="text/javascript">window.PlotlyConfig') == 1, \
        f"{name}: plotly.js not embedded exactly once"
    assert not re.search(r"<script[^>]+src=[\"']https?://cdn\.plot\.ly", html), \
        f"{name}: a figure loads plotly.js from the CDN"
    artifacts = ROOT / "test-artifacts" / "notebooks"
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / name).write_text(executed.read_text())
    print(f"{name}: {elapsed:.1f} s, {len(figures)} figures")


def _export_html(nb: nbformat.NotebookNode) -> str:
    """``jupyter nbconvert --to html`` of ``nb`` (the default lab template)."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    return body


#: A notebook of three static figures (no cluster: seconds to run), shown the way every
#: gtopk-lab notebook shows them: show() of a finished figure and a static LiveFigure.
_OFFLINE_CELLS = [
    "import plotly.graph_objects as go\nfrom gtopk_lab.plotting.live import show, LiveFigure",
    "show(go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2], name='first'), layout={'title': 'first'}))",
    "show(go.Figure([go.Bar(x=['a', 'b'], y=[1, 2], name='bars'), go.Scatter(x=['a', 'b'], y=[2, 1])]))",
    "view = LiveFigure([], builder=lambda m: go.Figure(), live=False)\n"
    "view.figure = go.Figure(go.Scatter(x=[0, 1], y=[1, 0], name='third'))\nview",
]


def _abort_network(aborted: list[str]) -> Any:
    """A Playwright route handler: the file itself loads, every other request is aborted
    (and its URL appended to ``aborted``)."""
    def route(r: Any) -> None:
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            aborted.append(r.request.url)
            r.abort()

    return route


def _rendered_traces(pages: list[Path], tmp_path: Path) -> list[tuple[list[int], list[str], list[str]]]:
    """Per HTML file: (SVG traces drawn per plotly figure, aborted request URLs, page
    errors), each opened in one Chromium with every request but the file itself aborted."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from test_browser import CHROMIUM_ARGS, _chromium  # the same Chromium setup as the JupyterLab test
    finally:
        sys.path.remove(str(ROOT / "tests"))
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install chromium; .ci/run does this)")
    sync_api = pytest.importorskip("playwright.sync_api")
    results = []
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 900}, offline=True)
        try:
            for html in pages:
                aborted: list[str] = []
                errors: list[str] = []
                page = context.new_page()
                page.route("**/*", _abort_network(aborted))
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.goto(html.as_uri(), wait_until="load", timeout=60_000)
                page.wait_for_timeout(1000)  # plotly draws asynchronously after newPlot
                traces = page.evaluate("""() => Array.from(document.querySelectorAll('.plotly-graph-div'))
                    .map(div => div.querySelectorAll('.main-svg .trace').length)""")
                page.close()
                results.append((traces, aborted, errors))
        finally:
            context.close()
    return results


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_exported_html_renders_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    papermill = pytest.importorskip("papermill")
    from nbformat.v4 import new_code_cell, new_notebook

    monkeypatch.setenv("GTOPK_LAB_STATIC", "1")
    monkeypatch.delenv("GTOPK_LAB_PLOTLYJS", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    source = new_notebook(cells=[new_code_cell(c) for c in _OFFLINE_CELLS],
                          metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                   "language": "python"}})
    nbformat.write(source, tmp_path / "figures.ipynb")
    execute(papermill, str(tmp_path / "figures.ipynb"), str(tmp_path / "executed.ipynb"),
            kernel_name="python3", cwd=str(tmp_path), progress_bar=False, execution_timeout=60)
    nb = nbformat.read(tmp_path / "executed.ipynb", as_version=4)
    # Out of order (the carrier of plotly.js below a figure that needs it): drawn at load.
    swapped = nbformat.from_dict(nb)
    swapped.cells[1], swapped.cells[2] = swapped.cells[2], swapped.cells[1]
    # Control: the same figures with plotly.js from the CDN draw nothing offline.
    import plotly.graph_objects as go

    from gtopk_lab.plotting.live import static_bundle

    cdn = nbformat.from_dict(nb)
    for cell in cdn.cells:
        for output in cell.get("outputs", []):
            spec = output.get("data", {}).get("application/vnd.plotly.v1+json")
            if spec is not None:
                fig = go.Figure({k: v for k, v in spec.items() if k != "config"})
                output["data"]["text/html"] = static_bundle(fig, plotlyjs="cdn")["text/html"]
    pages = []
    for name, book in (("executed", nb), ("swapped", swapped), ("cdn", cdn)):
        pages.append(tmp_path / f"{name}.html")
        pages[-1].write_text(_export_html(book), encoding="utf-8")
    (traces, aborted, errors), swapped_result, (cdn_traces, cdn_aborted, _) = _rendered_traces(pages, tmp_path)
    assert traces == [1, 2, 1], (traces, errors)  # every figure drew its traces as SVG
    assert not errors, errors
    assert all(not u.startswith("file:") for u in aborted)  # nbconvert's require.js/MathJax: blocked
    assert swapped_result[0] == [2, 1, 1] and not swapped_result[2], swapped_result
    assert sum(cdn_traces) == 0 and any("cdn.plot.ly" in u for u in cdn_aborted), (cdn_traces, cdn_aborted)


def test_every_notebook_states_its_run_all_time() -> None:
    """The first markdown cell of each notebook says how long Run All takes at its defaults
    on 2 cores (a figure in s or min, measured with papermill; README's walk-through)."""
    for path in sorted(NOTEBOOK_DIR.glob("0*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        first = next(c.source for c in nb.cells if c.cell_type == "markdown")
        assert "Run All" in first, f"{path.name}: the first markdown cell does not state a Run All time"
        assert re.search(r"Run All[\s\S]{0,200}?\b\d+(\.\d+)? ?(s|min)\b", first), \
            f"{path.name}: the Run All sentence carries no time in s or min"
