"""One flag syntax: ``gtopk-lab run`` and the torchrun entry build RunConfig flags alike."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from gtopk_lab.cli.main import build_parser as cli_parser
from gtopk_lab.cli.main import main as cli_main
from gtopk_lab.config import RunConfig
from gtopk_lab.config_flags import FIELD_HELP, FLAG_FIELDS, config_kwargs, flag_of
from gtopk_lab.training import torchrun

FIELDS = list(FLAG_FIELDS)  # the RunConfig fields and the legacy --extra
assert FIELDS[:-1] == [f.name for f in dataclasses.fields(RunConfig)] and FIELDS[-1] == "extra"

#: For every RunConfig field, argv snippets that set it (after the flag) and the value parsed.
SAMPLES: dict[str, list[tuple[list[str], object]]] = {
    "method": [(["dense"], "dense")],
    "algorithm": [(["tree"], "tree")],
    "selector": [(["topk"], "topk"), (["none"], None)],
    "residual_rule": [(["paper"], "paper")],
    "density": [(["0.001"], 0.001)],
    "density_warmup": [(["0.004,1"], (0.004, 1)), (["0.004", "1"], (0.004, 1)), (["none"], None)],
    "workers": [(["3"], 3)],
    "model": [(["mlp"], "mlp")],
    "dataset": [(["digits"], "digits")],
    "data_dir": [(["/tmp"], "/tmp"), (["none"], None)],
    "train_samples": [(["256"], 256)],
    "test_samples": [(["64"], 64)],
    "data_split": [(["dirichlet"], "dirichlet")],
    "dirichlet_alpha": [(["0.1"], 0.1)],
    "epochs": [(["5"], 5)],
    "max_iterations": [(["20"], 20), (["none"], None)],
    "batch_size": [(["16"], 16)],
    "lr": [(["0.1"], 0.1)],
    "momentum": [(["0.5"], 0.5)],
    "weight_decay": [(["1e-4"], 1e-4)],
    "lr_warmup_epochs": [(["2.5"], 2.5)],
    "lr_milestones": [(["80,120"], (80, 120)), (["80", "120"], (80, 120)), (["80,", "120"], (80, 120)),
                      ([], ())],
    "lr_decay": [(["0.25"], 0.25)],
    "grad_clip": [(["0.25"], 0.25), (["none"], None)],
    "grad_clip_mode": [(["local"], "local")],
    "density_schedule": [(["0.015625,0.004"], (0.015625, 0.004)), (["0.015625", "0.004"], (0.015625, 0.004)),
                         (["none"], None)],
    "preset": [(["paper"], "paper"), (["none"], None)],
    "recipe": [(["cnn-mnist1d"], "cnn-mnist1d"), (["auto"], "auto"), (["none"], None)],
    "seed": [(["7"], 7)],
    "bandwidth": [(["10GbE"], "10GbE")],
    "latency": [(["50us"], "50us"), (["none"], None)],
    "device": [(["cpu"], "cpu")],
    "eval_every_epochs": [(["2"], 2)],
    "sink_every": [(["5"], 5)],
    "max_restarts": [(["2"], 2)],
    "scheduler_timeout_s": [(["30"], 30.0)],
    "run_id": [(["my-run"], "my-run")],
    "simulator": [(["rows=all"], {"rows": "all"})],
    "compute_charge": [(["compute_time_s=0.01"], {"compute_time_s": 0.01})],
    "optimiser": [(["name=adamw"], {"name": "adamw"})],
    "model_options": [(['kwargs={"vocab_size": 50}'], {"kwargs": {"vocab_size": 50}})],
    "output": [(["return_weights=true"], {"return_weights": True})],
    "collective_options": [(["warmup=8"], {"warmup": 8})],
    "method_options": [(["sync_every=4"], {"sync_every": 4})],
    "custom": [(["note=x"], {"note": "x"})],
    "extra": [(["sim_rows=all"], {"sim_rows": "all"}), (["compute_time_s=0.01"], {"compute_time_s": 0.01})],
}
BOOLS = ("momentum_correction", "throttle", "virtual_merge_cpu", "checkpoint")

#: Bad values of each kind of flag: argparse's usage error must name the flag.
BAD = [("workers", "two"), ("density", "dense"), ("max_iterations", "many"), ("lr_milestones", "80,x"),
       ("density_warmup", "0.004"), ("density_warmup", "0.004,1,2"), ("density_schedule", "0.1,x"),
       ("extra", "novalue")]


def _run_parser() -> argparse.ArgumentParser:
    parser = cli_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def _parse_run(argv: list[str]) -> argparse.Namespace:
    return cli_parser().parse_args(["run", *argv])


def _parse_torchrun(argv: list[str]) -> argparse.Namespace:
    return torchrun.build_parser().parse_args(argv)


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt: a for a in parser._actions for opt in a.option_strings}


def test_every_field_has_one_help_text_and_a_sample() -> None:
    assert set(FIELD_HELP) == set(FIELDS)
    assert set(SAMPLES) | set(BOOLS) == set(FIELDS)


@pytest.mark.parametrize("name", FIELDS)
def test_each_field_is_the_same_flag_in_both_parsers(name: str) -> None:
    run_action = _actions(_run_parser()).get(flag_of(name))
    torch_action = _actions(torchrun.build_parser()).get(flag_of(name))
    assert run_action is not None and torch_action is not None
    for attr in ("option_strings", "dest", "nargs", "metavar", "help", "default", "const", "choices"):
        assert getattr(run_action, attr) == getattr(torch_action, attr), attr
    assert type(run_action) is type(torch_action)
    assert getattr(run_action.type, "__name__", None) == getattr(torch_action.type, "__name__", None)
    assert run_action.default is argparse.SUPPRESS  # a flag not given leaves RunConfig's default


@pytest.mark.parametrize("name", FIELDS)
def test_each_field_parses_the_same_in_both_parsers(name: str) -> None:
    cases = SAMPLES.get(name) or [([], True)]
    for tokens, expected in cases:
        if name in BOOLS:
            argvs = [([flag_of(name)], True), (["--no-" + flag_of(name)[2:]], False)]
        else:
            argvs = [([flag_of(name), *tokens], expected)]
        for argv, want in argvs:
            got_run = config_kwargs(_parse_run(argv))
            got_torch = config_kwargs(_parse_torchrun(argv))
            assert got_run == got_torch == {name: want}, argv


def test_flags_not_given_are_absent() -> None:
    assert config_kwargs(_parse_run([])) == {} == config_kwargs(_parse_torchrun([]))


def test_lr_milestones_comma_form_gives_the_same_config_through_both_entries() -> None:
    argv = ["--lr-milestones", "80,120", "--density-warmup", "0.004,1", "--workers", "2", "--extra", "betas=[0.8,0.9]"]
    via_run = RunConfig(**config_kwargs(_parse_run(argv)))
    via_torchrun = torchrun.config_from_args(_parse_torchrun(argv), world_size=None)
    assert via_run == via_torchrun
    assert via_run.lr_milestones == (80, 120) and via_run.density_warmup == (0.004, 1)
    assert via_run.extra == {"betas": (0.8, 0.9)} and via_run.optimiser.betas == (0.8, 0.9)
    # the torchrun entry's older space-separated form still parses to the same config
    old = torchrun.config_from_args(_parse_torchrun(["--lr-milestones", "80", "120", "--density-warmup",
                                                     "0.004", "1", "--workers", "2", "--extra", "betas=[0.8,0.9]"]),
                                    world_size=None)
    assert old == via_run


def test_torchrun_flags_override_a_recipe_and_workers_default_to_world_size() -> None:
    args = _parse_torchrun(["--recipe", "resnet20-cifar10", "--lr-milestones", "10,20", "--data-dir", "/tmp"])
    config = torchrun.config_from_args(args, world_size=3)
    assert config.lr_milestones == (10, 20) and config.workers == 3 and config.model == "resnet20"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, value", BAD)
def test_bad_values_exit_2_with_one_line_naming_the_flag(name: str, value: str, capsys) -> None:
    flag = flag_of(name)
    assert cli_main(["run", flag, *value.split(" ")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gtopk-lab: error: argument " + flag), err
    with pytest.raises(SystemExit) as exc:
        torchrun.main([flag, *value.split(" ")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m gtopk_lab.training.torchrun: error: argument " + flag), err


def test_values_that_parse_but_runconfig_rejects_name_the_field(capsys) -> None:
    assert torchrun.main(["--density", "2", "--workers", "1"]) == 2
    assert "density=2.0 is invalid" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_torchrun_single_rank_prints_strict_json(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    out = tmp_path / "summary.json"
    rc = torchrun.main(["--workers", "1", "--method", "dense", "--model", "digits_cnn", "--dataset", "digits",
                        "--train-samples", "64", "--test-samples", "16", "--batch-size", "16", "--epochs", "2",
                        "--max-iterations", "3", "--lr-milestones", "1,2", "--device", "cpu",
                        "--summary-out", str(out)])
    assert rc == 0

    def no_constants(text: str) -> None:
        raise AssertionError(f"non-JSON constant {text} in the summary")

    printed = json.loads(capsys.readouterr().out, parse_constant=no_constants)
    assert json.loads(out.read_text(), parse_constant=no_constants) == printed
    assert printed["method"] == "dense" and printed["iterations"] == 3
