"""The packaging files agree with each other and with the README contract."""

from __future__ import annotations

import asyncio
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# conda-forge / pytorch channel names for PyPI distributions whose names differ
CONDA_NAMES = {"torch": "pytorch"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _environment_names() -> set[str]:
    names = set()
    for line in (ROOT / "environment.yml").read_text().splitlines():
        m = re.match(r"^\s*-\s+([A-Za-z0-9_.\-]+)", line)
        if m and m.group(1) not in ("pip", "e"):
            names.add(_name(m.group(1)))
    return names


def test_every_runtime_dependency_is_in_environment_yml(pyproject: dict) -> None:
    env = _environment_names()
    missing = [
        req for req in pyproject["project"]["dependencies"]
        if CONDA_NAMES.get(_name(req), _name(req)) not in env
    ]
    assert not missing, f"runtime dependencies missing from environment.yml: {missing}"


def test_every_dev_dependency_is_in_environment_yml(pyproject: dict) -> None:
    env = _environment_names()
    missing = [req for req in pyproject["project"]["optional-dependencies"]["dev"]
               if _name(req) not in env]
    assert not missing, f"dev dependencies missing from environment.yml: {missing}"


def test_torch_is_a_range_and_the_makefile_pins_the_cpu_wheel(pyproject: dict) -> None:
    torch_req = next(r for r in pyproject["project"]["dependencies"] if _name(r) == "torch")
    assert ">=" in torch_req and "<" in torch_req
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH\s*\?=\s*torch==2\.13\.0$", makefile, re.M)


def test_readme_quick_start_is_make_demo_and_make_test() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^(make \w+)\s*$", quick, re.M)
    assert commands == ["make demo", "make test"]


def test_ci_runs_make_test() -> None:
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_console_script_is_declared(pyproject: dict) -> None:
    assert pyproject["project"]["scripts"]["gtopk-lab"] == "gtopk_lab.cli:main"


def test_notebook_and_tracking_extras(pyproject: dict) -> None:
    extras = pyproject["project"]["optional-dependencies"]
    assert [_name(r) for r in extras["notebook"]] == ["dask-labextension"]
    assert [_name(r) for r in extras["mlflow"]] == ["mlflow-skinny"]
    assert [_name(r) for r in extras["wandb"]] == ["wandb"]
    # the dev install carries the notebook and mlflow extras, so their tests run in CI
    dev = {_name(r) for r in extras["dev"]}
    assert {"dask-labextension", "mlflow-skinny"} <= dev


def test_dask_labextension_is_a_jupyter_server_extension() -> None:
    # Its import makes a tornado Future, which needs a current event loop, as Jupyter's
    # server has; an earlier test's asyncio.run() in this process leaves none set.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        ext = pytest.importorskip("dask_labextension", reason="the notebook extra is not installed")
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    points = getattr(ext, "_jupyter_server_extension_points", None) or ext._jupyter_server_extension_paths
    assert {p["module"] for p in points()} == {"dask_labextension"}
