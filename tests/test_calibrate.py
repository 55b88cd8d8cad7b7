"""Calibration: the alpha/beta fit, size parsing, and an end-to-end ping-pong on real gloo."""

from __future__ import annotations

import json
import time

import pytest

from gtopk_lab.network.calibrate import (
    calibrate, fit_alpha_beta, measure_gamma_s_per_element, parse_sizes_bytes,
)
from gtopk_lab.network.model import NetworkModel


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("alpha, beta", [(0.436e-3, 9e-9), (50e-6, 8 / 9.4e9), (2e-6, 8 / 97e9)])
def test_fit_recovers_synthetic_alpha_beta(alpha: float, beta: float, weighted: bool) -> None:
    sizes = [1 << 10, 64 << 10, 1 << 20, 16 << 20]
    times = [alpha + beta * n for n in sizes]
    a, b = fit_alpha_beta(sizes, times, weighted=weighted)
    assert a == pytest.approx(alpha, rel=1e-9)
    assert b == pytest.approx(beta, rel=1e-9)


def test_fit_keeps_constants_non_negative() -> None:
    a, b = fit_alpha_beta([1, 2, 3], [3.0, 2.0, 1.0])  # falling times: no positive beta
    assert b == 0.0 and a > 0
    a, b = fit_alpha_beta([1000, 2000], [0.5e-3, 1.5e-3])  # line through a negative intercept
    assert a == 0.0 and b > 0
    with pytest.raises(ValueError, match="times_s"):
        fit_alpha_beta([1, 2], [0.0, 1.0])
    with pytest.raises(ValueError, match="sizes"):
        fit_alpha_beta([5, 5], [1.0, 2.0])


def test_parse_sizes() -> None:
    assert parse_sizes_bytes("1K,64K,1M,16M") == [1024, 65536, 1 << 20, 16 << 20]
    assert parse_sizes_bytes("100, 2KB") == [100, 2048]
    for bad in ("1K", "big,1M", "0,1K", "1.5,3"):
        with pytest.raises(ValueError, match="sizes="):
            parse_sizes_bytes(bad)


def test_calibrate_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="workers="):
        calibrate(workers=1)
    with pytest.raises(ValueError, match="backend="):
        calibrate(backend="mpi")
    with pytest.raises(ValueError, match="repeats="):
        calibrate(repeats=0)


@pytest.mark.timeout(30)
def test_measure_gamma_is_positive_and_small() -> None:
    gamma = measure_gamma_s_per_element(k=5_000, repeats=3)
    assert 0 < gamma < 1e-5  # well under 10 us per element on any CPU


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_calibrate_end_to_end_on_gloo(tmp_path) -> None:
    from gtopk_lab.cli import main

    out = tmp_path / "cal.json"
    start = time.perf_counter()
    assert main(["calibrate", "--workers", "2", "--sizes", "1K,256K,1M", "--repeats", "3",
                 "--out", str(out)]) == 0
    assert time.perf_counter() - start < 60  # quick by design (a few seconds when idle)
    data = json.loads(out.read_text())
    assert data["backend"] == "gloo" and data["sizes_bytes"] == [1024, 256 << 10, 1 << 20]
    assert all(t > 0 for t in data["times_s"])
    net = NetworkModel.from_strings(str(out))
    assert net.latency_s >= 0 and net.bandwidth_bps > 1e6  # loopback: well above 1 Mbit/s
    assert net.latency_s == pytest.approx(data["alpha_s"])
    assert main(["calibrate", "--workers", "1"]) == 2
    assert main(["calibrate", "--sizes", "huge"]) == 2
