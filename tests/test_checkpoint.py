"""Epoch checkpoints and resume: real gloo ranks, the Lab path and ``gtopk-lab run --resume``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.training import checkpoint as ckpt
from gtopk_lab.training.loop import gloo_checkpoint_entry, train_rank


def _config(**kw) -> RunConfig:
    base = dict(method="gtopk", workers=2, model="mlp", dataset="synthetic", train_samples=256,
                test_samples=64, epochs=3, batch_size=32, density=0.05, momentum=0.9,
                momentum_correction=True, checkpoint=True, device="cpu", run_id="ck",
                extra={"return_weights": True})
    base.update(kw)
    return RunConfig(**base)


@pytest.mark.timeout(120)
def test_resume_after_epoch_reaches_the_uninterrupted_weights(tmp_path: Path) -> None:
    full = _config()
    uninterrupted = run_gloo(gloo_checkpoint_entry, 2, full.to_dict(), None, None, timeout_s=90)
    folder = str(tmp_path / "checkpoints")
    # "interrupted" after epoch 1 of 3: a run that only reaches epoch 1, checkpointing
    run_gloo(gloo_checkpoint_entry, 2, full.replace(epochs=1).to_dict(), folder, None, timeout_s=90)
    assert ckpt.read_latest(folder) == {"epoch": 1, "iteration": 4, "workers": 2}
    resumed = run_gloo(gloo_checkpoint_entry, 2, full.to_dict(), folder, folder, timeout_s=90)
    for a, b in zip(uninterrupted, resumed):
        assert torch.equal(a.final_weights, b.final_weights)
    # resumed rows start at the checkpoint's iteration; the checkpoint moved on to epoch 3
    assert min(r["iteration"] for r in resumed[0].rows if r["kind"] == "iter") == 4
    assert ckpt.read_latest(folder)["epoch"] == 3
    assert sorted(p.name for p in Path(folder).iterdir()) == [
        "epoch00003-rank00000.pt", "epoch00003-rank00000.rows.json", "epoch00003-rank00001.pt",
        "epoch00003-rank00001.rows.json", "latest.json"]


@pytest.mark.timeout(60)
def test_checkpoints_only_with_checkpoint_true_and_without_temp_files(tmp_path: Path) -> None:
    off = tmp_path / "off"
    train_rank(_config(workers=1, epochs=2, checkpoint=False), checkpoint_dir=str(off))
    assert not off.exists()
    on = tmp_path / "on"
    one = train_rank(_config(workers=1, epochs=2), checkpoint_dir=str(on))
    assert sorted(p.name for p in on.iterdir()) == ["epoch00002-rank00000.pt", "epoch00002-rank00000.rows.json",
                                                    "latest.json"]
    # the rows since the previous checkpoint (epoch 1's end): epoch 2's iterations and its epoch row
    saved_rows = ckpt.load_checkpoint_rows(on, ckpt.read_latest(on))
    ipe = min(r["iteration"] for r in one.rows if r["kind"] == "epoch")
    assert sorted((r["kind"], r["iteration"]) for r in saved_rows) == sorted(
        [("iter", i) for i in range(ipe, 2 * ipe)] + [("epoch", 2 * ipe)])
    saved = ckpt.load_rank_state(on, 2, 0)
    assert saved["iteration"] == 16 and saved["epoch"] == 2
    assert set(saved) >= {"model", "optimizer", "step", "rng_state"}
    # resuming a finished checkpoint trains nothing more and keeps the weights
    again = train_rank(_config(workers=1, epochs=2), checkpoint_dir=str(on), resume_from=str(on))
    assert torch.equal(one.final_weights, again.final_weights)
    assert not any(r["kind"] == "iter" for r in again.rows)
    # no checkpoint in the folder: resume_from starts from iteration 0
    fresh = train_rank(_config(workers=1, epochs=1), resume_from=str(tmp_path / "none"))
    assert min(r["iteration"] for r in fresh.rows) == 0


def test_atomic_write_keeps_the_old_file_when_the_write_fails(tmp_path: Path, monkeypatch) -> None:
    ckpt.write_latest(tmp_path, 1, 8, 2)

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.os, "replace", broken_replace)
    with pytest.raises(OSError):
        ckpt.write_latest(tmp_path, 2, 16, 2)
    assert ckpt.read_latest(tmp_path) == {"epoch": 1, "iteration": 8, "workers": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["latest.json"]


@pytest.mark.timeout(60)
def test_resume_refuses_a_checkpoint_of_another_world_size(tmp_path: Path) -> None:
    ckpt.write_latest(tmp_path, 1, 4, 2)
    with pytest.raises(ValueError, match="workers=2"):
        train_rank(_config(workers=1), resume_from=str(tmp_path))


def _fail_then_resume_via_cli(out: Path, config: RunConfig, rows: list[dict], capsys, *flags: str) -> None:
    """Store ``config`` (2 ranks, 3 epochs of 4 iterations) as failed after its epoch 1
    checkpoint, with ``rows`` but for rank 1's iterations 2 and 3 (as if a batch was still in
    flight when the scheduler died) and with a stray row past the checkpoint, then
    ``gtopk-lab run --resume`` it: it must complete with one continuous set of rows, the
    lost ones back as they were (from the rows the rank saved beside its checkpoint), the
    stray one dropped."""
    from gtopk_lab.cli import main
    from gtopk_lab.orchestration import results as store

    run_id = config.run_id
    lost = [r for r in rows if r["kind"] == "iter" and r["rank"] == 1 and r["iteration"] in (2, 3)]
    assert len(lost) == 2
    stray = {**next(r for r in rows if r["kind"] == "iter"), "iteration": 4, "train_loss": -1.0}
    stored = [r for r in rows if r not in lost] + [stray]
    store.write_run(out, config, store.rows_to_frame(stored),
                    store.run_summary(config, None, status="failed", error="scheduler unreachable"))
    rc = main(["run", "--resume", run_id, "--out", str(out), "--json", *flags])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    assert f"resuming {run_id} from epoch 1" in captured.err
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["iterations"] == 12
    metrics = store.RunStore(out, run_id).read_metrics()
    iters = metrics[metrics["kind"] == "iter"]
    for rank in (0, 1):
        assert sorted(iters[iters["rank"] == rank]["iteration"]) == list(range(12))
    assert (iters["train_loss"] >= 0).all()
    back = iters[(iters["rank"] == 1) & iters["iteration"].isin([2, 3])].sort_values("iteration")
    assert list(back["train_loss"]) == [r["train_loss"] for r in sorted(lost, key=lambda r: r["iteration"])]
    assert list(back["bytes_sent"]) == [r["bytes_sent"] for r in sorted(lost, key=lambda r: r["iteration"])]
    epochs = metrics[(metrics["kind"] == "epoch") & (metrics["rank"] == 0)]
    assert sorted(epochs["iteration"]) == [4, 8, 12]
    assert ckpt.read_latest(store.checkpoint_folder(out, run_id))["epoch"] == 3


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_cli_resume_continues_a_failed_dask_run_from_its_checkpoint(tmp_path: Path, capsys) -> None:
    from gtopk_lab.orchestration import results as store

    out = tmp_path / "res"
    config = _config(run_id="failed-run", extra={})
    folder = store.checkpoint_folder(out, config.run_id)
    # the "failed" run: epoch 1 of 3 checkpointed, a stray row of epoch 2 stored before the crash
    first = run_gloo(gloo_checkpoint_entry, 2, config.replace(epochs=1).to_dict(), folder, None,
                     timeout_s=90)
    _fail_then_resume_via_cli(out, config, [r for res in first for r in res.rows], capsys,
                              "--no-progress")


@pytest.mark.timeout(60)
def test_cli_resume_without_checkpoint_says_it_restarts(tmp_path: Path, capsys) -> None:
    from gtopk_lab.cli import main
    from gtopk_lab.orchestration import results as store

    out = tmp_path / "res"
    config = _config(run_id="no-ckpt", workers=2, epochs=1, extra={})
    store.write_run(out, config, store.rows_to_frame([]),
                    store.run_summary(config, None, status="failed", error="boom"))
    rc = main(["run", "--resume", "no-ckpt", "--out", str(out), "--simulate", "--json"])
    captured = capsys.readouterr()
    assert rc == 0
    assert "no checkpoint" in captured.err and "re-running from iteration 0" in captured.err
    metrics = store.RunStore(out, "no-ckpt").read_metrics()
    assert metrics[metrics["kind"] == "iter"]["iteration"].min() == 0


def _bn_config(**kw) -> RunConfig:
    """A model with BatchNorm, so that every virtual rank's own BN buffers must be saved."""
    return _config(model="resnet20", train_samples=64, test_samples=16, batch_size=16,
                   extra={"return_weights": True, "model_kwargs": {"depth": 8}}, **kw)


@pytest.mark.timeout(120)
def test_simulator_resume_after_epoch_reaches_the_uninterrupted_weights(tmp_path: Path) -> None:
    from gtopk_lab.training.simulator import simulate

    full = _bn_config()
    uninterrupted = simulate(full)
    folder = str(tmp_path / "checkpoints")
    simulate(full.replace(epochs=1), checkpoint_dir=folder)  # "interrupted" after epoch 1 of 3
    assert ckpt.read_latest(folder) == {"epoch": 1, "iteration": 2, "workers": 2}
    # each virtual rank's file holds its own BN statistics (they saw different shards)
    bn = [ckpt.load_rank_state(folder, 1, r)["model"]["bn1.running_mean"] for r in (0, 1)]
    assert not torch.equal(bn[0], bn[1])
    resumed = simulate(full, checkpoint_dir=folder, resume_from=folder)
    assert torch.equal(uninterrupted.final_weights, resumed.final_weights)
    assert min(r["iteration"] for r in resumed.rows if r["kind"] == "iter") == 2
    assert resumed.summary["virtual_time_s"] > 0
    assert sorted(p.name for p in Path(folder).iterdir()) == [
        "epoch00003-rank00000.pt", "epoch00003-rank00000.rows.json", "epoch00003-rank00001.pt",
        "epoch00003-rank00001.rows.json", "latest.json"]
    with pytest.raises(ValueError, match="resume_from=.*workers=2"):
        simulate(full.replace(workers=4), resume_from=folder)


@pytest.mark.timeout(120)
def test_simulator_checkpoint_resumes_as_a_real_gloo_run(tmp_path: Path) -> None:
    from gtopk_lab.training.simulator import simulate

    full = _config()
    real = run_gloo(gloo_checkpoint_entry, 2, full.to_dict(), None, None, timeout_s=90)
    folder = str(tmp_path / "checkpoints")
    simulate(full.replace(epochs=1), checkpoint_dir=folder)
    resumed = run_gloo(gloo_checkpoint_entry, 2, full.to_dict(), folder, folder, timeout_s=90)
    for r in resumed:  # the simulator equals a real run to float tolerance
        torch.testing.assert_close(r.final_weights, real[0].final_weights, rtol=1e-4, atol=1e-5)
        assert min(row["iteration"] for row in r.rows if row["kind"] == "iter") == 4


@pytest.mark.timeout(120)
def test_cli_resume_continues_a_failed_simulated_run_from_its_checkpoint(tmp_path: Path, capsys) -> None:
    from gtopk_lab.orchestration.simulated_run import simulate_run
    from gtopk_lab.orchestration import results as store

    out = tmp_path / "res"
    config = _config(run_id="failed-sim", extra={})
    simulate_run(config.replace(epochs=1), str(out))  # epoch 1 of 3 checkpointed
    rows = store.RunStore(out, "failed-sim").read_metrics().to_dict("records")
    _fail_then_resume_via_cli(out, config, rows, capsys, "--simulate")


@pytest.mark.timeout(60)
def test_failed_simulated_run_keeps_the_rows_it_produced(tmp_path: Path, monkeypatch) -> None:
    from gtopk_lab.orchestration.simulated_run import simulate_run
    from gtopk_lab.orchestration import results as store
    from gtopk_lab.training.step import RankStep

    calls = {"n": 0}
    real_finish = RankStep.finish

    def finish_then_fail(*args, **kwargs):  # the 7th rank-iteration (iteration 3, rank 0) fails
        calls["n"] += 1
        if calls["n"] == 7:
            raise RuntimeError("simulated crash")
        return real_finish(*args, **kwargs)

    monkeypatch.setattr(RankStep, "finish", finish_then_fail)
    summary = simulate_run(_config(run_id="crash", sink_every=1, extra={}), str(tmp_path))
    assert summary["status"] == "failed" and "simulated crash" in summary["error"]
    iters = store.RunStore(tmp_path, "crash").read_metrics()
    assert sorted(set(iters[iters["kind"] == "iter"]["iteration"])) == [0, 1, 2]


@pytest.mark.timeout(30)
def test_rows_saved_with_a_checkpoint_cover_every_batch_not_yet_sent() -> None:
    """RowBuffer.since_checkpoint: rows since the previous checkpoint, plus those still
    waiting for the sink then (sink_every = 3 over checkpoints every 2 iterations)."""
    from gtopk_lab.training.rows import RowBuffer

    sent: list[list[int]] = []
    buffer = RowBuffer(lambda rows: sent.append([r["iteration"] for r in rows]), every=3)
    saved = []
    for it in range(8):
        buffer.add({"kind": "iter", "rank": 0, "iteration": it})
        if it % 2 == 1:
            saved.append([r["iteration"] for r in buffer.since_checkpoint()])
    assert sent == [[0, 1, 2], [3, 4, 5]]
    # at each checkpoint: unsent rows stay in the next one's too
    assert saved == [[0, 1], [0, 1, 2, 3], [3, 4, 5], [6, 7]]
