"""The wake-up term of the collectives' model (issue 27 item 5): its round counts and seconds
against hand-computed values, and the probe on real ranks beside two busy loops."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from gtopk_lab.bench.collective_calls import _add_wakeup_term
from gtopk_lab.network.wakeup import critical_rounds, wakeup_time_s


def test_rounds_on_the_critical_path_by_hand():
    # butterfly: log2 P exchanges; a P that is no power of two adds the fold and unfold rounds
    assert [critical_rounds("gtopk_allreduce", p) for p in (1, 2, 4, 8, 16)] == [0, 1, 2, 3, 4]
    assert critical_rounds("gtopk_allreduce", 6, "butterfly") == 2 + 2
    assert critical_rounds("gtopk_allreduce", 3) == 1 + 2
    # tree: ceil(log2 P) levels up, as many down
    assert [critical_rounds("gtopk_allreduce", p, "tree") for p in (2, 4, 5, 8)] == [2, 4, 6, 6]
    # paced as one library call: one wake-up after it
    assert critical_rounds("topk_allgather", 4) == critical_rounds("dense_allreduce", 16, "ring") == 1
    assert critical_rounds("topk_allgather", 1) == 0


def test_term_is_delay_times_rounds_and_zero_when_not_measured():
    # P = 4: butterfly 2 x 0.4 ms, tree 4 x 0.4 ms, allgather 1 x 0.4 ms
    assert wakeup_time_s(0.4e-3, "gtopk_allreduce", 4, "butterfly") == pytest.approx(0.8e-3)
    assert wakeup_time_s(0.4e-3, "gtopk_allreduce", 4, "tree") == pytest.approx(1.6e-3)
    assert wakeup_time_s(0.4e-3, "topk_allgather", 4) == pytest.approx(0.4e-3)
    assert wakeup_time_s(None, "gtopk_allreduce", 8) == 0.0  # not measured: the plain model
    assert wakeup_time_s(0.0, "gtopk_allreduce", 8, "tree") == 0.0


def test_bench_row_takes_the_median_probe_round():
    row = {"collective": "gtopk_allreduce", "algorithm": "butterfly", "workers": 4, "model_abg_s": 7e-3}
    # sorted 0.2, 0.3, 1.0, 5.0 ms: median 0.65 ms (the 5 ms stall moves the mean, 1.625 ms)
    _add_wakeup_term(row, [1.0e-3, 0.2e-3, 5.0e-3, 0.3e-3])
    assert row["wakeup_delay_s"] == pytest.approx(0.65e-3)
    assert row["wakeup_delay_mean_s"] == pytest.approx(1.625e-3)
    assert row["wakeup_s"] == pytest.approx(2 * 0.65e-3)
    assert row["model_abgw_s"] == pytest.approx(7e-3 + 1.3e-3)
    assert "model_abgcw_s" not in row
    row2 = {"collective": "gtopk_allreduce", "algorithm": "tree", "workers": 4, "model_abg_s": 7e-3,
            "model_abgc_s": 8e-3}
    _add_wakeup_term(row2, [1e-3])
    assert row2["model_abgcw_s"] == pytest.approx(8e-3 + 4e-3)


@pytest.mark.parametrize("call", [lambda: critical_rounds("oktopk", 4), lambda: critical_rounds("gtopk_allreduce", 0),
                                  lambda: critical_rounds("gtopk_allreduce", 4, "ring"),
                                  lambda: critical_rounds("topk_allgather", 4, "tree"),
                                  lambda: wakeup_time_s(-1e-3, "topk_allgather", 4),
                                  lambda: wakeup_time_s(math.nan, "topk_allgather", 4)])
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()


def _probe_rank(rank: int, world: int) -> list[float]:
    from gtopk_lab.bench.timing import wakeup_delays_s

    return wakeup_delays_s(window_s=0.001, rounds=10)


@pytest.mark.timeout(300)  # the first gloo group of a session starts the forkserver: slow at load 15
def test_probe_beside_two_busy_loops_is_positive_and_bounded():
    """Two ranks probe while two busy loops hold the cores: every round ends after its paced
    deadline (delay > 0), the ranks agree (one MAX all_reduce), and the delay is bounded: each
    round well below a second, the mean below 0.1 s even on a loaded 2-core box."""
    from gtopk_lab.comm.launch import run_gloo

    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        per_rank = run_gloo(_probe_rank, 2, timeout_s=120)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert per_rank[0] == per_rank[1] and len(per_rank[0]) == 10
    assert all(0 < d < 1.0 for d in per_rank[0])
    assert sum(per_rank[0]) / 10 < 0.1
