"""Bad input in Python (issue 19 item 8): every RunConfig field fed wrong types, NaN,
infinities, negative and huge values, empty containers and unknown names gives a clean
ValueError/TypeError that names the field; Lab.submit / Lab.study write nothing for it."""

from __future__ import annotations

import dataclasses
import math

import pytest

from gtopk_lab.config import RunConfig

BAD = [None, "x", -1, math.nan, math.inf, -math.inf, [], {}, 1.5, True]
#: values a field may legitimately take from BAD (checked elsewhere, or meaningful)
ALLOWED: dict[str, set[str]] = {
    "selector": {"None"}, "density_warmup": {"None"}, "density_schedule": {"None"}, "preset": {"None"}, "recipe": {"None"},
    "max_iterations": {"None"}, "grad_clip": {"None", "1.5"},
    "latency": {"None"}, "data_dir": {"None", "'x'"}, "model": {"'x'"}, "dataset": {"'x'"},
    "momentum_correction": {"True"}, "throttle": {"True"}, "virtual_merge_cpu": {"True"},
    "checkpoint": {"True"}, "lr": {"1.5"}, "lr_decay": {"1.5"}, "weight_decay": {"1.5"},
    "lr_warmup_epochs": {"1.5"}, "dirichlet_alpha": {"1.5"}, "scheduler_timeout_s": {"1.5"},
    "lr_milestones": {"[]"}, "run_id": {"None", "'x'"},
    # the option groups and dicts: {} is "nothing set"; collective_options None too
    **{name: {"{}"} for name in ("simulator", "compute_charge", "optimiser", "model_options", "output",
                                 "method_options", "custom")},
    "collective_options": {"None", "{}"},
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(RunConfig)])
def test_every_field_rejects_bad_values_naming_the_field(name: str) -> None:
    for value in BAD:
        if repr(value) in ALLOWED.get(name, set()):
            continue
        try:
            RunConfig(**{name: value})
        except (ValueError, TypeError) as exc:
            assert name in str(exc) and "\n" not in str(exc).strip(), (name, value, str(exc))
        else:
            pytest.fail(f"RunConfig({name}={value!r}) was accepted")


@pytest.mark.timeout(60)
def test_huge_values_are_refused_before_anything_runs(tmp_path) -> None:
    from gtopk_lab.orchestration.study_grid import expand_grid

    for axes in ({"workers": []}, {"density": [math.nan]}, {"seeds": -3}, {"methods": ["no-such"]}):
        with pytest.raises((ValueError, TypeError)):
            expand_grid({}, axes, real_max_workers=2)
    assert not any(tmp_path.iterdir())
