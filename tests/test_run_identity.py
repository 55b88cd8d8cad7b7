"""Run identity (issue 26 item 4): every summary records its study, tags and the study's varied
fields beside the config (the config hash, and so the point, unchanged); a point that another
study completed is reused and labelled with both; ``Lab.runs`` and ``gtopk-lab runs`` filter
by study and tag and group by study. One 2-worker LocalCluster runs tiny simulated points."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration.run_files import config_hash
from gtopk_lab.orchestration.run_identity import (
    RunLabels, filter_runs, record_labels, run_labels, study_order, varied_fields, with_labels,
)
from gtopk_lab.orchestration.study_grid import StudyPoint

TINY = dict(model="mlp", max_iterations=4, train_samples=256, test_samples=32, batch_size=16,
            sink_every=2, bandwidth="10GbE", epochs=2, density=0.05)


# ------------------------------------------------------------------------------- units
@pytest.mark.timeout(30)
def test_varied_fields_are_the_fields_whose_values_differ() -> None:
    points = [StudyPoint(RunConfig(**{**TINY, "method": m, "workers": p}), "simulated")
              for m, p in (("dense", 1), ("gtopk", 2), ("gtopk", 4))]
    assert varied_fields(points) == ["method", "workers"]
    points.append(StudyPoint(RunConfig(**{**TINY, "method": "gtopk", "workers": 4, "seed": 1}), "real"))
    assert varied_fields(points) == ["method", "workers", "seed", "source"]
    assert varied_fields(points[:1]) == []


@pytest.mark.timeout(30)
def test_labels_accumulate_first_study_stays_and_bad_labels_name_the_key() -> None:
    a = RunLabels("alpha", ("t1",), {"workers": 2})
    b = RunLabels("beta", ("t2", "t1"), {"density": 0.05})
    once = with_labels({"run_id": "r"}, a)
    twice = with_labels(once, b)
    assert (twice["study_id"], twice["study_ids"], twice["tags"]) == ("alpha", ["alpha", "beta"], ["t1", "t2"])
    assert twice["varied"] == {"workers": 2}  # the study that ran it
    assert twice["studies"] == {"alpha": {"tags": ["t1"], "varied": {"workers": 2}},
                                "beta": {"tags": ["t2", "t1"], "varied": {"density": 0.05}}}
    assert with_labels(twice, b) == twice  # recording a study again changes nothing
    for bad, error, word in (({"study_id": "a/b"}, ValueError, "study_id"), ({"study_id": 3}, TypeError, "study_id"),
                             ({"tags": [1]}, TypeError, "tags"), ({"tags": [" x"]}, ValueError, "tags"),
                             ({"colour": "red"}, ValueError, "colour"), ("alpha", TypeError, "labels")):
        with pytest.raises(error, match=word):
            run_labels(bad)


@pytest.mark.timeout(30)
def test_filter_and_order_by_study_against_hand_made_rows() -> None:
    rows = pd.DataFrame([
        {"run_id": "r1", "study_id": "s1", "study_ids": ["s1"], "tags": ["a"], "submitted_at": "T1"},
        {"run_id": "r2", "study_id": "s2", "study_ids": ["s2"], "tags": ["b"], "submitted_at": "T2"},
        {"run_id": "r3", "study_id": "s1", "study_ids": ["s1", "s2"], "tags": ["a", "b"], "submitted_at": "T3"},
        {"run_id": "r4", "study_id": None, "study_ids": None, "tags": None, "submitted_at": "T4"},
        {"run_id": "r0", "study_id": None, "study_ids": None, "tags": None, "submitted_at": "T0"}])
    assert filter_runs(rows, study="s2")["run_id"].tolist() == ["r2", "r3"]
    assert filter_runs(rows, study=["s1", "nope"])["run_id"].tolist() == ["r1", "r3"]
    assert filter_runs(rows, tag="a")["run_id"].tolist() == ["r1", "r3"]
    assert filter_runs(rows, tag=["a", "b"])["run_id"].tolist() == ["r3"]
    assert filter_runs(rows, study="s1", tag="b")["run_id"].tolist() == ["r3"]
    assert filter_runs(rows, study="zzz").empty
    # s1 stands where its first run was (T1), s2 at T2; lone runs where they were
    assert study_order(rows)["run_id"].tolist() == ["r0", "r1", "r3", "r2", "r4"]


@pytest.mark.timeout(30)
def test_record_labels_rewrites_the_stored_summary_under_its_lock(tmp_path: Path) -> None:
    from gtopk_lab.orchestration.locks import lock_run

    run = tmp_path / "r1"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"run_id": "r1", "status": "completed", "study_id": "s1",
                                                  "study_ids": ["s1"], "tags": ["x"]}))
    updated = record_labels(run, RunLabels("s2", ("y",)))
    stored = json.loads((run / "summary.json").read_text())
    assert updated == stored and stored["study_ids"] == ["s1", "s2"] and stored["tags"] == ["x", "y"]
    with lock_run(run):  # another client writes it: the label waits, then gives up, nothing changes
        assert record_labels(run, RunLabels("s3"), timeout_s=0.3) is None
    assert json.loads((run / "summary.json").read_text())["study_ids"] == ["s1", "s2"]
    assert record_labels(tmp_path / "missing", RunLabels("s3")) is None


# ------------------------------------------------------------------------------- a cluster
@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from gtopk_lab.orchestration import Lab

    with Lab(n_workers=2, out=str(tmp_path_factory.mktemp("identity")), timeout_s=30, progress=False) as lab:
        yield lab


def _summaries(out: str) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in Path(out).glob("*/summary.json")}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_studies_record_identity_share_points_and_filter(lab, capsys: pytest.CaptureFixture[str]) -> None:
    from gtopk_lab.cli.main import main

    alpha = lab.study(methods=["dense", "gtopk"], workers=[1, 2], simulate=True, compute="measured",
                      base=TINY, study_id="alpha", tags=["t1"])
    assert alpha.wait(240) and alpha.study_id == "alpha"
    want = {("dense", 1), ("dense", 2), ("gtopk", 1), ("gtopk", 2)}
    stored = _summaries(lab.out)
    assert {(s["method"], s["workers"]) for s in stored.values()} == want
    for run_id, s in stored.items():
        assert s["status"] == "completed", s.get("error")
        assert (s["study_id"], s["study_ids"], s["tags"]) == ("alpha", ["alpha"], ["t1"])
        # the grid varies method and P only: those, with this point's values
        assert s["varied"] == {"method": s["method"], "workers": s["workers"]}
        config = json.loads((Path(lab.out) / run_id / "config.json").read_text())
        assert not {"study_id", "tags", "varied"} & set(config)  # identity is beside the config
        fields = {**TINY, "method": s["method"], "workers": s["workers"]}
        assert s["config_hash"] == config["config_hash"] == config_hash(RunConfig(**fields))

    shared = next(r for r, s in stored.items() if (s["method"], s["workers"]) == ("gtopk", 2))
    # a second study sharing gTop-k P=2: reused (not run again), labelled with both studies
    beta = lab.study(methods=["gtopk"], workers=[2], simulate=True, compute="measured", base=TINY,
                     study_id="beta", tags="t2")
    assert beta.wait(120)
    assert not beta.handles and beta.summaries()["skipped"].all()
    assert beta.summaries()["run_id"].tolist() == [shared]
    again = _summaries(lab.out)[shared]
    assert (again["study_id"], again["study_ids"], again["tags"]) == ("alpha", ["alpha", "beta"], ["t1", "t2"])
    assert again["studies"]["beta"] == {"tags": ["t2"], "varied": {}}  # beta's one point varies nothing
    assert len(_summaries(lab.out)) == 4  # nothing ran twice

    # the same config submitted alone (not as a study's point: it runs): the same hash, no identity
    _, lone = lab.run(RunConfig(**{**TINY, "method": "gtopk", "workers": 2}), simulate=True)
    assert lone["status"] == "completed" and lone["run_id"] != shared
    assert lone["config_hash"] == stored[shared]["config_hash"]
    assert (lone["study_id"], lone["study_ids"], lone["tags"]) == (None, [], [])

    # Lab.runs and the CLI filter by study and tag; grouped by study
    assert lab.runs(study="beta")["run_id"].tolist() == [shared]
    assert set(lab.runs(study="alpha")["run_id"]) == set(stored)
    assert set(lab.runs(tag="t1")["run_id"]) == set(stored) and lab.runs(tag=["t1", "t2"])["run_id"].tolist() == [shared]
    grouped = [i for i, s in enumerate(lab.runs()["study_id"]) if s == "alpha"]
    assert len(grouped) == 4 and grouped == list(range(grouped[0], grouped[0] + 4))  # together

    def cli(*argv: str) -> list[dict]:
        assert main(["runs", "--out", lab.out, "--json", *argv]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert [r["run_id"] for r in cli("--study", "beta")] == [shared]
    assert {r["run_id"] for r in cli("--study", "alpha")} == set(stored)
    assert [r["run_id"] for r in cli("--tag", "t1", "--tag", "t2")] == [shared]
    assert cli("--study", "nobody") == []
    assert main(["runs", "--out", lab.out, "--study", "beta"]) == 0
    table = capsys.readouterr().out
    assert "alpha, beta [t1, t2]" in table and shared in table and len(table.strip().splitlines()) == 2
    assert main(["runs", "--out", lab.out, "--study", "nobody"]) == 0
    assert "no runs" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_study_cli_takes_study_id_and_tags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gtopk_lab.cli.main import main

    out = tmp_path / "out"
    argv = ["study", "--methods", "gtopk", "--workers", "2", "--simulate", "--n-workers", "1",
            "--compute", "measured", "--model", "mlp", "--max-iterations", "4", "--epochs", "2",
            "--train-samples", "256", "--test-samples", "32", "--batch-size", "16", "--density", "0.05",
            "--no-progress", "--out", str(out)]
    assert main([*argv, "--study-id", "a/b"]) == 2
    assert "--study-id='a/b' is invalid" in capsys.readouterr().err
    assert not out.exists()  # refused before anything was written
    assert main([*argv, "--study-id", "cli-study", "--tag", "x,y", "--tag", "z"]) == 0
    (summary,) = _summaries(str(out)).values()
    assert (summary["study_id"], summary["tags"]) == ("cli-study", ["x", "y", "z"])
    assert "gtopk-lab runs --study cli-study" in capsys.readouterr().out
    # gtopk-lab sweep takes them too; its point is the study's, reused and labelled
    sweep = ["sweep", *argv[1:argv.index("--compute")], *argv[argv.index("--compute") + 2:]]
    assert main([*sweep, "--bandwidth", "1GbE", "--study-id", "cli-sweep", "--tag", "w"]) == 0
    (again,) = _summaries(str(out)).values()
    assert (again["study_ids"], again["tags"]) == (["cli-study", "cli-sweep"], ["w", "x", "y", "z"])


# ------------------------------------------------------------------------------- the panel
@pytest.mark.timeout(60)
def test_panel_passes_the_study_name_and_tags_and_names_a_bad_one() -> None:
    import html
    import re

    from gtopk_lab.plotting.controls import ControlPanel

    class Study:
        handles: dict = {}
        points_list: list = []

        def __init__(self, study_id: str) -> None:
            self.study_id = study_id

        def status(self) -> pd.DataFrame:
            return pd.DataFrame(columns=["method", "workers", "density", "bandwidth", "latency", "seed",
                                         "source", "run_id", "status", "rows"])

        def points(self) -> pd.DataFrame:
            return pd.DataFrame()

        metrics = points

        def subscribe(self, callback):  # noqa: ANN001, ANN202
            return lambda: None

        def done(self) -> bool:
            return True

    class Lab:
        closed, out = False, "unused"

        def __init__(self) -> None:
            self.calls: list[dict] = []

        def study(self, **kwargs):  # noqa: ANN003, ANN202
            self.calls.append(kwargs)
            return Study(kwargs.get("study_id") or "generated")

        def runs(self) -> pd.DataFrame:
            return pd.DataFrame()

    lab = Lab()
    panel = ControlPanel(lab, defaults={"methods": ["gtopk"], "workers": [2]})
    panel.launch().result(10)
    assert "study_id" not in lab.calls[0] and "tags" not in lab.calls[0]  # blank: the study names itself
    panel.study_name.value, panel.tags.value = " rho-1GbE ", "a, b c"
    panel.launch().result(10)
    assert (lab.calls[1]["study_id"], lab.calls[1]["tags"]) == ("rho-1GbE", ("a", "b", "c"))
    assert "rho-1GbE" in panel.run_lines.value
    panel.study_name.value = "a/b"
    assert panel.launch() is None and len(lab.calls) == 2
    message = html.unescape(re.sub(r"<[^>]+>", "", panel.message.value))
    assert message.startswith("study name: ") and "\n" not in message


@pytest.mark.timeout(120)
def test_a_resumed_simulated_run_keeps_its_study_and_tags(tmp_path: Path) -> None:
    from gtopk_lab.orchestration.results import RunStore, run_summary
    from gtopk_lab.orchestration.simulated_run import simulate_run

    config = RunConfig(**{**TINY, "method": "gtopk", "workers": 2, "run_id": "r-failed"})
    identity = with_labels({}, RunLabels("alpha", ("t1",), {"workers": 2}))
    RunStore(tmp_path, "r-failed").write_summary(run_summary(config, None, status="failed", identity=identity))
    summary = simulate_run(config, str(tmp_path))
    assert summary["status"] == "completed", summary.get("error")
    stored = json.loads((tmp_path / "r-failed" / "summary.json").read_text())
    for got in (summary, stored):
        assert (got["study_id"], got["study_ids"], got["tags"], got["varied"]) == ("alpha", ["alpha"], ["t1"],
                                                                                 {"workers": 2})
