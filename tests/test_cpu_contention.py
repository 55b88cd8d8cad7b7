"""The off-wire CPU term of the collectives' model (issue 27 item 5), against hand-computed values."""

from __future__ import annotations

import math

import pytest

from gtopk_lab.bench.collective_calls import _add_off_wire_term
from gtopk_lab.network.cpu_contention import OFF_WIRE_PHASES, cpu_contention, off_wire_cpu_s, off_wire_time_s


def test_contention_is_ranks_over_cores_and_never_below_one():
    assert cpu_contention(4, 2) == 2.0
    assert cpu_contention(4, 1.25) == pytest.approx(3.2)
    assert cpu_contention(2, 2) == 1.0
    assert cpu_contention(1, 16) == 1.0  # more cores than ranks: no slow-down
    assert cpu_contention(8, None) == 1.0  # a core per rank


def test_off_wire_cpu_sums_prep_pack_unpack_finish_only():
    phases = {"prep": 0.4e-3, "pack": 0.06e-3, "sendrecv": 9e-3, "unpack": 0.05e-3, "merge": 1.1e-3,
              "finish": 0.03e-3}
    assert set(OFF_WIRE_PHASES) == {"prep", "pack", "unpack", "finish"}
    assert off_wire_cpu_s(phases) == pytest.approx(0.54e-3)
    assert off_wire_cpu_s({"merge": 1.0}) == 0.0


def test_term_is_cpu_times_contention():
    # 0.5 ms of off-wire CPU, 4 ranks on the 1.25 cores they got: 0.5 * 4 / 1.25 = 1.6 ms
    assert off_wire_time_s(0.5e-3, 4, 1.25) == pytest.approx(1.6e-3)
    assert off_wire_time_s(0.5e-3, 2, 2) == pytest.approx(0.5e-3)
    assert off_wire_time_s(0.0, 8, 0.5) == 0.0


def test_bench_row_gets_abgc_from_the_slowest_rank():
    row = {"model_abg_s": 7.0e-3, "profile": {"ranks": [
        {"phases_cpu_s": {"prep": 0.3e-3, "pack": 0.1e-3, "unpack": 0.1e-3, "finish": 0.0, "merge": 1e-3}},
        {"phases_cpu_s": {"prep": 0.2e-3, "pack": 0.05e-3, "unpack": 0.05e-3, "finish": 0.0}},
    ]}}
    _add_off_wire_term(row, 4, 2.0)
    assert row["off_wire_cpu_s"] == pytest.approx(0.5e-3)
    assert row["model_abgc_s"] == pytest.approx(7.0e-3 + 0.5e-3 * 2)
    bare = {"model_abg_s": 1.0}
    _add_off_wire_term(bare, 4, 2.0)  # no profile (dense, allgather): no term
    assert "model_abgc_s" not in bare


@pytest.mark.parametrize("call", [lambda: cpu_contention(0, 2), lambda: cpu_contention(True, 2),
                                  lambda: cpu_contention(4, 0), lambda: cpu_contention(4, math.inf),
                                  lambda: off_wire_time_s(-1.0, 4, 2), lambda: off_wire_time_s(math.nan, 4, 2),
                                  lambda: off_wire_cpu_s({"prep": -1.0})])
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()
