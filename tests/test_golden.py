"""Behaviour is preserved: every method reproduces the golden outputs recorded before the
method-registry refactor (tests/golden_runs.py wrote them): final weights bitwise, bytes per
rank and iteration, losses and modelled communication, simulated and on real gloo ranks.
On a CPU whose float kernels differ from the recording machine's, within tolerance."""

from __future__ import annotations

import json
import warnings

import pytest

from golden_runs import CASES, GOLDEN, real_many, simulated

EXPECTED = json.loads(GOLDEN.read_text())
#: real gloo runs cost a few seconds each: the methods whose collectives differ most
REAL_CASES = ("dense", "gtopk-butterfly", "gtopk-tree", "oktopk-exact", "oktopk", "gaussiank")


@pytest.fixture(scope="module")
def dense_simulated() -> dict:
    return simulated(dict(CASES)["dense"])


@pytest.fixture(scope="module")
def same_float_kernels(dense_simulated: dict) -> bool:
    """This machine computes floats as the recording machine did: the dense run's iteration-0
    losses (a forward pass at initialisation, before any compression or communication) agree
    bitwise. MKL and ATen pick their kernels by CPU (AVX2 vs AVX-512 sum in other orders), so
    elsewhere the last bits differ from the first iteration on."""
    first = [row for row in dense_simulated["iters"] if row[1] == 0]
    recorded = [row for row in EXPECTED["dense"]["simulated"]["iters"] if row[1] == 0]
    same = first == recorded
    if not same:
        warnings.warn("golden: this CPU's float kernels differ from the recording machine's "
                      "(iteration-0 losses differ in the last bits); runs compared within tolerance",
                      stacklevel=1)
    return same


def assert_matches(got: dict, want: dict, same_kernels: bool) -> None:
    """Bitwise where the float kernels are the recording machine's; elsewhere the same rows,
    bytes and modelled times within 1% (a tie at a threshold moves a pair), losses within
    1e-5 relative (seen: 2.1e-7 on AVX-512 against the AVX2 record) and no weight hash."""
    if same_kernels:
        assert got == want
        return
    assert (got["k"], got["numel"]) == (want["k"], want["numel"])
    assert [row[:2] for row in got["iters"]] == [row[:2] for row in want["iters"]]
    for g, w in zip(got["iters"], want["iters"]):
        assert g[2:4] == pytest.approx(w[2:4], rel=0.01), (g, w)
        assert float(g[4]) == pytest.approx(float(w[4]), rel=1e-5), (g, w)
        assert float(g[5]) == pytest.approx(float(w[5]), rel=0.01), (g, w)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("label,changes", CASES, ids=[c[0] for c in CASES])
def test_simulated_run_matches_golden(label: str, changes: dict, dense_simulated: dict,
                                      same_float_kernels: bool) -> None:
    got = dense_simulated if label == "dense" else simulated(changes)
    assert_matches(got, EXPECTED[label]["simulated"], same_float_kernels)


@pytest.fixture(scope="module")
def real_runs() -> dict[str, dict]:
    """Every real case in one 2-rank gloo group (a process start per case cost more than the runs)."""
    return real_many([c for c in CASES if c[0] in REAL_CASES])


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("label", REAL_CASES)
def test_real_gloo_run_matches_golden(label: str, real_runs: dict, same_float_kernels: bool) -> None:
    assert_matches(real_runs[label], EXPECTED[label]["real"], same_float_kernels)


@pytest.mark.timeout(30)
def test_tolerant_comparison_still_catches_a_changed_run() -> None:
    """The fallback for other CPUs is not a pass-through: a loss 1e-4 off, a message of
    another size or a missing row fail it."""
    want = EXPECTED["gtopk-tree"]["simulated"]
    assert_matches(json.loads(json.dumps(want)), want, same_kernels=False)
    for mutate in (lambda r: r["iters"][3].__setitem__(4, repr(float(r["iters"][3][4]) * (1 + 1e-4))),
                   lambda r: r["iters"][5].__setitem__(2, r["iters"][5][2] * 2),
                   lambda r: r["iters"].pop()):
        changed = json.loads(json.dumps(want))
        mutate(changed)
        with pytest.raises(AssertionError):
            assert_matches(changed, want, same_kernels=False)
