"""benchmarks/testbed_iterations.py's per-iteration arithmetic (the testbed part runs as root
only, in the benchmark): rank 0's rows, the wall time between iterations less the clock's own
synchronisation against the virtual time between them, and the CPU part stretched by the
testbed's shared cores; oracle: the rows' numbers written out here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("testbed_iterations", ROOT / "benchmarks" / "testbed_iterations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(n: int) -> pd.DataFrame:
    """Rank 0: every iteration 10 ms of wall of which 1 ms is the clock's all_reduce, 6 ms of
    virtual time of which 2 ms is the communication charge; rank 1 with other numbers (ignored),
    plus an eval row."""
    rows = []
    for rank, (wall, clock, virtual, charge) in enumerate(((10e-3, 1e-3, 6e-3, 2e-3), (50e-3, 0.0, 1e-3, 0.0))):
        for i in range(n):
            rows.append({"kind": "iter", "rank": rank, "iteration": i, "wall_time_s": wall * (i + 1) + (i == 0),
                         "virtual_time_s": virtual * (i + 1), "clock_s": clock, "comm_charge_s": charge,
                         "comm_s": 3e-3})
    rows.append({"kind": "eval", "rank": 0, "iteration": n, "wall_time_s": 99.0, "virtual_time_s": 99.0,
                 "clock_s": 0.0, "comm_charge_s": 0.0, "comm_s": 0.0})
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0)


@pytest.mark.timeout(60)
def test_iteration_times_are_rank_zeros_medians_with_the_cpu_part_stretched_by_shared_cores() -> None:
    bench = _bench()
    got = bench.iteration_times(_rows(12), workers=4, cores=2, skip=2)
    assert got["measured_s"] == pytest.approx(9e-3)
    assert got["clock_s"] == pytest.approx(6e-3)
    assert got["cpu_s"] == pytest.approx(4e-3) and got["comm_charge_s"] == pytest.approx(2e-3)
    assert got["shared_s"] == pytest.approx(4e-3 * 2 + 2e-3) and got["contention"] == 2.0
    assert got["iterations"] == 10 and got["comm_s"] == pytest.approx(3e-3)
    alone = bench.iteration_times(_rows(12), workers=2, cores=2, skip=2)
    assert alone["shared_s"] == pytest.approx(alone["clock_s"])
    with pytest.raises(ValueError, match="skip"):
        bench.iteration_times(_rows(12), workers=2, cores=2, skip=11)
    table = bench.table([{"method": "gtopk", "workers": 4, **got}])
    assert "| gtopk | 4 | 9.00 | 3.00 | 4.00 | 2.00 | 6.00 | -33% | 10.00 | +11% |" in table
