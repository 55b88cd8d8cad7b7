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
    (["study", "--methods", ""], "--methods='' is invalid"),
    (["study", "--workers", "0,2"], "workers=0 is invalid"),
    (["study", "--methods", "dense,nope"], "method='nope' is invalid"),
    (["study", "--seeds", "0"], "--seeds=0 is invalid"),
    (["study", "--density", "0.01,2"], "density=2.0 is invalid"),
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
    assert main(["runs", out]) == 0  # the folder as `report` takes it
    assert summary["run_id"] in capsys.readouterr().out
    assert main(["runs", out, "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"gtopk-lab: error: results_dir={out!r} and --out={str(tmp_path)!r} "
                                               "are two folders: give one")


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
    first = sorted(n for n in os.listdir(out) if not n.startswith("."))  # .points: study locks
    assert len(first) == 4
    assert main([*argv, "--json"]) == 0  # resumable: nothing is run again
    table = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(n for n in os.listdir(out) if not n.startswith(".")) == first
    assert "baseline" in text and "dense P=1" in text  # column and note under the table
    # every method is divided by the dense P=1 run (the paper's definition)
    assert {r["baseline"] for r in table} == {"dense P=1"}
    p1 = {r["method"]: r for r in table if r["workers"] == 1}
    assert p1["dense"]["efficiency_virtual"] == pytest.approx(1.0)
    assert p1["gtopk"]["efficiency_virtual"] == pytest.approx(
        p1["gtopk"]["samples_per_s_virtual"] / p1["dense"]["samples_per_s_virtual"])
    assert all(0 < r["efficiency_virtual"] for r in table)


def test_sweep_grid_always_holds_the_dense_p1_baseline():
    from gtopk_lab.cli.main import build_parser
    from gtopk_lab.cli.sweep import build_grid

    def grid(*argv):
        args = build_parser().parse_args(["sweep", "--simulate", *argv])
        return [(c.method, c.workers, c.bandwidth) for c in build_grid(args)]

    assert grid("--methods", "dense,gtopk", "--workers", "2,4", "--bandwidth", "1GbE,10GbE") == [
        ("dense", 1, "1GbE"), ("dense", 2, "1GbE"), ("dense", 4, "1GbE"),
        ("dense", 1, "10GbE"), ("dense", 2, "10GbE"), ("dense", 4, "10GbE"),
        ("gtopk", 2, "1GbE"), ("gtopk", 4, "1GbE"), ("gtopk", 2, "10GbE"), ("gtopk", 4, "10GbE")]
    from gtopk_lab.network import DEFAULT_NETWORK

    # the defaults (also the demo's): dense at P=1, on the one default link (1GbE since issue 26)
    assert ("dense", 1, DEFAULT_NETWORK) in grid()
    assert grid("--methods", "gtopk", "--workers", "2") == [("gtopk", 2, DEFAULT_NETWORK)]
    # a pattern list multiplies gTop-k's runs only (Top-k has none, Ok-Topk fixes its own)
    args = build_parser().parse_args(["sweep", "--simulate", "--methods", "gtopk,topk,oktopk", "--workers", "2",
                                      "--algorithms", "butterfly,tree"])
    assert sorted((c.method, c.algorithm) for c in build_grid(args) if c.workers == 2) == [
        ("gtopk", "butterfly"), ("gtopk", "tree"), ("oktopk", "butterfly"), ("topk", "butterfly")]


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


def test_cuda_on_the_local_cluster_takes_one_gpu_per_rank(monkeypatch) -> None:
    import torch

    from gtopk_lab.cli.errors import UsageError
    from gtopk_lab.cli.run import local_gpu_resources

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match="no CUDA device"):
        local_gpu_resources(1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert local_gpu_resources(2) == {"GPU": 1.0}
    with pytest.raises(UsageError, match="workers=3 is invalid.*2 GPU"):
        local_gpu_resources(3)


def test_select_device_spreads_ranks_over_visible_gpus(monkeypatch) -> None:
    from types import SimpleNamespace

    import torch

    from gtopk_lab.worker.rank_task import select_device

    gpu_worker = SimpleNamespace(state=SimpleNamespace(total_resources={"GPU": 1}), address="w")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert select_device(gpu_worker, "auto", 3) == (torch.device("cuda", 1), "nccl")
    assert select_device(gpu_worker, "cpu", 3) == (torch.device("cpu"), "gloo")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # dask-cuda: one visible device
    assert select_device(gpu_worker, "cuda", 3) == (torch.device("cuda", 0), "nccl")
