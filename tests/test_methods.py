"""The method registry: validation, plugins on the client and on every rank, and test-only
methods of every shape (tests/plugins/lab_test_methods.py) through the one training step on
real gloo ranks, in the simulator, as a DDP hook and from the CLI on a Dask cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.methods import Method, get_method, register_method, unregister_method
from gtopk_lab.methods.programs import program_collective

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def test_methods(lab_test_methods):
    """The test plugin for every test here and its child processes (conftest.py)."""
    yield


def _config(method: str, workers: int = 3, **kw) -> RunConfig:
    base = dict(method=method, workers=workers, model="mlp", dataset="mnist1d", train_samples=240,
                test_samples=50, batch_size=8, epochs=1, max_iterations=8, density=0.05, lr=0.05,
                momentum=0.0, bandwidth="1GbE", sink_every=4, extra={"return_weights": True})
    base.update(kw)
    return RunConfig(**base)


# --------------------------------------------------------------------------- validation
def _never(rank, world, contribution, call):
    yield from ()
    return contribution.values, contribution.indices


@pytest.mark.parametrize("kwargs, field", [
    (dict(selector=None, collective="gtopk"), "selector=None"),
    (dict(selector="topk", collective="allreduce"), "selector='topk'"),
    (dict(selector="gaussiank", collective=program_collective("needs-k", _never, needs_exact_k=True)),
     "selector='gaussiank'"),
    (dict(selector="topk", collective="gtopk", requires_lossless=True), "collective='gtopk'"),
    (dict(selector="topk", collective="no-such"), "collective='no-such'"),
    (dict(selector="no-such", collective="gtopk"), "selector='no-such'"),
    (dict(selector="topk", collective="gtopk", algorithm="ring"), "algorithm='ring'"),
    (dict(selector="topk", collective="gtopk", sync_every=0), "sync_every=0"),
    (dict(selector="topk", collective="gtopk", memory="momentum"), "memory='momentum'"),
])
def test_register_method_names_the_field_that_does_not_fit(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(")", r"\)")):
        register_method(Method(name="broken", **kwargs))
    assert "broken" not in __import__("gtopk_lab.methods").methods.available_methods()


def test_register_method_refuses_a_taken_name_and_registers_a_callable_selector() -> None:
    with pytest.raises(ValueError, match="name='gtopk'"):
        register_method(Method(name="gtopk", selector="topk", collective="gtopk"))

    def my_topk(x: torch.Tensor, k: int):
        idx = torch.topk(x.abs(), k).indices
        return x[idx], idx.to(torch.int32)
    my_topk.exact_k = True
    try:
        entry = register_method(Method(name="my-topk", selector=my_topk, collective="gtopk"))
        assert entry.exact_k and entry.comm.name == "gtopk"
        assert RunConfig(method="my-topk").method == "my-topk"
    finally:
        unregister_method("my-topk")


# --------------------------------------------------------------------------- the shapes
SHAPES = ["test-ring", "test-cltk", "test-layerwise", "test-ef21", "test-diloco"]


@pytest.fixture(scope="module")
def real_shapes(test_methods: None) -> dict[str, list]:
    """Every test-only method on one 3-rank gloo group (one process start for the five runs)."""
    from gtopk_lab.comm.launch import run_gloo
    from gtopk_lab.training.loop import gloo_runs_entry

    per_rank = run_gloo(gloo_runs_entry, 3, [_config(m).to_dict() for m in SHAPES], timeout_s=300)
    return {m: [per_rank[r][i] for r in range(3)] for i, m in enumerate(SHAPES)}


@pytest.mark.slow
@pytest.mark.timeout(360)
@pytest.mark.parametrize("method", SHAPES)
def test_test_method_runs_on_real_gloo_ranks_equal_to_the_simulator(method: str, real_shapes: dict) -> None:
    from gtopk_lab.training.simulator import simulate

    config = _config(method)
    real = real_shapes[method]
    sim = simulate(config)
    for r in real[1:]:
        assert torch.equal(r.final_weights, real[0].final_weights)
    exact = get_method(method).comm.name != "allreduce"  # gloo's dense sum order is its own
    if exact:
        assert torch.equal(sim.final_weights, real[0].final_weights)
    else:
        torch.testing.assert_close(sim.final_weights, real[0].final_weights, rtol=1e-5, atol=1e-6)
    sent = sorted((row["rank"], row["iteration"], row["bytes_sent"]) for r in real for row in r.rows
                  if row["kind"] == "iter")
    assert sent == sorted((row["rank"], row["iteration"], row["bytes_sent"]) for row in sim.rows
                          if row["kind"] == "iter")


@pytest.mark.timeout(60)
def test_ring_program_equals_the_topk_allgather_and_diloco_h1_equals_dense() -> None:
    """Independent oracles: a ring gather of the top-k selections is Top-k S-SGD; DiLoCo with
    H = 1, inner SGD and an outer SGD step of lr 1 is dense data-parallel SGD."""
    from gtopk_lab.training.simulator import simulate

    ring = simulate(_config("test-ring")).final_weights
    topk = simulate(_config("topk")).final_weights
    torch.testing.assert_close(ring, topk, rtol=1e-6, atol=1e-7)
    diloco = simulate(_config("test-diloco-h1")).final_weights
    dense = simulate(_config("dense")).final_weights
    torch.testing.assert_close(diloco, dense, rtol=1e-5, atol=1e-6)
    h2 = simulate(_config("test-diloco"))
    assert [r["bytes_sent"] > 0 for r in h2.rows if r["kind"] == "iter" and r["rank"] == 0] == \
        [i % 2 == 1 for i in range(8)]  # a sync every second iteration, none in between


@pytest.mark.timeout(60)
def test_ef21_memory_keeps_the_mean_of_the_estimates() -> None:
    """EF21's invariant through the step: after every round the aggregate each rank applies is
    the sum of all ranks' estimates g_i (so G / P is their mean)."""
    from gtopk_lab.training.step import RankStep, communicate_simulated

    method = get_method("test-ef21")
    steps = [RankStep(method, 500, torch.device("cpu"), rank=r) for r in range(4)]
    gen = torch.Generator().manual_seed(3)
    for it in range(6):
        grads = [torch.randn(500, generator=gen) for _ in steps]
        contributions = [s.prepare(g, 20) for s, g in zip(steps, grads)]
        results = communicate_simulated(method, contributions, steps[0].call(20, it))
        for s, c, r in zip(steps, contributions, results):
            s.finish(c, r)
        applied = [s.aggregate(r, torch.device("cpu")) for s, r in zip(steps, results)]
        estimates = sum(s.memory.estimate for s in steps)
        for a in applied:
            torch.testing.assert_close(a, estimates, rtol=1e-5, atol=1e-5)


def _hook_job(rank: int, world: int) -> dict:
    from test_ddp_hook import _train_ddp

    from gtopk_lab.integrations.ddp_hook import SparseHookState

    return {m: _train_ddp(rank, SparseHookState(density=0.05, method=m, warmup_iterations=0))[0]
            for m in ("test-ring", "topk")}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_user_method_as_a_ddp_hook_equals_the_topk_hook() -> None:
    from gtopk_lab.comm.launch import run_gloo

    out = run_gloo(_hook_job, 2, timeout_s=120)
    for rank in out:
        torch.testing.assert_close(rank["test-ring"], rank["topk"], rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- plugins, CLI, Dask
def _cli(*args: str, env: dict | None = None, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gtopk_lab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)


@pytest.mark.timeout(120)
def test_plugin_methods_are_listed_and_a_broken_plugin_is_one_line() -> None:
    listed = _cli("methods")
    assert listed.returncode == 0 and "test-ring" in listed.stdout and "test-diloco" in listed.stdout
    for builtin in ("clt-k", "ef21", "ef21-sgdm", "diloco", "sparseloco", "sparseloco-gtopk"):
        assert f"\n{builtin} " in listed.stdout  # the post-2019 methods, registered like plugins
    assert "test-ring" in _cli("run", "--help", env={"COLUMNS": "1000"}).stdout
    bad = _cli("methods", env={"GTOPK_LAB_METHODS": "no_such_plugin_module"})
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "no_such_plugin_module" in bad.stderr and "Traceback" not in bad.stderr
    unknown = _cli("run", "--method", "nope", "--simulate", "--workers", "2")
    assert unknown.returncode == 2 and "test-ring" in unknown.stderr and "gtopk" in unknown.stderr


def _extending_example(folder: Path) -> Path:
    """docs/extending.md's worked example, written to ``folder/my_methods.py`` as a user would."""
    text = (ROOT / "docs" / "extending.md").read_text()
    blocks = [b.split("\n", 1)[1] for b in text.split("```python")[1:]]
    code = next(b.split("```", 1)[0] for b in blocks if b.startswith("# my_methods.py"))
    path = folder / "my_methods.py"
    path.write_text(code)
    return path


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_docs_worked_example_runs_on_dask_launched_ranks_and_simulated(tmp_path: Path) -> None:
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    _extending_example(plugin_dir)
    env = {"GTOPK_LAB_METHODS": "my_methods",
           "PYTHONPATH": os.pathsep.join(p for p in (str(plugin_dir), os.environ.get("PYTHONPATH")) if p)}
    listed = _cli("methods", env=env)
    assert listed.returncode == 0 and "ring-topk" in listed.stdout, listed.stderr
    flags = ["--method", "ring-topk", "--workers", "2", "--model", "mlp", "--dataset", "mnist1d",
             "--train-samples", "160", "--test-samples", "50", "--density", "0.05",
             "--max-iterations", "6", "--epochs", "1", "--out", str(tmp_path / "runs")]
    real = _cli("run", *flags, "--run-id", "ring-real", env=env, timeout=200)
    assert real.returncode == 0, real.stderr[-2000:]
    sim = _cli("run", *flags, "--run-id", "ring-sim", "--simulate", env=env, timeout=200)
    assert sim.returncode == 0, sim.stderr[-2000:]
    import json

    summaries = [json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())
                 for run_id in ("ring-real", "ring-sim")]
    for summary in summaries:
        assert summary["status"] == "completed" and summary["method"] == "ring-topk"
    # the ring sends (P-1) k pairs of 8 bytes plus headers on both paths alike
    assert summaries[0]["bytes_sent_per_rank_per_iter"] == summaries[1]["bytes_sent_per_rank_per_iter"] > 0
    assert summaries[0]["final_train_loss"] == pytest.approx(summaries[1]["final_train_loss"], rel=1e-5)
