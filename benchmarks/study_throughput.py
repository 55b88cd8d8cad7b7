"""Points per minute of a study on this machine, real vs simulated, and the live figure's
refresh cost.

    python benchmarks/study_throughput.py [--n-workers 2] [--points 8] [--iterations 12]

1. a study of ``--points`` real points (P = 1 and 2, alternating methods) on an embedded
   LocalCluster of ``--n-workers`` workers, timed from ``Lab.study`` to ``wait``
2. the same number of simulated points (P = 4, 8) as Dask tasks on the same workers
3. the refresh cost: building ``scaling_study_figure(study.points())`` (what every live
   refresh does), median of 20 builds, for the finished study's points

Prints one table. The cluster start is excluded (it is paid once per Lab).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from gtopk_lab.orchestration import Lab
from gtopk_lab.plotting.live_study import scaling_study_figure

BASE = dict(model="cnn", dataset="mnist1d", train_samples=1024, test_samples=64, batch_size=16,
            bandwidth="1GbE", density=0.05, epochs=20, sink_every=4)


def _timed_study(lab: Lab, workers: list[int], n_points: int, iterations: int, simulate: bool) -> tuple[float, int, object]:
    seeds = max(1, n_points // (2 * len(workers)))
    t0 = time.perf_counter()
    study = lab.study(methods=["topk", "gtopk"], workers=workers, seeds=seeds, simulate=simulate,
                      base={**BASE, "max_iterations": iterations}, skip_completed=False)
    study.wait()
    return time.perf_counter() - t0, len(study.points_list), study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-workers", type=int, default=2)
    parser.add_argument("--points", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out, Lab(n_workers=args.n_workers, out=out, progress=False) as lab:
        real_s, real_n, _ = _timed_study(lab, [1, 2], args.points, args.iterations, simulate=False)
        sim_s, sim_n, study = _timed_study(lab, [4, 8], args.points, args.iterations, simulate=True)
        points = study.points()
        builds = []
        for _ in range(20):
            t0 = time.perf_counter()
            scaling_study_figure(points)
            builds.append(time.perf_counter() - t0)
    print(f"machine: {os.cpu_count()} cores, {args.n_workers} Dask workers, {args.iterations} iterations "
          f"per point (CNN, MNIST-1D)")
    print(f"{'points':<28}{'runs':>6}{'seconds':>10}{'points/min':>12}")
    print(f"{'real (P = 1, 2)':<28}{real_n:>6}{real_s:>10.1f}{60 * real_n / real_s:>12.1f}")
    print(f"{'simulated (P = 4, 8)':<28}{sim_n:>6}{sim_s:>10.1f}{60 * sim_n / sim_s:>12.1f}")
    print(f"live refresh (figure of {len(points)} points): {statistics.median(builds) * 1e3:.1f} ms median of 20")


if __name__ == "__main__":
    main()
