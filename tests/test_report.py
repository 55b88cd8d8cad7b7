"""HTML report and ``gtopk-lab report`` on a results folder in the documented layout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gtopk_lab.cli import main
from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration.results import run_summary, rows_to_frame, write_run
from gtopk_lab.plotting.report import measured_scaling_table, predicted_scaling_table, write_report
from gtopk_lab.orchestration.results import load_runs
from test_figures import synthetic_run

pytestmark = pytest.mark.timeout(120)


def _write_results(out: Path) -> None:
    """A small sweep (3 methods x P in {1, 2, 4}) plus one failed run, written like the Lab does."""
    for method, density in (("dense", 1.0), ("topk", 0.01), ("gtopk", 0.01)):
        for workers in (1, 2, 4):
            run_id = f"{method}-p{workers}"
            rows, summary = synthetic_run(run_id, method, workers, density, seed=workers)
            config = RunConfig(method=method, workers=workers, density=density, run_id=run_id, bandwidth="1Gbps")
            metrics = rows_to_frame([{k: v for k, v in r.items() if k != "run_id"} for r in rows])
            write_run(out, config, metrics, run_summary(config, summary, status="completed"))
    config = RunConfig(method="gtopk", workers=2, run_id="broken")
    write_run(out, config, rows_to_frame([]), run_summary(config, None, status="failed", error="boom"))


def test_report_is_self_contained_html(tmp_path: Path) -> None:
    _write_results(tmp_path / "res")
    path = write_report(tmp_path / "res", tmp_path / "out" / "report.html")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    # plotly.js inlined once, no CDN or other remote script
    assert text.count("plotly.js v") >= 1 and len(text) > 3_000_000
    assert not re.search(r"<script[^>]+src=", text)
    # one div per figure: 2 convergence + scaling + breakdown + volume
    assert text.count('class="plotly-graph-div"') == 5
    for heading in ("Convergence", "Scaling efficiency", "Time per iteration", "Communication volume",
                    "Paper: scaling efficiency at 32 workers"):
        assert heading in text
    assert "Runs (9 completed of 10)" in text and "broken" in text
    assert "85.70%" in text  # the paper's ResNet-20 gTop-k point
    assert "dense S-SGD at P=1" in text and "dense P=1" in text  # the baseline is stated


def test_scaling_tables(tmp_path: Path) -> None:
    _write_results(tmp_path)
    summaries, _ = load_runs(tmp_path)
    # gTop-k's P=1 run made slower than dense's, so that the two baselines differ
    summaries.loc[summaries.run_id == "gtopk-p1", "samples_per_s_virtual"] *= 0.5
    measured = measured_scaling_table(summaries, "virtual")
    assert len(measured) == 9
    s = summaries.set_index("run_id")
    dense_1 = s.loc["dense-p1", "samples_per_s_virtual"]
    # default = the project's rule: every method against dense S-SGD at P=1
    assert set(measured.baseline) == {"dense P=1"}
    assert set(measured.baseline_samples_per_s) == {dense_1}
    one = measured[measured.workers == 1].set_index("method").scaling_efficiency
    assert one["dense"] == pytest.approx(1.0)
    assert one["gtopk"] == pytest.approx(s.loc["gtopk-p1", "samples_per_s_virtual"] / dense_1)
    row = measured[(measured.method == "dense") & (measured.workers == 4)].iloc[0]
    assert row.scaling_efficiency == pytest.approx(s.loc["dense-p4", "samples_per_s_virtual"] / (4 * dense_1))
    predicted = predicted_scaling_table(summaries)
    assert set(predicted.method) == {"dense", "topk", "gtopk"}
    at32 = predicted[predicted.workers == 32].set_index("method").scaling_efficiency
    # on 1 Gbit/s the dense allreduce of 10k floats costs more than 100 gTop-k pairs
    assert at32["gtopk"] > at32["dense"]
    with pytest.raises(ValueError, match="time_basis"):
        measured_scaling_table(summaries, "cpu")
    with pytest.raises(ValueError, match="baseline='best'"):
        measured_scaling_table(summaries, baseline="best")
    # the same numbers as gtopk-lab sweep prints for these runs
    from gtopk_lab.cli.sweep import sweep_table
    swept = sweep_table(summaries).set_index(["method", "workers"]).efficiency_virtual
    for _, r in measured.iterrows():
        assert r.scaling_efficiency == pytest.approx(swept[r.method, r.workers])
    # explicit opt-out: each method against its own P=1 run, and the table says so
    own = measured_scaling_table(summaries, baseline="own").set_index(["method", "workers"])
    assert own.loc[("gtopk", 4), "scaling_efficiency"] == pytest.approx(
        s.loc["gtopk-p4", "samples_per_s_virtual"] / (4 * s.loc["gtopk-p1", "samples_per_s_virtual"]))
    assert own.loc[("gtopk", 4), "baseline"] == "own P=1" and own.loc[("dense", 4), "baseline"] == "dense P=1"
    # without a dense P=1 run the rule falls back to the method's own P=1 run
    no_dense = measured_scaling_table(summaries[summaries.run_id != "dense-p1"]).set_index(["method", "workers"])
    assert no_dense.loc[("gtopk", 4), "baseline"] == "own P=1"
    assert ("dense", 4) not in no_dense.index  # no baseline at all: left out


def test_report_of_empty_folder(tmp_path: Path) -> None:
    text = write_report(tmp_path, tmp_path / "r.html").read_text()
    assert "No runs in this folder" in text


@pytest.mark.timeout(120)
def test_cli_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_results(tmp_path / "res")
    assert main(["report", str(tmp_path / "res"), "-o", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").stat().st_size > 3_000_000
    assert main(["report", str(tmp_path / "missing"), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "results_dir=" in err and "no such directory" in err
    assert not (tmp_path / "x.html").exists()
