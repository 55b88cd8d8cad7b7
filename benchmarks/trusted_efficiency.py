"""Issue 15's target, measured: scaling efficiency of the CNN on 10GbE, real and simulated
points, against the study's own alpha-beta prediction, with compute measured or charged.

One study per compute mode on an embedded 2-worker LocalCluster: dense, Top-k and gTop-k at
P = 1, 2 on real Dask-launched ranks and P = 4, 8, 16 simulated on the workers. Modes:

1. ``measured``: every rank's forward/backward is its own CPU time (the default);
2. ``fixed``: every rank, real or virtual, is charged one calibrated compute time, the median
   of a few passes measured once here (``extra["compute_time_s"]``); selection stays measured
   and communication modelled.

Prints, per mode, the efficiency table with the prediction and the largest gap. On 2 cores
the real ranks share the cores with each other and with the Dask workers, and the virtual
clock (one core per rank) is the figure: wall time says nothing about scaling here.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/trusted_efficiency.py [--iterations 24]``
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=24, help="iterations per point")
    parser.add_argument("--modes", default="measured,fixed", help="measured,fixed")
    args = parser.parse_args()
    from gtopk_lab.config import RunConfig
    from gtopk_lab.orchestration import Lab
    from gtopk_lab.training.compute_time import measure_iteration_times

    base = dict(model="cnn", max_iterations=args.iterations, train_samples=1024, test_samples=64,
                batch_size=16, sink_every=8, epochs=50, bandwidth="10GbE")
    compute_s = measure_iteration_times(RunConfig(**base, density=0.01), repeats=5)["compute_time_s"]
    print(f"# CNN on 10GbE, density 0.01, {args.iterations} iterations a point; P = 1, 2 real, 4, 8, 16 "
          f"simulated; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; calibrated compute "
          f"{compute_s * 1e3:.2f} ms")
    with tempfile.TemporaryDirectory() as out, Lab(n_workers=2, out=out, progress=False) as lab:
        for mode in args.modes.split(","):
            extra = {"compute_time_s": compute_s} if mode == "fixed" else {}
            t0 = time.perf_counter()
            study = lab.study(methods=["dense", "topk", "gtopk"], workers=[1, 2, 4, 8, 16], density=0.01,
                              base={**base, "extra": extra}, skip_completed=False)
            study.wait()
            checked = study.check(tolerance=0.10)
            checked["gap_points"] = 100 * (checked["efficiency_mean"] - checked["predicted"])
            table = checked.pivot_table(index="method", columns=["workers", "source"],
                                        values=["efficiency_mean", "gap_points"])
            print(f"\n## compute {mode} ({time.perf_counter() - t0:.0f} s)")
            print("efficiency % (measured):")
            print((100 * table["efficiency_mean"]).round(1).to_string())
            print("measured - predicted, points:")
            print(table["gap_points"].round(1).to_string())
            worst = checked.loc[checked["gap_points"].abs().idxmax()]
            print(f"largest gap {worst.gap_points:+.1f} points ({worst.method} P={worst.workers} "
                  f"{worst.source}); above 100%: {int((checked.efficiency_mean > 1.0 + 1e-9).sum())}; "
                  + "; ".join(study.check_lines()))
    print(f"# load at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
