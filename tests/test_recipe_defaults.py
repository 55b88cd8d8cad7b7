"""Model recipes as defaults (issue 27 item 4): the model's recipe supplies exactly the training
fields a run was not given, for RunConfig, ``run``, ``sweep``, ``study`` and the panel; fields
given win; the summary records the recipe and what it supplied.

Oracle: the ``cnn-mnist1d`` recipe's training fields written out by hand below (not read from
``config_presets``), and the dataclass defaults of the fields a recipe never touches.
"""

from __future__ import annotations

import argparse
import json

import pytest

from gtopk_lab.cli.main import build_parser
from gtopk_lab.cli.main import main as cli_main
from gtopk_lab.config import RunConfig
from gtopk_lab.config_flags import config_kwargs
from gtopk_lab.orchestration.run_files import config_hash

#: The fields ``cnn-mnist1d`` supplies to the issue's command (epochs 40 given, density 0.01 < 0.05).
CNN_MNIST1D_SUPPLIED = {
    "train_samples": 4000, "test_samples": 1000, "batch_size": 32, "lr": 0.05, "momentum": 0.9,
    # x0.1 at epoch 90 of the recipe's 120 is epoch 30 of the 40 given
    "weight_decay": 0.0, "lr_warmup_epochs": 1.0, "lr_milestones": (30,), "lr_decay": 0.1,
    "density_warmup": (0.05, 10),
}
#: The issue's command: nothing but method, P, density, model, dataset, epochs.
GIVEN = {"method": "gtopk", "workers": 2, "density": 0.01, "model": "cnn", "dataset": "mnist1d", "epochs": 40}
ARGV = ["--method", "gtopk", "--workers", "2", "--density", "0.01", "--model", "cnn", "--dataset", "mnist1d",
        "--epochs", "40"]
#: What RunConfig had before recipes became defaults (recipe=None keeps it).
NO_RECIPE = {"epochs": 2, "lr_warmup_epochs": 0.0, "lr_milestones": (), "density_warmup": None, "lr": 0.05,
             "momentum": 0.9, "batch_size": 32, "weight_decay": 0.0, "lr_decay": 0.1, "grad_clip": None}


def _fields(config: RunConfig, names) -> dict:
    return {name: getattr(config, name) for name in names}


@pytest.mark.timeout(30)
def test_the_recipe_applies_exactly_the_unset_fields() -> None:
    config = RunConfig(**GIVEN)
    assert config.applied_recipe == ("cnn-mnist1d", tuple(sorted(CNN_MNIST1D_SUPPLIED)))
    assert _fields(config, CNN_MNIST1D_SUPPLIED) == CNN_MNIST1D_SUPPLIED
    assert _fields(config, GIVEN) == GIVEN  # given fields untouched, density included
    # what a recipe never sets stays the dataclass default
    assert (config.grad_clip, config.density_schedule, config.algorithm, config.residual_rule) == \
        (None, None, "butterfly", "mass")
    # nothing given: the recipe's epochs too
    assert RunConfig().epochs == 120 and "epochs" in RunConfig().applied_recipe[1]
    assert RunConfig().lr_milestones == (90,)  # the recipe's own budget: its own milestones
    assert RunConfig(epochs=141, model="resnet20", dataset="cifar10").lr_milestones == (81, 122)  # its own budget
    assert RunConfig(epochs=47, model="resnet20", dataset="cifar10", recipe="resnet20-cifar10").lr_milestones == (27, 41)


@pytest.mark.timeout(30)
def test_explicit_fields_win_even_at_the_dataclass_default() -> None:
    config = RunConfig(**GIVEN, lr=0.1, lr_milestones=(), lr_warmup_epochs=0.0, density_warmup=None)
    assert (config.lr, config.lr_milestones, config.lr_warmup_epochs, config.density_warmup) == (0.1, (), 0.0, None)
    name, supplied = config.applied_recipe
    assert name == "cnn-mnist1d"
    assert set(supplied) == set(CNN_MNIST1D_SUPPLIED) - {"lr", "lr_milestones", "lr_warmup_epochs", "density_warmup"}
    # from the command line: a flag given is a field given
    via_cli = RunConfig(**config_kwargs(build_parser().parse_args(["run", *ARGV, "--lr-warmup-epochs", "0"])))
    assert via_cli.lr_warmup_epochs == 0.0 and via_cli.density_warmup == (0.05, 10)


@pytest.mark.timeout(30)
def test_warmup_only_when_denser_no_schedule_given_and_not_capped() -> None:
    assert RunConfig(**{**GIVEN, "density": 0.1}).density_warmup is None
    # a capped run (a study's throughput point) runs at the density it records
    capped = RunConfig(**GIVEN, max_iterations=24)
    assert capped.density_warmup is None and set(capped.applied_recipe[1]) == set(CNN_MNIST1D_SUPPLIED) - {
        "density_warmup"}
    assert RunConfig(**GIVEN).replace(max_iterations=24).density_warmup is None
    # a warm-up of more than half the run is no warm-up: 10 epochs need >= 20
    assert RunConfig(**{**GIVEN, "epochs": 19}).density_warmup is None
    assert RunConfig(**{**GIVEN, "epochs": 20}).density_warmup == (0.05, 10)
    scheduled = RunConfig(**GIVEN, density_schedule=(0.02,))
    assert scheduled.density_warmup is None and "density_warmup" not in scheduled.applied_recipe[1]


@pytest.mark.timeout(30)
def test_off_no_recipe_and_method_defaults() -> None:
    assert _fields(RunConfig(**GIVEN, recipe=None), NO_RECIPE) == {**NO_RECIPE, "epochs": 40}
    assert RunConfig(**GIVEN, recipe=None).applied_recipe == (None, ())
    assert _fields(RunConfig(model="mlp"), NO_RECIPE) == NO_RECIPE  # mlp has no recipe
    assert RunConfig(model="cnn", dataset="digits").applied_recipe == (None, ())  # another dataset
    ef21 = RunConfig(**{**GIVEN, "method": "ef21"})
    assert ef21.momentum == 0.0  # the method's own default wins
    assert ef21.applied_recipe == ("cnn-mnist1d", tuple(sorted(set(CNN_MNIST1D_SUPPLIED) - {"momentum"})))
    named = RunConfig(model="mlp", recipe="cnn-mnist1d")
    assert named.applied_recipe[0] == "cnn-mnist1d" and named.lr_warmup_epochs == 1.0
    with pytest.raises(ValueError, match="recipe='nope'"):
        RunConfig(recipe="nope")


@pytest.mark.timeout(30)
def test_replace_and_hash_follow_the_recipe() -> None:
    config = RunConfig(**GIVEN)
    assert _fields(config.replace(model="mlp"), NO_RECIPE) == {**NO_RECIPE, "epochs": 40}
    assert config.replace(density=0.1).density_warmup is None
    typed_out = RunConfig(**GIVEN, **CNN_MNIST1D_SUPPLIED, recipe=None)
    assert config_hash(typed_out) == config_hash(config)  # the same run, however its fields came
    assert RunConfig.from_dict(config.to_dict()) == config


@pytest.mark.timeout(60)
def test_sweep_study_and_panel_get_the_recipe() -> None:
    from gtopk_lab.cli import study, sweep
    from gtopk_lab.plotting.panel_fields import study_request
    from gtopk_lab.orchestration.study_grid import expand_grid

    parser = build_parser()
    argv = ["--methods", "dense,gtopk", "--workers", "2", "--density", "0.01", "--model", "cnn", "--epochs", "40"]
    configs = sweep.build_grid(parser.parse_args(["sweep", *argv]))
    points = [p.config for p in study.build_points(parser.parse_args(["study", *argv]), 2)]
    request = study_request(methods=["dense", "gtopk"], workers="2", densities="0.01", bandwidths="1GbE",
                            latencies="", seeds=1, model="cnn", dataset="mnist1d", epochs=0, max_iterations=0)
    panel = [p.config for p in expand_grid(request.base, request.axes, real_max_workers=2)]
    assert configs and points and panel
    for config in configs + points:
        assert _fields(config, CNN_MNIST1D_SUPPLIED) == CNN_MNIST1D_SUPPLIED and config.epochs == 40
    for config in panel:  # epochs 0 in the panel: the recipe's, and its own milestones
        assert _fields(config, CNN_MNIST1D_SUPPLIED) == {**CNN_MNIST1D_SUPPLIED, "lr_milestones": (90,)}
        assert config.epochs == 120


@pytest.mark.timeout(180)
def test_the_summary_records_the_recipe_and_its_fields(tmp_path, capsys) -> None:
    out = tmp_path / "res"
    rc = cli_main(["run", "--simulate", *ARGV, "--train-samples", "128", "--out", str(out), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["recipe"] == "cnn-mnist1d"
    assert summary["recipe_fields"].split(",") == sorted(set(CNN_MNIST1D_SUPPLIED) - {"train_samples"})
    assert summary["link"].startswith("1GbE")
    stored = json.loads(next(out.glob("*/summary.json")).read_text())
    assert (stored["recipe"], stored["recipe_fields"]) == (summary["recipe"], summary["recipe_fields"])
    config = json.loads(next(out.glob("*/config.json")).read_text())
    assert config["density_warmup"] == [0.05, 10] and config["recipe"] == "auto"


@pytest.mark.timeout(30)
def test_a_bad_recipe_flag_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    rc = cli_main(["run", "--recipe", "nope", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "recipe='nope' is invalid" in err[0]
    assert isinstance(build_parser(), argparse.ArgumentParser)
