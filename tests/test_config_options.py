"""Typed run options (issue 25 item 5): what ``RunConfig.extra`` carried untyped is a set of
frozen, validated groups; the legacy ``extra`` dict maps onto them (unknown keys refused),
hashes stay what they were and old config.json / summary.json files still load and resume."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from gtopk_lab.config import RunConfig
from gtopk_lab.config_options import OPTION_FIELDS, ComputeOptions, OptimiserOptions, SimulatorOptions

#: (RunConfig keyword, bad value, error type, text the one-line message must contain)
BAD_OPTIONS = [
    ("simulator", {"rows": "some"}, ValueError, "simulator.rows"),
    ("simulator", {"rows": 3}, ValueError, "simulator.rows"),
    ("simulator", {"compute": "mean"}, ValueError, "simulator.compute"),
    ("simulator", "all", TypeError, "simulator"),
    ("compute_charge", {"compute_time_s": 0}, ValueError, "compute_charge.compute_time_s"),
    ("compute_charge", {"compute_time_s": "1ms"}, TypeError, "compute_charge.compute_time_s"),
    ("compute_charge", {"compute_time_s": float("inf")}, ValueError, "compute_charge.compute_time_s"),
    ("compute_charge", {"compute_time_s": True}, TypeError, "compute_charge.compute_time_s"),
    ("compute_charge", {"selection_time_s": -1.0, "compute_time_s": 0.1}, ValueError, "compute_charge.selection_time_s"),
    ("compute_charge", {"selection_time_s": 0.001}, ValueError, "compute_charge.selection_time_s"),
    ("compute_charge", {"merge_gamma_s_per_element": float("nan")}, ValueError,
     "compute_charge.merge_gamma_s_per_element"),
    ("compute_charge", {"calibration": "yesterday"}, TypeError, "compute_charge.calibration"),
    ("optimiser", {"name": "adam"}, ValueError, "optimiser.name"),
    ("optimiser", {"betas": [0.9]}, ValueError, "optimiser.betas"),
    ("optimiser", {"betas": [0.9, 1.0]}, ValueError, "optimiser.betas"),
    ("optimiser", {"eps": 0}, ValueError, "optimiser.eps"),
    ("model_options", {"kwargs": [1]}, TypeError, "model_options.kwargs"),
    ("model_options", {"tokenizer": "bpe"}, ValueError, "model_options.tokenizer"),
    ("model_options", {"validation_fraction": 1.0}, ValueError, "model_options.validation_fraction"),
    ("model_options", {"validation_fraction": 0}, ValueError, "model_options.validation_fraction"),
    ("output", {"return_weights": 1}, TypeError, "output.return_weights"),
    ("output", {"warmup_iterations": -1}, ValueError, "output.warmup_iterations"),
    ("output", {"warmup_iterations": 2.5}, TypeError, "output.warmup_iterations"),
    ("method_options", [("sync_every", 2)], TypeError, "method_options"),
    ("custom", "x", TypeError, "custom"),
    ("collective_options", 3, TypeError, "collective_options"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field, value, error, named", BAD_OPTIONS)
def test_each_option_is_validated_where_the_config_is_built(field: str, value, error: type, named: str) -> None:
    with pytest.raises(error) as info:
        RunConfig(**{field: value})
    message = str(info.value)
    assert named in message and "\n" not in message, message


@pytest.mark.timeout(60)
def test_method_and_collective_options_are_typed_by_the_run_s_method() -> None:
    with pytest.raises(ValueError, match="sync_every"):
        RunConfig(method="diloco", method_options={"sync_every": 0})
    with pytest.raises(ValueError, match="ef_decay"):
        RunConfig(method="sparseloco", method_options={"ef_decay": "high"})
    with pytest.raises(ValueError, match="powersgd_rank"):
        RunConfig(method="powersgd", method_options={"powersgd_rank": 0})
    # the collective's state is built when the config is: a bad value, an unknown keyword, no state
    with pytest.raises(ValueError, match=r"^collective_options=.*tau"):
        RunConfig(method="oktopk", collective_options={"tau": 0})
    with pytest.raises(ValueError, match=r"^collective_options=.*taux"):
        RunConfig(method="oktopk", collective_options={"taux": 4})
    with pytest.raises(ValueError, match=r"^collective_options=.*keeps no state"):
        RunConfig(method="gtopk", collective_options={"warmup": 4})
    assert RunConfig(method="oktopk", collective_options={"tau": 8}).collective_options == {"tau": 8}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs, named, closest", [
    ({"extra": {"sim_row": "all"}}, "'sim_row'", "'sim_rows'"),
    ({"extra": {"compute_time": 0.1}}, "'compute_time'", "'compute_time_s'"),
    ({"extra": {"sync_evry": 2}, "method": "diloco"}, "'sync_evry'", "'sync_every'"),
    ({"simulator": {"row": "all"}}, "'row'", "'rows'"),
    ({"optimiser": {"nme": "sgd"}}, "'nme'", "'name'"),
    ({"method_options": {"ef_decy": 0.5}, "method": "sparseloco"}, "'ef_decy'", "'ef_decay'"),
])
def test_an_unknown_key_is_refused_in_one_line_naming_it_and_the_closest(kwargs: dict, named: str,
                                                                         closest: str) -> None:
    with pytest.raises(ValueError) as info:
        RunConfig(**kwargs)
    message = str(info.value)
    assert named in message and f"did you mean {closest}" in message and "\n" not in message, message


@pytest.mark.timeout(60)
def test_custom_settings_may_not_shadow_a_typed_option_and_extra_may_not_clash() -> None:
    with pytest.raises(ValueError, match=r"^custom has key\(s\) 'sim_rows'"):
        RunConfig(custom={"sim_rows": "all"})
    with pytest.raises(TypeError, match=r"^extra sets simulator, given as a field too"):
        RunConfig(simulator={"rows": "all"}, extra={"sim_compute": "max"})
    assert RunConfig(custom={"sleep_s": 0.1}).custom == {"sleep_s": 0.1}
    # typed in, such a key is refused; stored before the typed options, it was a custom
    # training function's setting and loads as one
    with pytest.raises(ValueError, match="'sleep_s'"):
        RunConfig(extra={"sleep_s": 0.1})
    stored = RunConfig.from_dict({"method": "dense", "extra": {"sleep_s": 0.1, "sim_rows": "all"}})
    assert stored.custom == {"sleep_s": 0.1} and stored.simulator.rows == "all"


#: A legacy extra dict using every platform key and a method's option.
LEGACY = {"sim_rows": "rank0", "sim_compute": "straggler", "compute_time_s": 0.004, "selection_time_s": 0.0,
          "merge_gamma_s_per_element": 2e-9, "compute_calibration": {"calibration": "calibrated", "host": "h"},
          "optimizer": "adamw", "betas": (0.8, 0.9), "eps": 1e-7, "model_kwargs": {"hidden": 16},
          "tokenizer": "char", "validation_fraction": 0.25, "return_weights": True, "warmup_iterations": 0,
          "sync_every": 3, "outer_lr": 0.5}


@pytest.mark.timeout(60)
def test_the_legacy_extra_maps_onto_the_typed_fields_and_back() -> None:
    legacy = RunConfig(method="diloco", extra=LEGACY)
    typed = RunConfig(
        method="diloco", simulator=SimulatorOptions(rows="rank0", compute="straggler"),
        compute_charge=ComputeOptions(compute_time_s=0.004, selection_time_s=0.0, merge_gamma_s_per_element=2e-9,
                                      calibration={"calibration": "calibrated", "host": "h"}),
        optimiser=OptimiserOptions(name="adamw", betas=(0.8, 0.9), eps=1e-7),
        model_options={"kwargs": {"hidden": 16}, "tokenizer": "char", "validation_fraction": 0.25},
        output={"return_weights": True, "warmup_iterations": 0}, method_options={"sync_every": 3, "outer_lr": 0.5})
    assert legacy == typed
    assert legacy.extra == LEGACY  # the read-only legacy view is the dict given
    assert legacy.compute_charge.compute_time_s == 0.004 and legacy.model_options.tokenizer == "char"
    assert RunConfig.from_dict(json.loads(json.dumps(legacy.to_dict()))) == legacy
    # a legacy replace replaces the whole extra: options it does not set go back to their defaults
    fewer = legacy.replace(extra={"sim_rows": "all"})
    assert fewer.extra == {"sim_rows": "all"} and fewer.optimiser == OptimiserOptions()
    assert legacy.replace(compute_charge={"compute_time_s": 0.01}).extra == {
        **{k: v for k, v in LEGACY.items() if k not in ("compute_time_s", "selection_time_s",
                                                          "merge_gamma_s_per_element", "compute_calibration")},
        "compute_time_s": 0.01}
    # the groups are frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        legacy.simulator.rows = "all"  # type: ignore[misc]


def _legacy_dict(config: RunConfig) -> dict:
    """``config`` as a config.json of before the typed options: an ``extra`` dict."""
    data = {k: v for k, v in config.to_dict().items() if k not in OPTION_FIELDS}
    data["extra"] = {**config.extra, **config.custom}
    return data


def _hash_by_hand(data: dict) -> str:
    """The config hash as it was defined before the typed options, for a config that sets no
    later, policy or derived field away from its default (sha256 of the canonical JSON)."""
    data = {k: v for k, v in data.items() if k not in ("run_id", "max_restarts", "scheduler_timeout_s",
                                                        "preset", "recipe", "density_schedule", "grad_clip_mode")}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs", [
    {}, {"method": "dense", "workers": 2}, {"extra": {"compute_time_s": 0.01, "selection_time_s": 0.0}},
    {"method": "diloco", "extra": {"sync_every": 3, "optimizer": "sgd"}},
    {"method": "oktopk", "extra": {"collective_options": {"tau": 16}}},
    {"custom": {"sleep_s": 0.01}}, {"method": "powersgd", "extra": {"powersgd_rank": 2, "return_weights": True}},
])
def test_hashes_are_those_of_the_legacy_extra(kwargs: dict) -> None:
    from gtopk_lab.orchestration.run_files import config_hash

    config = RunConfig(**kwargs)
    old = _legacy_dict(config)
    assert config_hash(config) == config_hash(config.to_dict()) == config_hash(old) == _hash_by_hand(old)
    assert RunConfig.from_dict(old) == config


@pytest.mark.timeout(180)
def test_an_old_config_json_and_summary_load_and_resume_from_the_checkpoint(tmp_path: Path, capsys) -> None:
    """A run stored before the typed options (config.json with ``extra``, its summary) is read
    by the tables, recognised as the same point, and ``gtopk-lab run --resume`` continues it
    from its epoch checkpoint to the uninterrupted run's loss."""
    from gtopk_lab.cli import main
    from gtopk_lab.orchestration import results as store
    from gtopk_lab.orchestration.run_files import write_json_atomic, write_parquet_atomic
    from gtopk_lab.training.simulator import simulate

    config = RunConfig(method="gtopk", workers=2, model="mlp", dataset="synthetic", train_samples=256,
                       test_samples=64, epochs=2, batch_size=32, density=0.05, checkpoint=True, device="cpu",
                       run_id="old-run", bandwidth="1Gbps", extra={"return_weights": True, "sim_rows": "all"})
    uninterrupted = simulate(config.replace(checkpoint=False))
    out = tmp_path / "res"
    folder = store.checkpoint_folder(out, config.run_id)
    first = simulate(config.replace(epochs=1), checkpoint_dir=folder)
    old = {**_legacy_dict(config), "config_hash": store.config_hash(config)}
    assert "extra" in old and not set(OPTION_FIELDS) & set(old)
    run = store.RunStore(out, config.run_id)
    run.path.mkdir(parents=True, exist_ok=True)  # the checkpoints lie inside
    write_json_atomic(run.path / "config.json", old)
    summary = store.run_summary(config, first.summary, status="failed", error="scheduler unreachable")
    write_json_atomic(run.path / "summary.json", summary)
    write_parquet_atomic(run.path / "metrics.parquet", store.rows_to_frame(first.rows))
    tables = store.load_summaries(out)
    assert list(tables["run_id"]) == ["old-run"] and tables["status"].iloc[0] == "failed"
    assert tables["config_hash"].iloc[0] == store.config_hash(RunConfig.from_dict(
        {k: v for k, v in old.items() if k != "config_hash"}))

    rc = main(["run", "--resume", "old-run", "--out", str(out), "--simulate", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    assert "resuming old-run from epoch 1" in captured.err
    resumed = json.loads(captured.out.strip().splitlines()[-1])
    assert resumed["status"] == "completed" and resumed["iterations"] == uninterrupted.summary["iterations"]
    assert resumed["final_train_loss"] == pytest.approx(uninterrupted.summary["final_train_loss"], rel=1e-6)
    assert resumed["config_hash"] == old["config_hash"]
    # the config it stores now is the typed form of the same config
    assert RunConfig.from_dict({k: v for k, v in run.read_config().items() if k != "config_hash"}) == config


@pytest.mark.timeout(30)
def test_no_module_reads_the_legacy_extra_view() -> None:
    """The library reads the typed fields; ``RunConfig.extra`` is a view for old callers only."""
    import re

    root = Path(__file__).resolve().parents[1] / "gtopk_lab"
    pattern = re.compile(r"config\.extra\b|\bcfg\.extra\b")
    hits = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == [], hits
