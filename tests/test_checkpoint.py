"""Epoch checkpoints and resume: real gloo ranks, the Lab path and ``gtopk-lab run --resume``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.distributed_utils import run_gloo
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
        "epoch00003-rank00000.pt", "epoch00003-rank00001.pt", "latest.json"]


@pytest.mark.timeout(60)
def test_checkpoints_only_with_checkpoint_true_and_without_temp_files(tmp_path: Path) -> None:
    off = tmp_path / "off"
    train_rank(_config(workers=1, epochs=2, checkpoint=False), checkpoint_dir=str(off))
    assert not off.exists()
    on = tmp_path / "on"
    one = train_rank(_config(workers=1, epochs=2), checkpoint_dir=str(on))
    assert sorted(p.name for p in on.iterdir()) == ["epoch00002-rank00000.pt", "latest.json"]
    saved = ckpt.load_rank_state(on, 2, 0)
    assert saved["iteration"] == 16 and saved["epoch"] == 2
    assert set(saved) >= {"model", "optimizer", "error_feedback", "velocity", "rng_state"}
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
