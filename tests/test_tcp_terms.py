"""gtopk_lab.network.tcp_terms against hand-computed expectations (no testbed needed)."""

from __future__ import annotations

import math

import pytest

from gtopk_lab.network.model import NetworkModel
from gtopk_lab.network.tcp_terms import (
    TcpTerms, bottleneck_beta, fit_per_message_cpu, relative_errors, slow_start_extra_s,
)

pytestmark = pytest.mark.timeout(60)

# 200 Mbit/s: beta = 4e-8 s/B; rtt 1 ms: BDP = 25,000 B; W0 = 1000 B -> the window reaches the
# BDP after ceil(log2 25) = 5 round trips, having sent 1000 * (2**5 - 1) = 31,000 B.
RATE, RTT, W0 = 200e6, 1e-3, 1000.0


def test_slow_start_short_message_by_hand() -> None:
    # 3000 B: ceil(log2(3000/1000 + 1)) = 2 round trips = 2 ms, minus its 0.12 ms of bytes
    assert slow_start_extra_s(3000, RATE, RTT, W0) == pytest.approx(2e-3 - 1.2e-4)


def test_slow_start_long_message_by_hand() -> None:
    # past the ramp: 5 round trips minus the 31,000 B they carried at full rate
    assert slow_start_extra_s(100_000, RATE, RTT, W0) == pytest.approx(5e-3 - 4e-8 * 31_000)
    assert slow_start_extra_s(10_000_000, RATE, RTT, W0) == pytest.approx(5e-3 - 4e-8 * 31_000)


def test_slow_start_vanishes_where_it_should() -> None:
    assert slow_start_extra_s(3000, RATE, 0.0, W0) == 0.0
    assert slow_start_extra_s(3000, math.inf, RTT, W0) == 0.0
    assert slow_start_extra_s(0, RATE, RTT, W0) == 0.0
    assert slow_start_extra_s(3000, RATE, RTT, 30_000.0) == 0.0  # window already >= BDP
    with pytest.raises(ValueError, match="init_window_bytes"):
        slow_start_extra_s(3000, RATE, RTT, 0.0)


def test_default_terms_reproduce_plain_model() -> None:
    net = NetworkModel(latency_s=1e-4, bandwidth_bps=RATE)
    steps = [(1000, 2000), (5_000_000, 10)]
    assert TcpTerms().steps_time_s(net, steps) == net.steps_time_s(steps)


def test_terms_add_by_hand() -> None:
    net = NetworkModel(latency_s=1e-4, bandwidth_bps=RATE)
    terms = TcpTerms(cpu_s_per_message=5e-5, incast_s_per_sender=1e-4)
    # alpha 1e-4 + beta * 2000 = 8e-5 + cpu 5e-5 + incast 2 extra senders * 1e-4
    assert terms.steps_time_s(net, [(1000, 2000)], senders=[3]) == pytest.approx(4.3e-4)
    with_rtt = TcpTerms(rtt_s=RTT, init_window_bytes=W0)
    assert with_rtt.steps_time_s(net, [(3000, 0)]) == pytest.approx(1e-4 + 1.2e-4 + 2e-3 - 1.2e-4)


def test_a_shapers_burst_takes_its_bytes_off_each_round_by_hand() -> None:
    net = NetworkModel(latency_s=1e-4, bandwidth_bps=RATE)  # beta 4e-8 s/B
    burst = TcpTerms(burst_bytes=3000.0)
    assert not burst.is_zero and TcpTerms().is_zero
    # 8000 B: alpha + (8000 - 3000) * 4e-8; 1000 B, below the bucket: alpha alone
    assert burst.steps_time_s(net, [(8000, 0)]) == pytest.approx(1e-4 + 5000 * 4e-8)
    assert burst.steps_time_s(net, [(1000, 1000)]) == pytest.approx(1e-4)
    # the larger direction of a round sets it, as the plain model's max(sent, recv)
    assert burst.steps_time_s(net, [(500, 10_000)]) == pytest.approx(1e-4 + 7000 * 4e-8)
    assert TcpTerms.from_dict(burst.to_dict()) == burst
    with pytest.raises(ValueError, match="burst_bytes"):
        TcpTerms(burst_bytes=-1.0)


def test_a_busy_port_takes_its_fraction_of_beta_off_rounds_with_several_senders_by_hand() -> None:
    net = NetworkModel(latency_s=1e-4, bandwidth_bps=RATE)  # beta 4e-8 s/B
    port = TcpTerms(burst_bytes=3000.0, incast_beta_fraction=0.1)
    assert not TcpTerms(incast_beta_fraction=0.1).is_zero
    # 3 senders of 4,000 B into one rank: alpha + (12,000 - 3,000) B at 0.9 of beta
    assert port.steps_time_s(net, [(0, 12_000)], senders=[3]) == pytest.approx(1e-4 + 9000 * 4e-8 * 0.9)
    # one sender: the flow's own beta, as the ping-pong measured it
    assert port.steps_time_s(net, [(0, 12_000)]) == pytest.approx(1e-4 + 9000 * 4e-8)
    # below the burst nothing is left to save: never under alpha
    assert port.steps_time_s(net, [(0, 2000)], senders=[7]) == pytest.approx(1e-4)
    assert TcpTerms.from_dict(port.to_dict()) == port
    # a calibration file written before the term existed reads as 0
    assert TcpTerms.from_dict({"burst_bytes": 3000.0}).incast_beta_fraction == 0.0
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="incast_beta_fraction"):
            TcpTerms(incast_beta_fraction=bad)


def test_bottleneck_beta_is_the_slowest_link() -> None:
    assert bottleneck_beta([1e9, 200e6, math.inf]) == pytest.approx(4e-8)
    assert bottleneck_beta([math.inf]) == 0.0
    with pytest.raises(ValueError, match="bandwidths_bps"):
        bottleneck_beta([])


def test_fit_and_errors_by_hand() -> None:
    # residuals 0.2 and 0.4 over 2 and 4 rounds: c = (0.4 + 1.6) / (4 + 16) = 0.1
    assert fit_per_message_cpu([1.2, 2.4], [1.0, 2.0], [2, 4]) == pytest.approx(0.1)
    assert fit_per_message_cpu([0.5], [1.0], [1]) == 0.0  # clamped: never negative
    assert relative_errors([2.0, 4.0], [2.2, 3.0]) == pytest.approx([0.1, -0.25])
    with pytest.raises(ValueError, match="measured_s"):
        relative_errors([0.0], [1.0])


def test_bad_fields_are_named() -> None:
    with pytest.raises(ValueError, match="rtt_s"):
        TcpTerms(rtt_s=-1.0)
    with pytest.raises(TypeError, match="cpu_s_per_message"):
        TcpTerms(cpu_s_per_message="1ms")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="senders"):
        TcpTerms().steps_time_s(NetworkModel(0.0, RATE), [(1, 1)], senders=[1, 2])
