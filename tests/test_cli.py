"""gtopk-lab run / sweep / runs / demo: bad input, simulated runs, an embedded-cluster run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gtopk_lab.cli import main

TINY = ["--max-iterations", "3", "--train-samples", "256", "--test-samples", "64", "--batch-size", "16",
        "--epochs", "1"]
GTOPK_LAB = str(Path(sys.executable).with_name("gtopk-lab"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, message", [
    (["run", "--method", "nope"], "method='nope' is invalid"),
    (["run", "--model", "nope"], "model='nope' is invalid"),
    (["run", "--density", "0"], "density=0.0 is invalid"),
    (["run", "--density", "1.5"], "density=1.5 is invalid"),
    (["run", "--workers", "0"], "workers=0 is invalid"),
    (["run", "--bandwidth", "fast"], "bandwidth='fast' is invalid"),
    (["run", "--dataset", "cifar10", "--model", "resnet20"], "data_dir=None is invalid"),
    (["run", "--data-dir", "/no/such/folder"], "data_dir='/no/such/folder' is invalid"),
    (["run", "--model", "mlp", "--dataset", "digits"], "does not fit dataset='digits'"),
    (["run", "--max-iterations", "many"], "--max-iterations"),
    (["run", "--scheduler", "udp://1.2.3.4:5"], "scheduler='udp://1.2.3.4:5' is invalid"),
    (["run", "--scheduler", "tls://127.0.0.1:1"], "needs --tls-ca-file"),
    (["run", "--tls-cert", "/no/cert.pem", "--scheduler", "tls://127.0.0.1:1"], "--tls-cert="),
    (["run", "--scheduler", "tcp://127.0.0.1:1", "--connect-timeout", "1"], "is unreachable"),
    (["run", "--resume", "no-such-run"], "--resume='no-such-run' is invalid"),
    (["sweep", "--methods", "dense,bogus", "--simulate"], "method='bogus' is invalid"),
    (["sweep", "--workers", "1,two", "--simulate"], "--workers='1,two' is invalid"),
    (["sweep", "--density", "0.01,2", "--simulate"], "density=2.0 is invalid"),
    (["runs"], "is invalid: no such folder"),
    (["demo", "--max-iterations", "0"], "--max-iterations=0 is invalid"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    rc = main([*argv, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("gtopk-lab: error:") and message in err[0], err
    assert not out.exists()


@pytest.mark.timeout(120)
def test_simulated_run_json_then_runs_lists_it(tmp_path, capsys):
    out = str(tmp_path / "res")
    rc = main(["run", "--simulate", "--method", "gtopk", "--workers", "8", "--density", "0.05",
               *TINY, "--out", out, "--json"])
    stdout = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    summary = json.loads(stdout[-1])
    assert summary["status"] == "completed" and summary["workers"] == 8 and summary["simulated"]
    assert (Path(out) / summary["run_id"] / "metrics.parquet").exists()
    assert main(["runs", "--out", out, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["run_id"] for r in listed] == [summary["run_id"]]
    assert main(["runs", "--out", out]) == 0
    assert summary["run_id"] in capsys.readouterr().out


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_simulated_sweep_prints_scaling_table_and_resumes(tmp_path, capsys):
    out = str(tmp_path / "sweep")
    argv = ["sweep", "--simulate", "--methods", "dense,gtopk", "--workers", "1,4", "--density", "0.05",
            "--bandwidth", "1Gbps", *TINY, "--out", out, "--no-progress"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "eff_virt" in text and "gtopk" in text and "dense" in text
    assert "4 run(s), 0 not completed" in text
    first = sorted(os.listdir(out))
    assert len(first) == 4
    assert main([*argv, "--json"]) == 0  # resumable: nothing is run again
    table = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(os.listdir(out)) == first
    p1 = [r for r in table if r["workers"] == 1]
    assert all(r["efficiency_virtual"] == pytest.approx(1.0) for r in p1)
    assert all(0 < r["efficiency_virtual"] for r in table)


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_run_on_embedded_cluster_via_entry_point(tmp_path):
    out = tmp_path / "res"
    proc = subprocess.run(
        [GTOPK_LAB, "run", "--method", "topk", "--workers", "2", "--density", "0.05", *TINY,
         "--out", str(out), "--json", "--no-progress"],
        capture_output=True, text=True, timeout=170, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and len(summary["dask_workers"]) == 2
    assert (out / summary["run_id"] / "summary.json").exists()
