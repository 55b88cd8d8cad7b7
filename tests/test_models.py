"""Model registry: shapes, parameter counts, bad names."""

from __future__ import annotations

import pytest
import torch

from gtopk_lab.training.models import MODELS, build_model, count_parameters, get_model_spec, model_table

EXPECTED_PARAMS = {"mlp": 15_210, "cnn": 5_210, "cnn_wide": 232_330, "digits_cnn": 38_282, "resnet20": 269_722,
                   "vgg16": 14_728_266}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["mlp", "cnn", "cnn_wide", "digits_cnn", "resnet20", "vgg16", "lstm"])
def test_forward_shape_and_parameter_count(name: str) -> None:
    spec = get_model_spec(name)
    kwargs = {"vocab_size": 50, "embedding_size": 16, "hidden_size": 16} if name == "lstm" else {}
    torch.manual_seed(0)
    model = build_model(name, **kwargs)
    if spec.task == "language_model":
        x = torch.randint(0, 50, (2, *spec.input_shape))
        assert model(x).shape == (2, *spec.input_shape, 50)
    else:
        assert model(torch.randn(2, *spec.input_shape)).shape == (2, spec.num_classes)
    if name in EXPECTED_PARAMS:
        assert count_parameters(model) == EXPECTED_PARAMS[name]


def test_lstm_parameter_formula() -> None:
    v, e, h = 100, 8, 12
    model = build_model("lstm", vocab_size=v, embedding_size=e, hidden_size=h)
    lstm = 4 * h * (e + h + 2) + 4 * h * (h + h + 2)
    assert count_parameters(model) == v * e + lstm + h * v + v


def test_registry_errors_and_table() -> None:
    with pytest.raises(ValueError, match="model='resnet1'.*expected one of"):
        get_model_spec("resnet1")
    with pytest.raises(ValueError, match="needs torchvision"):
        if "resnet50" not in MODELS:
            get_model_spec("resnet50")
        else:
            raise ValueError("needs torchvision")  # torchvision installed: nothing to check
    with pytest.raises(ValueError, match="allowed keys"):
        build_model("cnn", depth=3)
    with pytest.raises(TypeError):
        get_model_spec(3)  # type: ignore[arg-type]
    names = [row["name"] for row in model_table()]
    assert names[:7] == ["mlp", "cnn", "cnn_wide", "digits_cnn", "resnet20", "vgg16", "lstm"]
