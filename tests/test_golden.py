"""Behaviour is preserved: every method reproduces the golden outputs recorded before the
method-registry refactor (tests/golden_runs.py wrote them): final weights bitwise, bytes per
rank and iteration, losses and modelled communication, simulated and on real gloo ranks."""

from __future__ import annotations

import json

import pytest

from golden_runs import CASES, GOLDEN, real_many, simulated

EXPECTED = json.loads(GOLDEN.read_text())
#: real gloo runs cost a few seconds each: the methods whose collectives differ most
REAL_CASES = ("dense", "gtopk-butterfly", "gtopk-tree", "oktopk-exact", "oktopk", "gaussiank")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("label,changes", CASES, ids=[c[0] for c in CASES])
def test_simulated_run_matches_golden(label: str, changes: dict) -> None:
    assert simulated(changes) == EXPECTED[label]["simulated"]


@pytest.fixture(scope="module")
def real_runs() -> dict[str, dict]:
    """Every real case in one 2-rank gloo group (a process start per case cost more than the runs)."""
    return real_many([c for c in CASES if c[0] in REAL_CASES])


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("label", REAL_CASES)
def test_real_gloo_run_matches_golden(label: str, real_runs: dict) -> None:
    assert real_runs[label] == EXPECTED[label]["real"]
