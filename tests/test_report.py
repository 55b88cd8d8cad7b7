"""HTML report and ``gtopk-lab report`` on a results folder in the documented layout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gtopk_lab.cli import main
from gtopk_lab.config import RunConfig
from gtopk_lab.analysis.predict import predict_scaling
from gtopk_lab.network.model import NetworkModel, network_model
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


def write_study_results(out: Path, seeds: int = 2) -> None:
    """A study as the Lab stores it: dense/topk/gtopk x P in {1, 2, 4, 8} x seeds x two
    links, P <= 2 on real ranks and P > 2 simulated (with simulated baselines), one failed
    run. Throughputs follow a simple alpha-beta-like law plus a seed-dependent wobble, so
    that the efficiency has a spread over seeds and sparse methods scale better on 1GbE."""
    cost = {"dense": 0.004, "topk": 0.0015, "gtopk": 0.0008}
    for bandwidth, slow in (("1GbE", 1.0), ("10GbE", 0.1)):
        for seed in range(seeds):
            for method, density in (("dense", 1.0), ("topk", 0.01), ("gtopk", 0.01)):
                for workers in (1, 2, 4, 8):
                    sources = ["real"] if workers <= 2 else ["simulated"]
                    if method == "dense" and workers == 1:
                        sources = ["real", "simulated"]
                    for source in sources:
                        run_id = f"2026-{bandwidth}-{method}-p{workers}-s{seed}-{source[:3]}"
                        rows, summary = synthetic_run(run_id, method, workers, density, seed=workers + 10 * seed)
                        config = RunConfig(method=method, workers=workers, density=density, run_id=run_id,
                                           bandwidth=bandwidth, seed=seed)
                        t = 0.01 + (slow * cost[method] * (workers - 1) ** 0.7 if workers > 1 else 0.0)
                        t *= 1.0 + 0.04 * ((seed * 7 + workers) % 3 - 1) * (workers > 1)
                        summary["samples_per_s_virtual"] = 32 * workers / t
                        summary["batch_size"] = 32
                        net = network_model(bandwidth)
                        summary["bandwidth_bps"], summary["latency_s"] = net.bandwidth_bps, net.latency_s
                        extra = {"source": source, "simulated": source == "simulated"}
                        metrics = rows_to_frame([{k: v for k, v in r.items() if k != "run_id"} for r in rows])
                        write_run(out, config, metrics, run_summary(config, summary, status="completed", extra=extra))
    config = RunConfig(method="gtopk", workers=4, run_id="2026-1GbE-gtopk-p4-broken", bandwidth="1GbE")
    write_run(out, config, rows_to_frame([]), run_summary(config, None, status="failed",
                                                          error="RuntimeError: boom\nTraceback ..."))


def test_report_is_self_contained_html(tmp_path: Path) -> None:
    _write_results(tmp_path / "res")
    path = write_report(tmp_path / "res", tmp_path / "out" / "report.html")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    # plotly.js inlined once, no CDN or other remote script
    assert text.count("plotly.js v") >= 1 and len(text) > 3_000_000
    assert not re.search(r"<script[^>]+src=", text)
    # one div per figure: 2 convergence + scaling + breakdown + volume + time to accuracy + 2 Pareto
    assert text.count('class="plotly-graph-div"') == 8
    for heading in ("Convergence", "Scaling efficiency", "Time per iteration", "Communication volume",
                    "Time to accuracy", "Accuracy against cost (Pareto)", "Paper: scaling efficiency at 32 workers"):
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


def test_report_of_a_study_with_seeds_sources_and_two_links(tmp_path: Path) -> None:
    """Seeds come from config.json, sources from the summary; the efficiency has error bars,
    the paper's markers sit in the 1 GbE panel only, P has its own shade per method, and the
    runs table stays narrow with short ids (full ids as tooltips and in the detail view)."""
    from gtopk_lab.plotting.report_figures import efficiency_figure, paper_applies, point_convergence_figure
    from gtopk_lab.plotting.report_tables import (efficiency_pivot, run_details, runs_table, short_run_ids,
                                                  study_tables, with_points)

    write_study_results(tmp_path / "res")
    summaries, metrics = load_runs(tmp_path / "res")
    assert "seed" not in summaries.columns  # load_runs has none: with_points reads config.json
    points = with_points(summaries)
    assert set(points.seed) == {0, 1} and set(points.source) == {"real", "simulated"}
    assert set(points.link) == {"1GbE", "10GbE"}
    table, predicted, check = study_tables(points)
    assert len(table) == 2 * (3 * 4 + 1) and set(table.n) == {2}  # per link: 3 methods x 4 P + the simulated baseline
    assert (table[table.workers > 1].efficiency_std > 0).all()
    # 1 GbE: the sparse methods keep more efficiency at P = 8 than dense (the synthetic law)
    at8 = table[(table.workers == 8) & (table.link == "1GbE")].set_index("method").efficiency_mean
    assert at8["gtopk"] > at8["topk"] > at8["dense"]
    assert {"predicted", "error", "trusted"} <= set(check.columns) and check.predicted.notna().all()

    fig = efficiency_figure(table, predicted)
    measured = [t for t in fig.data if t.mode == "lines+markers"]
    assert measured and all(t.error_y.visible for t in measured)
    # the bars are the 95% Student-t interval of the two seeds (scipy's, computed here)
    from scipy import stats as scipy_stats
    gtopk8 = table[(table.method == "gtopk") & (table.workers == 8) & (table.link == "1GbE")].iloc[0]
    per_seed = point_efficiency_of(points, "gtopk", 8, "1GbE")
    low, high = scipy_stats.t.interval(0.95, 1, loc=per_seed.mean(), scale=per_seed.std(ddof=1) / 2 ** 0.5)
    assert gtopk8.efficiency_ci_low == pytest.approx(low) and gtopk8.efficiency_ci_high == pytest.approx(high)
    bar = next(t for t in measured if t.name.startswith("gtopk") and t.xaxis == "x" and 8 in list(t.x))
    at = list(bar.x).index(8)
    assert bar.error_y.array[at] == pytest.approx(100 * (high - gtopk8.efficiency_mean))
    assert "[" in efficiency_pivot(table)["P=8"].iloc[-1]  # mean [low, high] (n=2)
    paper = [t for t in fig.data if t.name and t.name.startswith("paper") and t.x[0] is not None]
    assert paper and {t.xaxis for t in paper} == {"x"}  # the first panel is the slowest link: 1GbE
    assert fig.layout.annotations[0].text == "1GbE"
    fast = table[table.link == "10GbE"]
    assert not paper_applies(fast)
    assert not [t for t in efficiency_figure(fast, predicted).data if t.name and t.name.startswith("paper")]

    conv = point_convergence_figure(metrics, points[points.link == "1GbE"])
    dense = {t.name: t.line.color for t in conv.data if t.name and t.name.startswith("dense P=") and t.showlegend is not False}
    assert len(dense) == 5 and len({c for c in dense.values()}) == 4  # P = 1, 2, 4, 8 (real + sim P=1 share)

    runs = runs_table(points)
    assert len(runs.columns) <= 13 and "run id" not in runs.columns and "model" not in runs.columns
    assert runs["run"].is_unique and len(runs) == len(points)
    details = run_details(points)
    assert "RuntimeError: boom" in set(details.error) and details["run id"].is_unique
    assert short_run_ids(["20261201-095024-dense-p1-ee662de2-321d", "20261201-095024-dense-p1-ee662de2-4546"]) \
        == {"20261201-095024-dense-p1-ee662de2-321d": "321d", "20261201-095024-dense-p1-ee662de2-4546": "4546"}
    pivot = efficiency_pivot(table)
    assert list(pivot.columns[:4]) == ["link", "source", "method", "density"]
    assert pivot.link.iloc[0] == "1GbE" and "(n=2)" in pivot["P=8"].iloc[-1]

    text = write_report(tmp_path / "res", tmp_path / "r.html").read_text(encoding="utf-8")
    assert "Runs (52 completed of 53)" in text
    assert "95% Student-t confidence interval of the mean over seeds (n up to 2)" in text
    assert "every run: ρ 0.01 (sparse runs), model cnn, dataset mnist1d" in text
    assert "title='2026-1GbE-gtopk-p4-broken'" in text and "<span class='bad'>failed</span>" in text
    assert "Model check" in text and "Convergence vs iteration, 1GbE" in text
    assert text.index("id='scaling'") < text.index("id='convergence'") < text.index("id='runs'")


def point_efficiency_of(points, method: str, workers: int, link: str):
    """The per-seed efficiencies of one point: its runs' virtual throughput over the dense
    P = 1 run of the same seed, link and source (the oracle of the interval test)."""
    done = points[points.status == "completed"]
    mine = done[(done.method == method) & (done.workers == workers) & (done.link == link)]
    values = []
    for _, run in mine.iterrows():
        base = done[(done.method == "dense") & (done.workers == 1) & (done.link == link)
                    & (done.seed == run.seed) & (done.source == run.source)].iloc[0]
        values.append(run.samples_per_s_virtual / (workers * base.samples_per_s_virtual))
    import numpy as np
    return np.array(values)


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_report_in_chromium_offline(tmp_path: Path) -> None:
    """The report of a study in Chromium with every request aborted: each figure draws SVG
    traces, no horizontal scroll at 1280 px, no script error; screenshot in test-artifacts/."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install chromium; .ci/run does this)")
    sync_api = pytest.importorskip("playwright.sync_api")
    write_study_results(tmp_path / "res")
    path = write_report(tmp_path / "res", tmp_path / "report.html")
    artifacts = Path(__file__).resolve().parents[1] / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    aborted: list[str] = []
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:")
                       else (aborted.append(r.request.url), r.abort()))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri(), wait_until="load", timeout=60_000)
            page.wait_for_timeout(1000)
            traces = page.evaluate("""() => Array.from(document.querySelectorAll('.plotly-graph-div'))
                .map(div => div.querySelectorAll('.main-svg .trace').length)""")
            width = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
            # two seeds: the 95% interval drawn as error bars (efficiency) and bands (convergence)
            drawn = page.evaluate("""() => ({bars: document.querySelectorAll('.errorbar path.yerror').length,
                bands: document.querySelectorAll('.js-fill').length})""")
            page.screenshot(path=str(artifacts / "report.png"), full_page=True)
        finally:
            browser.close()
    assert not aborted and not errors, (aborted, errors)  # self-contained: nothing to fetch
    assert len(traces) == 11 and all(n > 0 for n in traces), traces
    assert width[0] <= width[1], f"horizontal scroll: {width}"
    assert drawn["bars"] > 0 and drawn["bands"] > 0, drawn


@pytest.mark.timeout(180)
def test_cli_report_writes_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--figures DIR``: one file per figure of the report (as many as the HTML has divs),
    PNG by magic bytes, SVG by its root element; a bad target is one line, exit 2."""
    import shutil

    _write_results(tmp_path / "res")
    if shutil.which("chromium") is None and not Path("/usr/bin/chromium").exists():
        pytest.skip("no chromium (apt-get install chromium)")
    pytest.importorskip("kaleido")
    assert main(["report", str(tmp_path / "res"), "-o", str(tmp_path / "r.html"),
                 "--figures", str(tmp_path / "figs")]) == 0
    divs = (tmp_path / "r.html").read_text(encoding="utf-8").count('class="plotly-graph-div"')
    pngs = sorted((tmp_path / "figs").glob("*.png"))
    assert len(pngs) == divs == 8
    assert {p.stem for p in pngs} >= {"scaling_efficiency", "time_to_accuracy", "pareto_bytes", "pareto_time"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert main(["report", str(tmp_path / "res"), "-o", str(tmp_path / "r2.html"), "--figures",
                 str(tmp_path / "svg"), "--figure-format", "svg"]) == 0
    svg = (tmp_path / "svg" / "pareto_bytes.svg").read_text(encoding="utf-8")
    assert svg.startswith("<svg") and 'xmlns="http://www.w3.org/2000/svg"' in svg
    capsys.readouterr()
    assert main(["report", str(tmp_path / "res"), "--target-accuracy", "90"]) == 2
    assert "--target-accuracy=90.0 is invalid" in capsys.readouterr().err


def test_model_line_charges_the_selection_an_iteration_waits_for() -> None:
    """CLT-k's rank 0 selects one iteration in P, so its summary's mean selection is a P-th
    of what each iteration waits for (the leader's). The model line charges the selecting
    iterations' mean; a summary written before that field keeps a sparse method's mean."""
    import pandas as pd

    c, s = 0.010, 0.002

    def summary(method: str, workers: int, density: float, breakdown: dict) -> dict:
        return {"run_id": f"{method}-{workers}", "method": method, "workers": workers, "density": density,
                "numel": 100_000, "bandwidth_bps": 1e9, "latency_s": 5e-4, "status": "completed",
                "algorithm": None, "time_breakdown_s": {"compute": c, "update": 0.0, **breakdown}}

    runs = pd.DataFrame([
        summary("dense", 1, 1.0, {"selection": 0.0}),
        summary("clt-k", 4, 0.01, {"selection": s / 4, "selection_when_selected": s}),
        summary("topk", 4, 0.01, {"selection": s}),  # an older summary: no selection_when_selected
    ])
    predicted = predicted_scaling_table(runs, workers=[4]).set_index("method").scaling_efficiency
    for method in ("clt-k", "topk"):
        comm_s = predict_scaling(100_000, 0.01, c, NetworkModel(latency_s=5e-4, bandwidth_bps=1e9), [4],
                                 methods=[(method, method, None)])[0]["comm_s"]
        assert predicted[method] == pytest.approx(c / (c + s + comm_s), rel=1e-9), method


def test_report_of_a_powersgd_run_draws_its_volume_formula_and_survives_an_older_run(tmp_path: Path) -> None:
    """The communication-volume figure priced every method's bytes by its formula, and
    PowerSGD's needs the parameter shapes: a folder holding a PowerSGD run made the report
    raise. Its summary's comm_formula draws the line now; a run without one (written before
    the field) keeps its measured markers and no line."""
    from gtopk_lab.plotting.figures_scaling import comm_volume_figure
    from gtopk_lab.training.simulator import simulate

    runs = []
    for method in ("dense", "powersgd"):
        config = RunConfig(method=method, workers=2, model="mlp", dataset="synthetic", train_samples=64,
                           test_samples=16, batch_size=16, max_iterations=2, run_id=method)
        result = simulate(config)
        write_run(tmp_path, config, rows_to_frame(result.rows), run_summary(config, result.summary, status="completed"))
        runs.append(result.summary)
    assert "powersgd (formula)" in write_report(tmp_path, tmp_path / "r.html").read_text()
    import pandas as pd

    older = pd.DataFrame([{**s, "comm_formula": None} for s in runs])
    names = [t.name for t in comm_volume_figure(older).data]
    assert "powersgd (measured)" in names and "powersgd (formula)" not in names and "dense (formula)" in names
