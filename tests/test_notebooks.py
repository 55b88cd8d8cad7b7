"""Execute every notebook with papermill and small parameters (CI sizes: P <= 4, few iterations).

Each run must finish without a cell error and leave at least one figure that renders
without a live kernel (``application/vnd.plotly.v1+json`` or plotly ``text/html``), which
``GTOPK_LAB_STATIC=1`` guarantees for the live figures (see gtopk_lab.plotting.live).
"""

from __future__ import annotations

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
                             "densities": [0.01], "model": "mlp", "epochs": 1, "train_samples": 640,
                             "test_samples": 200},
    "02_scaling_efficiency.ipynb": {"n_workers": 2, "real_workers": [1, 2], "sim_workers": [4],
                                    "methods": ["dense", "gtopk", "oktopk"], "bandwidths": ["1GbE"], "density": 0.01,
                                    "model": "mlp", "max_iterations": 6, "train_samples": 600,
                                    "extrapolate_to": 1024},
    "03_topk_operator.ipynb": {"iterations": 30, "snapshots": [5, 29], "speed_numel": 200_000,
                               "speed_repeats": 2, "densities": [0.001, 0.01, 0.1, 0.5]},
    "04_cluster.ipynb": {"n_workers": 2, "workers": 2, "max_iterations": 8},
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


def test_notebooks_are_generated_from_build_script(tmp_path: Path) -> None:
    sys.path.insert(0, str(NOTEBOOK_DIR))
    try:
        import _build  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(NOTEBOOK_DIR))
    for path in _build.build(tmp_path):
        assert path.read_text() == (NOTEBOOK_DIR / path.name).read_text(), \
            f"{path.name} differs from notebooks/_build.py: run `python notebooks/_build.py`"


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", sorted(CI_PARAMETERS))
def test_notebook_executes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    papermill = pytest.importorskip("papermill")
    monkeypatch.setenv("GTOPK_LAB_STATIC", "1")  # the kernel inherits it: static figures
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    params = dict(CI_PARAMETERS[name])
    nb_source = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    if "out =" in next(c.source for c in nb_source.cells if "parameters" in c.metadata.get("tags", [])):
        params["out"] = str(tmp_path / "results")
    executed = tmp_path / name
    started = time.monotonic()
    papermill.execute_notebook(str(NOTEBOOK_DIR / name), str(executed), parameters=params,
                               kernel_name="python3", cwd=str(tmp_path), progress_bar=False,
                               execution_timeout=120)
    elapsed = time.monotonic() - started
    nb = nbformat.read(executed, as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    figures = _figure_outputs(nb)
    assert figures, f"{name}: no figure output that renders without a live kernel"
    plotly_json = [o for o in figures if "application/vnd.plotly.v1+json" in o["data"]]
    assert plotly_json and plotly_json[0]["data"]["application/vnd.plotly.v1+json"]["data"], name
    artifacts = ROOT / "test-artifacts" / "notebooks"
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / name).write_text(executed.read_text())
    print(f"{name}: {elapsed:.1f} s, {len(figures)} figures")
