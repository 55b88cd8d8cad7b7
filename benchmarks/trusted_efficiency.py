"""Issue 27's efficiency target, measured: the study grid of ``gtopk-lab study --methods
dense,topk,gtopk --density 0.01 --model cnn --max-iterations 60 --workers 1,2,4,8,16
--n-workers 4`` on 10GbE and on 1GbE, several runs in a row, against the study's own
alpha-beta(-gamma) prediction.

Each run is a fresh results folder (so a fresh calibration) and a fresh embedded 4-worker
LocalCluster: dense, Top-k and gTop-k at P = 1, 2, 4 on real Dask-launched ranks and P = 8,
16 simulated on the workers. Compute modes (``Lab.study(compute=...)``):

1. ``calibrated`` (the default of ``Lab.study`` and ``gtopk-lab study``): every rank, real
   or simulated, charged its workload's compute, merge gamma and (since 2026-12-07) each
   sparse method's selection, measured once on a worker
   (:mod:`gtopk_lab.orchestration.calibration`); communication modelled;
2. ``measured``: every rank's own CPU time (what the study did before issue 27).

Prints one line per run: the load, the calibrated compute, the points flagged "do not trust",
the largest gap (measured - predicted, points), then the efficiency table of the last run.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/trusted_efficiency.py [--runs 3]
[--bandwidths 10GbE,1GbE] [--modes calibrated,measured]``
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per link and mode (default 3)")
    parser.add_argument("--bandwidths", default="10GbE,1GbE", help="links (default 10GbE,1GbE)")
    parser.add_argument("--modes", default="calibrated", help="calibrated and/or measured")
    parser.add_argument("--iterations", type=int, default=60, help="iterations a point (default 60)")
    args = parser.parse_args()
    from gtopk_lab.orchestration import Lab

    base = {"model": "cnn", "max_iterations": args.iterations}
    print(f"# CNN (MNIST-1D), density 0.01, {args.iterations} iterations a point; P = 1, 2, 4 real, "
          f"8, 16 simulated; {os.cpu_count()} cores")
    last = None
    for mode in args.modes.split(","):
        for bandwidth in args.bandwidths.split(","):
            for run in range(1, args.runs + 1):
                load = os.getloadavg()[0]
                t0 = time.perf_counter()
                with tempfile.TemporaryDirectory() as out, Lab(n_workers=4, out=out, progress=False) as lab:
                    study = lab.study(methods=["dense", "topk", "gtopk"], workers=[1, 2, 4, 8, 16], density=0.01,
                                      bandwidth=bandwidth, base=base, compute=mode, skip_completed=False)
                    study.wait()
                    checked = study.check(tolerance=0.10)
                    compute = {p.config.compute_charge.compute_time_s for p in study.points_list}
                checked["gap_points"] = 100 * (checked["efficiency_mean"] - checked["predicted"])
                flagged = int((~checked["trusted"].fillna(False).astype(bool)).sum())
                worst = checked.loc[checked["gap_points"].abs().idxmax()]
                shown = ", ".join(f"{c * 1e3:.2f} ms" for c in compute if c) or "measured"
                print(f"{mode:10s} {bandwidth:6s} run {run}: load {load:4.1f}, compute {shown}, "
                      f"{flagged} of {len(checked)} flagged, largest gap {worst.gap_points:+.1f} points "
                      f"({worst.method} P={worst.workers} {worst.source}), {time.perf_counter() - t0:.0f} s")
                last = checked
    if last is not None:
        table = last.pivot_table(index="method", columns=["workers", "source"], values="efficiency_mean")
        print("\nlast run, efficiency %:")
        print((100 * table).round(1).to_string())
    print(f"# load at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
