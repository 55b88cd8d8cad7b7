"""Multi-stage density schedules, the references' LR warm-ups per recipe and the ``paper``
preset (issue 16 item 5). Oracles restate the reference code's rules (hclhkbu/gtopkssgd,
hclhkbu/GaussianK-SGD) independently of gtopk_lab.training.optim."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gtopk_lab.cli.main import main as cli_main
from gtopk_lab.config import RunConfig, k_for
from gtopk_lab.orchestration.run_files import config_hash
from gtopk_lab.training.optim import RECIPES, density_at, lr_at, recipe
from gtopk_lab.training.simulator import simulate


def _reference_density(dynamic: list[float], epoch: int) -> float:
    """GaussianK-SGD's get_current_density: entry ``train_epoch``, the last one after the list."""
    return dynamic[epoch] if epoch < len(dynamic) else dynamic[-1]


@pytest.mark.timeout(30)
def test_density_schedule_is_the_references_per_epoch_list() -> None:
    gaussiank = RunConfig(density_schedule=(0.015625, 0.004), density=0.001)
    seed_paper = RunConfig(density_schedule=(0.004,), density=0.01)  # gtopkssgd: [0.004, density]
    for progress in (0.0, 0.3, 0.999, 1.0, 1.5, 2.0, 2.7, 7.0, 140.9):
        epoch = math.floor(progress)
        assert density_at(gaussiank, progress) == _reference_density([0.015625, 0.004, 0.001], epoch)
        assert density_at(seed_paper, progress) == _reference_density([0.004, 0.01], epoch)
    # density_warmup (rho0, E) is the schedule (rho0,) * E
    warm, staged = RunConfig(density_warmup=(0.004, 3), density=0.01), RunConfig(density_schedule=[0.004] * 3,
                                                                                   density=0.01)
    assert staged.density_schedule == (0.004, 0.004, 0.004)
    assert all(density_at(warm, e / 4) == density_at(staged, e / 4) for e in range(24))
    for bad in ((), (0.1, 1.5), (0.0,), ("x",), (True,), 0.1):
        with pytest.raises(ValueError, match=r"^density_schedule=.* is invalid: expected a non-empty list"):
            RunConfig(density_schedule=bad)
    with pytest.raises(ValueError, match=r"^density_schedule=\(0\.1,\) is invalid with density_warmup"):
        RunConfig(density_schedule=(0.1,), density_warmup=(0.004, 1))
    assert RunConfig.from_dict(gaussiank.to_dict()) == gaussiank  # lists from JSON become tuples


@pytest.mark.timeout(60)
def test_density_schedule_reaches_the_rows_and_equals_the_warmup_form() -> None:
    base = dict(method="gtopk", workers=2, model="mlp", dataset="mnist1d", train_samples=320, test_samples=64,
                batch_size=40, epochs=3, density=0.05, lr=0.05, extra={"return_weights": True})
    run = simulate(RunConfig(**base, density_schedule=(0.5, 0.2)))
    numel, ipe = run.summary["numel"], run.summary["iterations_per_epoch"]
    assert ipe >= 2 and run.summary["iterations"] == 3 * ipe
    for row in run.rows:
        if row["kind"] == "iter":
            rho = _reference_density([0.5, 0.2, 0.05], row["iteration"] // ipe)
            assert (row["density"], row["k"]) == (rho, max(1, math.floor(rho * numel))), row["iteration"]
    warm = simulate(RunConfig(**base, density_warmup=(0.3, 2)))
    staged = simulate(RunConfig(**base, density_schedule=(0.3, 0.3)))
    assert torch.equal(warm.final_weights, staged.final_weights)


@pytest.mark.timeout(30)
def test_recipes_carry_the_references_lr_warmups() -> None:
    # gtopkssgd's _adjust_learning_rate_general: 10 epochs from lr / P, linear in the iteration;
    # its PTB schedule (_adjust_learning_rate_lstmptb) has no warm-up
    assert RECIPES["resnet20-cifar10"]["lr_warmup_epochs"] == RECIPES["vgg16-cifar10"]["lr_warmup_epochs"] == 10
    assert RECIPES["lstm-ptb"]["lr_warmup_epochs"] == 0
    cfg, ipe, p = recipe("resnet20-cifar10", workers=4), 390, 4
    for it in (0, 1, 195, 1000, 3899):
        reference = cfg.lr / p + (cfg.lr - cfg.lr / p) / (ipe * 10) * it
        assert lr_at(cfg, it / ipe) == pytest.approx(reference, rel=1e-12)
    assert lr_at(cfg, 10.0) == cfg.lr and lr_at(recipe("lstm-ptb", workers=4), 0.0) == 1.0


@pytest.mark.timeout(30)
def test_paper_preset_sets_the_seed_papers_gtopk_and_explicit_values_win() -> None:
    paper = RunConfig(preset="paper")
    assert (paper.method, paper.algorithm, paper.residual_rule, paper.density, paper.density_warmup) == (
        "gtopk", "tree", "paper", 0.001, (0.004, 1))
    assert (paper.epochs, paper.lr_warmup_epochs, paper.train_samples) == (120, 1.0, 4000)  # cnn-mnist1d
    resnet = RunConfig(preset="paper", model="resnet20", dataset="synthetic")
    assert (resnet.lr, resnet.lr_warmup_epochs, resnet.lr_milestones, resnet.weight_decay, resnet.dataset) == (
        0.1, 10.0, (81, 122), 1e-4, "synthetic")
    lstm = paper.replace(model="lstm", dataset="ptb")  # the recipe follows the model
    assert (lstm.grad_clip, lstm.grad_clip_mode, lstm.lr_warmup_epochs, lstm.algorithm) == (0.25, "aggregated",
                                                                                          0.0, "tree")
    # explicit values win, even those equal to RunConfig's defaults
    mine = RunConfig(preset="paper", algorithm="butterfly", residual_rule="mass", epochs=2, density=0.01)
    assert (mine.algorithm, mine.residual_rule, mine.epochs, mine.density) == ("butterfly", "mass", 2, 0.01)
    assert RunConfig(preset="paper", density_schedule=(0.01,)).density_warmup is None
    assert paper.replace(preset=None) == RunConfig()
    assert RunConfig.from_dict(paper.to_dict()) == paper
    typed_out = RunConfig(**{k: v for k, v in paper.to_dict().items() if k != "preset"})
    assert config_hash(typed_out) == config_hash(paper)  # the fields it set are what is hashed
    with pytest.raises(ValueError, match=r"^preset='gtopk-2019' is invalid: expected one of paper or None$"):
        RunConfig(preset="gtopk-2019")


@pytest.mark.timeout(60)
def test_cli_preset_flag_runs_records_and_refuses_unknown(tmp_path: Path, capsys) -> None:
    out = tmp_path / "res"
    assert cli_main(["run", "--simulate", "--preset", "nope", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "preset='nope' is invalid: expected one of paper" in err[0], err
    assert not out.exists()
    rc = cli_main(["run", "--simulate", "--preset", "paper", "--model", "mlp", "--workers", "2",
                   "--density", "0.05", "--train-samples", "320", "--test-samples", "64", "--batch-size", "8",
                   "--max-iterations", "5", "--out", str(out), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["preset"], summary["algorithm"], summary["residual_rule"]) == ("paper", "tree", "paper")
    config = json.loads((out / summary["run_id"] / "config.json").read_text())
    assert (config["preset"], config["density"], config["density_warmup"]) == ("paper", 0.05, [0.004, 1])
    assert summary["k"] == k_for(summary["numel"], 0.05)


# The reference's Ok-Topk warm-ups (Shigangli/Ok-Topk run scripts): dense allreduce for the first
# 512 iterations of VGG-16 on CIFAR-10 and 128 of the LSTM on PTB. The project maps the other
# classifiers to VGG-16's value and the other language models (the GPTs) to the LSTM's, whose
# threshold bands they take too, with a preset or without.
REFERENCE_WARMUP = {"vgg16": 512, "lstm": 128}
LANGUAGE_MODELS = ("lstm", "gpt", "gpt_tiny")


@pytest.mark.timeout(30)
def test_paper_preset_sets_oktopks_reference_warmup_and_given_options_win() -> None:
    from gtopk_lab.methods import Method, register_method, unregister_method

    for model, warmup in [*REFERENCE_WARMUP.items(), ("resnet20", 512), ("cnn", 512), ("mlp", 512), ("gpt", 128)]:
        bands = {"bands": "lstm"} if model in LANGUAGE_MODELS else {}
        for method in ("oktopk", "oktopk-balanced"):
            cfg = RunConfig(method=method, preset="paper", model=model, dataset="synthetic")
            assert cfg.extra == {"collective_options": {"warmup": warmup, **bands}}, (method, model)
            plain = RunConfig(method=method, model=model, dataset="synthetic")
            assert plain.extra == ({"collective_options": bands} if bands else {}), (method, model)
    vgg = RunConfig(method="oktopk", preset="paper", model="vgg16", dataset="synthetic")
    # derived again when the model, the preset or the method changes
    assert vgg.replace(model="lstm").extra == {"collective_options": {"warmup": 128, "bands": "lstm"}}
    assert vgg.replace(preset=None) == RunConfig(method="oktopk", model="vgg16", dataset="synthetic")
    assert vgg.replace(method="gtopk").extra == {}  # gTop-k keeps no collective state
    assert RunConfig.from_dict(vgg.to_dict()) == vgg
    # an option the run gives wins; the preset fills the others
    mine = RunConfig(method="oktopk", preset="paper", extra={"collective_options": {"warmup": 7, "tau": 16}})
    assert mine.extra == {"collective_options": {"warmup": 7, "tau": 16}}
    tau = RunConfig(method="oktopk", preset="paper", model="lstm", dataset="synthetic",
                    extra={"collective_options": {"tau": 16}, "sim_compute": "max"})
    assert tau.extra == {"collective_options": {"tau": 16, "warmup": 128, "bands": "lstm"}, "sim_compute": "max"}
    assert tau.replace(model="vgg16").extra == {"collective_options": {"tau": 16, "warmup": 512},
                                                "sim_compute": "max"}
    # methods without preset settings, or no preset: unaffected
    for method in ("gtopk", "topk", "dense", "oktopk-exact"):
        assert RunConfig(method=method, preset="paper").extra == {}, method
    assert RunConfig(method="oktopk").extra == {}
    # generic: any registered method may declare its own
    register_method(Method(name="test-preset-options", collective="oktopk", selector="topk", algorithm="plain",
                           preset_options=lambda preset, model: {"tau_r": 8} if preset == "paper" else {}),
                    replace=True)
    try:
        assert RunConfig(method="test-preset-options", preset="paper").extra == {"collective_options": {"tau_r": 8}}
    finally:
        unregister_method("test-preset-options")
    with pytest.raises(TypeError, match=r"^preset_options=3 is invalid: expected a callable or None$"):
        Method(name="x", collective="gtopk", preset_options=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^collective_options=\[1\] has type list: expected dict$"):
        RunConfig(method="oktopk", preset="paper", extra={"collective_options": [1]})


@pytest.mark.timeout(90)
def test_paper_preset_warmup_reaches_the_collective_and_the_summary() -> None:
    """Oracle: a warm-up iteration is a dense ring allreduce, 2 (P-1) (4 d / P + 8) bytes per rank."""
    small = dict(method="oktopk", preset="paper", model="mlp", workers=2, max_iterations=3, train_samples=64,
                 test_samples=32, batch_size=8, bandwidth="1GbE")
    for extra, warmup in (({}, 512), ({"collective_options": {"warmup": 1}}, 1)):
        run = simulate(RunConfig(**small, extra=extra))
        assert run.summary["oktopk_warmup_iterations"] == warmup
        assert run.summary["preset"] == "paper"
        dense_bytes = 2 * (2 - 1) * (4 * run.summary["numel"] / 2 + 8)
        sent = [r["bytes_sent"] for r in run.rows if r["kind"] == "iter" and r["rank"] == 0]
        assert len(sent) == 3
        for it, b in enumerate(sent):
            if it < warmup:
                assert b == pytest.approx(dense_bytes, abs=8), (warmup, it)
            else:
                assert b < dense_bytes / 5, (warmup, it)
