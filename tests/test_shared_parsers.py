"""The one JSON sanitiser, the one count parser and the one cached network parse."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.counts import parse_count, parse_count_list
from gtopk_lab.jsonsafe import json_safe
from gtopk_lab.network import model as netmodel
from gtopk_lab.network.model import NetworkModel, network_model


def test_json_safe_gives_strict_json() -> None:
    data = {"nan": math.nan, "inf": -math.inf, "t": (1, 2.5), 3: "int key", "np": np.float32(0.5),
            "np_nan": np.float64("nan"), "tensor": torch.tensor(2), "arr": np.arange(3), "none": None,
            "nested": [{"x": math.inf}], "flag": True}
    safe = json_safe(data)
    text = json.dumps(safe, allow_nan=False)  # raises on any NaN/inf left over
    assert json.loads(text) == {"nan": None, "inf": None, "t": [1, 2.5], "3": "int key", "np": 0.5,
                                "np_nan": None, "tensor": 2, "arr": "[0 1 2]", "none": None,
                                "nested": [{"x": None}], "flag": True}


def test_every_writer_uses_the_one_sanitiser() -> None:
    from gtopk_lab.orchestration import results

    assert results._jsonable is json_safe


@pytest.mark.parametrize("text, value", [("25M", 25_000_000), ("1.5k", 1500), ("270000", 270000),
                                         ("7B", 7 * 10**9), ("2G", 2 * 10**9), (" 1e6 ", 10**6)])
def test_parse_count(text: str, value: int) -> None:
    assert parse_count(text) == value


@pytest.mark.parametrize("bad", ["lots", "", "0", "-3", "0.4", "infM", "nan"])
def test_parse_count_names_the_field(bad: str) -> None:
    with pytest.raises(ValueError, match="^--model-size="):
        parse_count(bad, "--model-size")


def test_parse_count_list_calls_parse_count() -> None:
    assert parse_count_list("1M, 25M,,200K", "--numel") == [10**6, 25 * 10**6, 200_000]
    for bad in ("", ",", "1M,x", "0"):
        with pytest.raises(ValueError, match="^--numel="):
            parse_count_list(bad, "--numel")


def test_analysis_parse_count_is_the_shared_parser() -> None:
    from gtopk_lab.analysis.predict import parse_count as predict_parse_count

    assert predict_parse_count("25M") == parse_count("25M")
    with pytest.raises(ValueError, match="^model_size="):
        predict_parse_count("lots")


def test_network_is_parsed_once_per_process(monkeypatch) -> None:
    from gtopk_lab.training.runtime import network_of

    calls = []
    real = NetworkModel.from_strings.__func__

    def counting(cls, bandwidth, latency=None):
        calls.append((bandwidth, latency))
        return real(cls, bandwidth, latency)

    netmodel._cached_network.cache_clear()
    monkeypatch.setattr(NetworkModel, "from_strings", classmethod(counting))
    config = RunConfig(bandwidth="123Mbps", latency="7us", workers=2)
    assert network_of(config) is network_of(config.replace(workers=3)) is network_model("123Mbps", "7us")
    assert calls == [("123Mbps", "7us")]
    with pytest.raises(ValueError, match="bandwidth='fast'"):
        network_model("fast")
    with pytest.raises(TypeError, match="bandwidth=1"):
        network_model(1)  # type: ignore[arg-type]


def test_a_recalibrated_file_is_read_again(tmp_path) -> None:
    path = tmp_path / "net.json"
    path.write_text(json.dumps(NetworkModel(1e-3, 1e9, "a").to_dict()))
    first = network_model(str(path))
    assert network_model(str(path)) is first
    path.write_text(json.dumps(NetworkModel(2e-3, 1e9, "a").to_dict()))
    os.utime(path, ns=(os.stat(path).st_mtime_ns + 10**9,) * 2)
    assert network_model(str(path)).latency_s == pytest.approx(2e-3)
