"""benchmarks/reference_gtopk.py without MPI: inputs, the result check, the skip and bad input.

The MPI half needs mpi4py and mpiexec, which the project's venv does not have; a real run's
log is benchmarks/logs/2026-12-01-2core-reference-gtopk.log. Oracles are written here:
a stable sort on (-|x|, index) for the inputs, hand-made vectors for the check.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "reference_gtopk.py"
_spec = importlib.util.spec_from_file_location("reference_gtopk", _PATH)
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


@pytest.mark.timeout(30)
def test_rank_inputs_are_the_stable_topk_and_deterministic() -> None:
    values, indices = ref.rank_inputs(3, 1, 5000, 40)
    x = np.random.default_rng([3, 1]).standard_normal(5000, dtype=np.float32)
    oracle = np.lexsort((np.arange(5000), -np.abs(x)))[:40]  # stable on (-|x|, index)
    assert np.array_equal(indices, oracle) and np.array_equal(values, x[oracle])
    again = ref.rank_inputs(3, 1, 5000, 40)
    assert ref.digest(*again) == ref.digest(values, indices) != ref.digest(*ref.rank_inputs(3, 2, 5000, 40))


@pytest.mark.timeout(30)
def test_compare_tells_equal_ties_and_different() -> None:
    v = np.array([3.0, -1.0, 2.0], dtype=np.float32)
    i = np.array([1, 4, 9])
    assert ref.compare(v, i, v.copy(), i.copy()) == "equal"
    # the k-th magnitude 1.0 is held by index 4 in one result and index 6 in the other
    assert ref.compare(v, i, np.array([3.0, 1.0, 2.0], dtype=np.float32), np.array([1, 6, 9])) == "ties"
    assert ref.compare(v, i, np.array([3.0, 1.5, 2.0], dtype=np.float32), np.array([1, 6, 9])) == "DIFFERENT"
    assert ref.compare(v, i, np.array([3.0, -1.0, 2.5], dtype=np.float32), i) == "DIFFERENT"


@pytest.mark.timeout(60)
def test_skips_without_mpi4py_and_rejects_bad_input(capsys, tmp_path) -> None:
    no_mpi = tmp_path / "python"
    no_mpi.write_text("#!/bin/sh\nexit 1\n")  # an interpreter that cannot import mpi4py
    no_mpi.chmod(0o755)
    assert ref.main(["--mpi-python", str(no_mpi)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("skipped: the reference needs mpi4py and mpiexec") and "pip install numpy mpi4py mpich" in out
    assert ref.main(["--workers", "3"]) == 2
    assert "--workers='3' is invalid" in capsys.readouterr().err
    assert ref.main(["--numel", "lots"]) == 2
    assert "--numel='lots' is invalid" in capsys.readouterr().err
