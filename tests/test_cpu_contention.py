"""The off-wire CPU term of the collectives' model (issue 27 item 5), against hand-computed values."""

from __future__ import annotations

import math

import pytest

from gtopk_lab.bench.collective_calls import _add_off_wire_term
from gtopk_lab.network.cpu_contention import (OFF_WIRE_PHASES, cpu_contention, off_wire_cpu_s, off_wire_wall_s,
                                              processor_sharing_s, shared_contention)


def test_contention_is_ranks_over_cores_and_never_below_one():
    assert cpu_contention(4, 2) == 2.0
    assert cpu_contention(4, 1.25) == pytest.approx(3.2)
    assert cpu_contention(2, 2) == 1.0
    assert cpu_contention(1, 16) == 1.0  # more cores than ranks: no slow-down
    assert cpu_contention(8, None) == 1.0  # a core per rank


def test_another_jobs_ranks_contend_by_the_share_of_the_call_they_spend_on_a_core():
    """4 ranks of this call and 4 of another job on 2 cores, 2 ms of CPU and 7.73 ms of wire a
    call: s = 2 + 2u with u = 2s / (7.73 + 2s), i.e. 2 s**2 - 0.27 s - 15.46 = 0, solved here."""
    root = (0.27 + math.sqrt(0.27 ** 2 + 8 * 15.46)) / 4
    assert shared_contention(4, 2, 4, 2e-3, 7.73e-3) == pytest.approx(root, rel=1e-6)
    assert 2.0 < root < 4.0  # between this job alone and every rank counted in full
    assert shared_contention(4, 2, 0, 2e-3, 7.73e-3) == cpu_contention(4, 2)  # no other job
    assert shared_contention(4, 2, 4, 2e-3, 0.0) == pytest.approx(4.0)  # all CPU: all contend
    assert shared_contention(4, 2, 4, 0.0, 7.73e-3) == 2.0  # the other job never on a core
    assert shared_contention(1, 2, 1, 1e-3, 1e-3) == 1.0  # cores to spare
    for bad in ({"other_ranks": -1}, {"other_ranks": 1.5}, {"cpu_s": -1.0}, {"wire_s": math.inf}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            shared_contention(4, 2, **{"other_ranks": 4, "cpu_s": 1e-3, "wire_s": 1e-3, **bad})


def _shared_by_small_steps(work: list[float], cores: float, dt: float = 1e-4) -> list[float]:
    """The oracle: advance time in steps of ``dt``, each unfinished rank doing
    ``dt min(1, cores / unfinished)`` of its work per step; a rank's time is the end of the
    step its work ran out in."""
    left, done, t = list(work), [0.0] * len(work), 0.0
    for i, w in enumerate(work):
        if w == 0:
            left[i] = None
    while any(x is not None for x in left):
        running = [i for i, x in enumerate(left) if x is not None]
        rate = min(1.0, cores / len(running))
        t += dt
        for i in running:
            left[i] -= dt * rate
            if left[i] <= 1e-12:
                left[i], done[i] = None, t
    return done


@pytest.mark.parametrize("work,cores", [([0.52, 0.57, 0.61, 0.68, 1.32, 1.69, 1.97, 1.97], 2.09),
                                        ([1.0, 1.0, 1.0, 1.0], 2.0), ([0.3, 2.0, 0.0], 1.0),
                                        ([0.5, 0.7], 4.0), ([1.5, 0.2, 0.9, 0.2], 1.3)])
def test_processor_sharing_against_small_time_steps(work, cores):
    """Every rank's wall time when all start together and share the cores (one core each at
    most), against the oracle's steps of 0.1 ms (work in ms here), within two steps."""
    expected = _shared_by_small_steps(work, cores)
    assert processor_sharing_s(work, cores) == pytest.approx(expected, abs=2e-4 * max(1.0, len(work) / cores))


def test_processor_sharing_of_alike_work_is_the_full_count_and_of_a_trees_leaves_less():
    assert processor_sharing_s([2e-3] * 8, 2.0) == pytest.approx([2e-3 * cpu_contention(8, 2.0)] * 8)
    assert processor_sharing_s([2e-3] * 2, 4.0) == pytest.approx([2e-3, 2e-3])  # a core each
    # a P = 8 tree on 2 cores: four leaves that only sort, then three merging ranks and the root
    tree = processor_sharing_s([0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.5, 2.0], 2.0)
    # all eight sort at once (0.5 ms at 2/8 of a core: 2 ms), four merge 0.5 ms more at 1/2
    # (1 ms), two 0.5 ms more at a core each, the root its last 0.5 ms alone
    assert tree == pytest.approx([2.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.5, 4.0])
    assert tree[-1] < 2.0 * cpu_contention(8, 2.0)  # counting all eight for the whole call: 8 ms
    for bad in ({"work_s": []}, {"work_s": [-1.0]}, {"work_s": [math.nan]}, {"cores": 0}, {"cores": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            processor_sharing_s(**{"work_s": [1.0], "cores": 2.0, **bad})


def test_off_wire_cpu_sums_prep_pack_unpack_finish_only():
    phases = {"prep": 0.4e-3, "pack": 0.06e-3, "sendrecv": 9e-3, "unpack": 0.05e-3, "merge": 1.1e-3,
              "finish": 0.03e-3}
    assert set(OFF_WIRE_PHASES) == {"prep", "pack", "unpack", "finish"}
    assert off_wire_cpu_s(phases) == pytest.approx(0.54e-3)
    assert off_wire_cpu_s({"merge": 1.0}) == 0.0


def test_term_is_cpu_times_contention():
    # 0.5 ms of off-wire CPU, 4 ranks on the 1.25 cores they got: 0.5 * 4 / 1.25 = 1.6 ms
    assert off_wire_wall_s([0.5e-3], 4, 1.25) == [pytest.approx(1.6e-3)]
    assert off_wire_wall_s([0.5e-3], 2, 2) == [pytest.approx(0.5e-3)]
    assert off_wire_wall_s([0.0], 8, 0.5) == [0.0]
    assert off_wire_wall_s([0.5e-3, 0.2e-3], 4, None) == [0.5e-3, 0.2e-3]  # a core per rank


def test_bench_row_gets_abgc_from_the_slowest_rank():
    row = {"model_abg_s": 7.0e-3, "profile": {"ranks": [
        {"phases_cpu_s": {"prep": 0.3e-3, "pack": 0.1e-3, "unpack": 0.1e-3, "finish": 0.0, "merge": 1e-3}},
        {"phases_cpu_s": {"prep": 0.2e-3, "pack": 0.05e-3, "unpack": 0.05e-3, "finish": 0.0}},
    ]}}
    _add_off_wire_term(row, 4, 2.0)
    assert row["off_wire_cpu_s"] == pytest.approx(0.5e-3)
    # 4 ranks (the two unprofiled as busy as the busiest: 0.5, 0.3, 0.5, 0.5 ms) on 2 cores,
    # by hand: all at half speed until the 0.3 ms rank ends at 0.6 ms, then three at 2/3 for
    # the 0.2 ms they have left: 0.9 ms (alike work, 0.5 ms x 4 / 2, would be 1.0)
    assert row["model_abgc_s"] == pytest.approx(7.0e-3 + 0.9e-3)
    alike = {"model_abg_s": 0.0, "profile": {"ranks": [{"phases_cpu_s": {"prep": 0.5e-3}}] * 4}}
    _add_off_wire_term(alike, 4, 2.0)
    assert alike["model_abgc_s"] == pytest.approx(0.5e-3 * 4 / 2.0)
    bare = {"model_abg_s": 1.0}
    _add_off_wire_term(bare, 4, 2.0)  # no profile (dense, allgather): no term
    assert "model_abgc_s" not in bare


@pytest.mark.parametrize("call", [lambda: cpu_contention(0, 2), lambda: cpu_contention(True, 2),
                                  lambda: cpu_contention(4, 0), lambda: cpu_contention(4, math.inf),
                                  lambda: off_wire_wall_s([-1.0], 4, 2), lambda: off_wire_wall_s([math.nan], 4, 2),
                                  lambda: off_wire_cpu_s({"prep": -1.0})])
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()
