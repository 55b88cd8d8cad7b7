"""RunConfig validation: bad values fail at construction naming the field."""

from __future__ import annotations

import json

import pytest

from gtopk_lab.config import RunConfig, k_for


def test_defaults_are_valid_and_round_trip_through_json() -> None:
    cfg = RunConfig(method="gtopk", workers=3, density=0.001, lr_milestones=(2, 4),
                    density_warmup=(0.004, 1), bandwidth="1Gbps", latency="0.5ms")
    again = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg


@pytest.mark.parametrize(
    ("field", "value"),
    [("method", "allreduce"), ("algorithm", "ring"), ("residual_rule", "none"),
     ("density", 0.0), ("density", 1.5), ("density", float("nan")), ("workers", 0),
     ("epochs", 0), ("batch_size", 0), ("lr", 0.0), ("momentum", -0.1),
     ("grad_clip", 0.0), ("max_iterations", 0), ("device", "tpu"),
     ("density_warmup", (2.0, 1)), ("bandwidth", "fast")],
)
def test_bad_values_raise_value_error_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field if field != "bandwidth" else "bandwidth|accepted"):
        RunConfig(**{field: value})


@pytest.mark.parametrize(("field", "value"), [("workers", "4"), ("density", "0.1"),
                                              ("throttle", 1), ("method", 3)])
def test_wrong_types_raise_type_error_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(TypeError, match=field):
        RunConfig(**{field: value})


def test_unknown_fields_are_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="bogus"):
        RunConfig.from_dict({"bogus": 1})


def test_k_for_follows_the_paper() -> None:
    assert k_for(25_000_000, 0.001) == 25_000
    assert k_for(10, 0.001) == 1
    with pytest.raises(ValueError, match="numel"):
        k_for(0, 0.5)
