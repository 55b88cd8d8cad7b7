"""train_rank: rows schema, sink batching, seeding, schedules, torchrun-style real ranks."""

from __future__ import annotations

import math

import pytest
import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.training.loop import gloo_rank_entry, train_rank
from gtopk_lab.training.optim import density_at, lr_at, recipe

ITER_KEYS = {"kind", "rank", "iteration", "epoch", "method", "workers", "density", "k", "train_loss",
             "lr", "compute_s", "selection_s", "selected", "comm_s", "update_s", "clock_s", "comm_span_s", "comm_model_s", "comm_charge_s", "bytes_sent",
             "bytes_recv", "comm_rounds", "comm_wire_bytes", "wall_time_s", "virtual_time_s"}
EPOCH_KEYS = {"kind", "rank", "iteration", "epoch", "method", "workers", "density", "k", "train_loss",
              "test_loss", "test_accuracy", "test_perplexity", "test_bits_per_token", "wall_time_s",
              "virtual_time_s"}
SUMMARY_KEYS = {"run_id", "method", "workers", "density", "k", "numel", "bandwidth_bps", "latency_s",
                "epochs", "iterations", "final_train_loss", "final_test_accuracy", "wall_time_s",
                "virtual_time_s", "samples_per_s_wall", "samples_per_s_virtual",
                "bytes_sent_per_rank_per_iter", "time_breakdown_s", "status", "error"}


def _config(**kw) -> RunConfig:
    base = dict(method="gtopk", workers=1, model="digits_cnn", dataset="digits", train_samples=256,
                test_samples=64, batch_size=16, epochs=2, density=0.01, lr=0.05, sink_every=4,
                bandwidth="1GbE")
    base.update(kw)
    return RunConfig(**base)


@pytest.mark.timeout(60)
def test_rows_summary_and_sink_without_process_group() -> None:
    batches: list[list[dict]] = []
    result = train_rank(_config(), sink=batches.append)
    iters = [r for r in result.rows if r["kind"] == "iter"]
    epochs = [r for r in result.rows if r["kind"] == "epoch"]
    assert len(iters) == 32 and len(epochs) == 2
    assert all(set(r) == ITER_KEYS for r in iters) and all(set(r) == EPOCH_KEYS for r in epochs)
    assert [r["iteration"] for r in iters] == list(range(32))
    assert [b for batch in batches for b in batch] == result.rows  # every row reached the sink once
    assert all(len(b) <= 5 for b in batches)
    assert SUMMARY_KEYS <= set(result.summary)
    s = result.summary
    assert s["status"] == "completed" and s["iterations"] == 32 and s["k"] == int(0.01 * s["numel"])
    assert set(s["time_breakdown_s"]) >= {"compute", "selection", "communication", "update"}
    assert 0 <= s["final_test_accuracy"] <= 1 and math.isnan(epochs[-1]["test_perplexity"])
    assert all(b["virtual_time_s"] >= a["virtual_time_s"] for a, b in zip(iters, iters[1:]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["train_rank", "simulator"])
def test_wall_time_counts_training_not_dataset_setup(monkeypatch, where) -> None:
    """A fresh worker builds the dataset first: that is setup_wall_s, not training time."""
    import time

    from gtopk_lab.training import loop, simulator

    real = loop.run_dataset

    def slow_dataset(config):
        time.sleep(1.0)
        return real(config)

    monkeypatch.setattr(loop, "run_dataset", slow_dataset)
    monkeypatch.setattr(simulator, "run_dataset", slow_dataset)
    cfg = _config(epochs=1, max_iterations=4)
    result = train_rank(cfg) if where == "train_rank" else simulator.simulate(cfg)
    first = next(r for r in result.rows if r["kind"] == "iter")
    assert result.summary["setup_wall_s"] >= 1.0
    assert first["wall_time_s"] < 1.0 and result.summary["wall_time_s"] < result.summary["setup_wall_s"] + 30


@pytest.mark.timeout(60)
def test_same_config_same_metrics_and_training_learns() -> None:
    cfg = _config(method="topk", density=0.05, epochs=3, residual_rule="paper", momentum_correction=True)
    a, b = train_rank(cfg), train_rank(cfg)
    key = ("train_loss", "test_accuracy", "bytes_sent")
    assert [[r.get(k) for k in key] for r in a.rows] == [[r.get(k) for k in key] for r in b.rows]
    dense = train_rank(_config(method="dense", epochs=3))
    assert dense.summary["final_test_accuracy"] > 0.5  # 10 classes: chance is 0.1


@pytest.mark.timeout(60)
def test_max_iterations_lstm_synthetic_perplexity_and_clip() -> None:
    cfg = _config(method="gaussiank", model="lstm", dataset="synthetic", train_samples=64, test_samples=8,
                  batch_size=8, max_iterations=3, grad_clip=0.25, lr=1.0, momentum=0.0,
                  extra={"model_kwargs": {"vocab_size": 30, "embedding_size": 8, "hidden_size": 8}})
    result = train_rank(cfg)
    assert result.summary["iterations"] == 3
    last = [r for r in result.rows if r["kind"] == "epoch"][-1]
    assert last["test_perplexity"] == pytest.approx(math.exp(last["test_loss"]))


def test_schedules_and_recipes() -> None:
    cfg = RunConfig(workers=4, lr=0.1, lr_warmup_epochs=2.0, lr_milestones=(5, 8), lr_decay=0.1,
                    density=0.001, density_warmup=(0.004, 1))
    assert lr_at(cfg, 0.0) == pytest.approx(0.025) and lr_at(cfg, 1.0) == pytest.approx(0.0625)
    assert lr_at(cfg, 3.0) == pytest.approx(0.1) and lr_at(cfg, 8.0) == pytest.approx(0.001)
    assert density_at(cfg, 0.5) == 0.004 and density_at(cfg, 1.0) == 0.001
    r = recipe("lstm-ptb", workers=4)
    assert (r.lr, r.batch_size, r.momentum, r.grad_clip) == (1.0, 20, 0.0, 0.25)
    with pytest.raises(ValueError, match="recipe='nope'"):
        recipe("nope")


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="workers=4 needs an initialised"):
        train_rank(_config(workers=4))
    with pytest.raises(ValueError, match="does not fit dataset"):
        train_rank(_config(model="cnn"))
    with pytest.raises(TypeError, match="expected RunConfig"):
        train_rank({"method": "dense"})  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_real_gloo_ranks_agree_and_report_comm() -> None:
    cfg = _config(method="gtopk", workers=2, epochs=1, extra={"return_weights": True})
    results = run_gloo(gloo_rank_entry, 2, cfg.to_dict(), timeout_s=120)
    torch.testing.assert_close(results[0].final_weights, results[1].final_weights, rtol=0, atol=0)
    iters = [r for r in results[0].rows if r["kind"] == "iter"]
    assert all(r["bytes_sent"] > 0 and r["comm_model_s"] > 0 for r in iters)
    assert results[0].summary["workers"] == 2
    assert not math.isnan([r for r in results[0].rows if r["kind"] == "epoch"][-1]["test_accuracy"])
    assert math.isnan([r for r in results[1].rows if r["kind"] == "epoch"][-1]["test_accuracy"])
