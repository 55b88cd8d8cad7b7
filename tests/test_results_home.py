"""The one results home (issue 26 item 4): ``$GTOPK_LAB_RESULTS``, else ``results/`` of the
gtopk-lab project around the current folder (from any subfolder, e.g. ``notebooks/``), else
``./results``; and every default that uses it (Lab, load_runs, the CLI's --out, the
notebooks' parameters). Every folder here is a tmp dir: no test writes into the repository."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from gtopk_lab.results_home import ENV_VAR, project_root, results_home

ROOT = Path(__file__).resolve().parents[1]


def _project(root: Path, name: str = "gtopk-lab") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0"\n')
    return root


@pytest.mark.timeout(30)
def test_env_variable_wins_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = _project(tmp_path / "repo")
    (project / "notebooks").mkdir()
    monkeypatch.chdir(project / "notebooks")
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "elsewhere"))
    assert results_home() == tmp_path / "elsewhere"
    assert results_home("demo") == tmp_path / "elsewhere" / "demo"
    monkeypatch.setenv(ENV_VAR, "~/gl-results")  # ~ expanded, made absolute
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert results_home() == tmp_path / "home" / "gl-results"
    monkeypatch.setenv(ENV_VAR, "relative/res")
    assert results_home() == project / "notebooks" / "relative" / "res"
    monkeypatch.setenv(ENV_VAR, "")  # empty: as if unset
    assert results_home() == project / "results"


@pytest.mark.timeout(30)
def test_project_root_found_from_any_subfolder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    project = _project(tmp_path / "repo")
    deep = project / "notebooks" / "a" / "b"
    deep.mkdir(parents=True)
    for folder in (project, project / "notebooks", deep):
        monkeypatch.chdir(folder)
        assert results_home() == project / "results", folder
        assert project_root() == project
    # PEP 503: gtopk_lab / GTOPK.Lab name the same project
    _project(tmp_path / "other", "GTOPK_Lab")
    assert project_root(tmp_path / "other") == tmp_path / "other"


@pytest.mark.timeout(30)
def test_foreign_or_broken_pyproject_is_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    project = _project(tmp_path / "repo")
    inner = _project(project / "vendored" / "thing", "something-else")  # nearest, but not ours
    monkeypatch.chdir(inner)
    assert results_home() == project / "results"
    (inner / "pyproject.toml").write_text("[project\nname = ")  # not TOML
    assert results_home() == project / "results"


@pytest.mark.timeout(30)
def test_fallback_is_results_of_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    lone = tmp_path / "lone"
    lone.mkdir()
    monkeypatch.chdir(lone)
    if project_root() is not None:  # a gtopk-lab checkout above the tmp dir: cannot test here
        pytest.skip(f"{project_root()} holds gtopk-lab's pyproject.toml above {lone}")
    assert results_home() == lone / "results"
    assert not (lone / "results").exists()  # deciding writes nothing


@pytest.mark.timeout(30)
def test_the_repository_itself_is_a_project_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.chdir(ROOT / "notebooks")
    assert results_home() == ROOT / "results"


@pytest.mark.timeout(60)
def test_cli_defaults_name_the_results_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gtopk_lab.cli.main import build_parser

    home = tmp_path / "home"
    monkeypatch.setenv(ENV_VAR, str(home))
    parser = build_parser()
    for argv in (["run"], ["sweep"], ["study"], ["runs"]):
        assert parser.parse_args(argv).out == str(home), argv
    assert parser.parse_args(["demo"]).out == str(home / "demo")
    assert parser.parse_args(["report"]).results_dir == str(home)
    sub = next(a for a in parser._subparsers._group_actions if a.dest == "command")  # noqa: SLF001
    assert "$GTOPK_LAB_RESULTS" in sub.choices["runs"].format_help()


@pytest.mark.timeout(60)
def test_runs_lists_the_home_and_load_runs_defaults_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from gtopk_lab.cli.main import main
    from gtopk_lab.orchestration.results import load_runs

    home = tmp_path / "home"
    run = home / "r1"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"method": "dense", "workers": 1}))
    (run / "summary.json").write_text(json.dumps({"run_id": "r1", "status": "queued", "method": "dense",
                                                  "workers": 1, "study_id": "s", "study_ids": ["s"]}))
    monkeypatch.setenv(ENV_VAR, str(home))
    monkeypatch.chdir(tmp_path)
    assert main(["runs", "--json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out.strip().splitlines()[-1])] == ["r1"]
    assert load_runs()[0]["run_id"].tolist() == ["r1"]


@pytest.mark.timeout(30)
def test_notebooks_default_to_the_home_and_tests_never_write_into_the_repository() -> None:
    import os

    # the test session itself points the home away from the repository (tests/conftest.py)
    assert Path(os.environ[ENV_VAR]).resolve() != (ROOT / "results").resolve()
    for path in sorted((ROOT / "notebooks").glob("0*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        source = "\n".join(c.source for c in nb.cells)
        params = next((c.source for c in nb.cells if "parameters" in c.metadata.get("tags", [])), "")
        if "out =" not in params:
            continue
        assert re.search(r"^out = None\b", params, re.M), path.name  # None: Lab's default, the home
        assert "out=out" in source, path.name
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), path.name
