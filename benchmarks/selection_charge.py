"""What the virtual clock charges each method per iteration for selecting or compressing.

Before 2bf8ef1 / dddfdfb three methods compressed where no charge saw it: CLT-k's leader
ran its top-k inside the collective program, Ok-Topk selects by its thresholds inside its
collective and PowerSGD projects there (both reported as merge CPU, which a calibrated
study replaces by gamma x merged elements and a fixed compute time without gamma drops).
For each method on one workload, side by side in one run:

1. ``calibrated``: the selection a study calibrates (``measure_iteration_times`` at P = 1,
   one torch thread, ``--repeats`` passes; the study charges the lower quartile, shown);
2. ``charged``: a simulated run at P = ``--workers`` with a fixed compute time ``c`` and
   merges off (``virtual_merge_cpu=False``), selection measured: per iteration, virtual
   time minus ``c`` minus the modelled rounds, i.e. what the clock charged for selecting
   and compressing (median over iterations).

Run it at two commits to compare (the script only uses APIs both have)::

    PYTHONPATH=. .venv/bin/python benchmarks/selection_charge.py
    PYTHONPATH=. .venv/bin/python benchmarks/selection_charge.py --model resnet20 --dataset synthetic

Cost: about a minute per workload on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gtopk_lab.bench.selection import cpu_model
from gtopk_lab.config import RunConfig
from gtopk_lab.provenance import git_commit
from gtopk_lab.training.compute_time import measure_iteration_times
from gtopk_lab.training.simulator import simulate

METHODS = ("topk", "gtopk", "clt-k", "oktopk", "powersgd")


def config(args: argparse.Namespace, method: str, workers: int, **extra: float) -> RunConfig:
    return RunConfig(method=method, workers=workers, model=args.model, dataset=args.dataset, batch_size=args.batch_size,
                     train_samples=args.batch_size * max(workers, 1) * (args.iterations + 1), test_samples=32,
                     max_iterations=args.iterations, epochs=10**4, density=args.density, bandwidth="1Gbps",
                     latency="0.1ms", device="cpu", virtual_merge_cpu=False, sink_every=10**6, extra=dict(extra))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn_wide")
    parser.add_argument("--dataset", default="mnist1d")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    c = 0.01  # the fixed compute time of the simulated runs (s); it cancels out
    print(f"# {cpu_model()}, {torch.get_num_threads()} torch thread, commit {(git_commit() or 'unknown')[:7]}; "
          f"{args.model}/{args.dataset}, batch {args.batch_size}, density {args.density}, P = {args.workers}")
    print(f"{'method':10s} {'calibrated ms':>14s} {'(median ms)':>12s} {'charged ms/iter':>16s}  seconds")
    for method in args.methods.split(","):
        t0 = time.perf_counter()
        times = measure_iteration_times(config(args, method, 1), repeats=args.repeats)
        samples = sorted(times["selection_samples_s"])
        quartile = samples[min(len(samples) - 1, int(0.25 * len(samples)))]
        run = simulate(config(args, method, args.workers, compute_time_s=c), rows="rank0")
        rows = [r for r in run.rows if r["kind"] == "iter"]
        times_v = [r["virtual_time_s"] for r in rows]
        steps = [b - a for a, b in zip([0.0] + times_v[:-1], times_v)]
        charged = statistics.median(s - c - r["comm_model_s"] for s, r in zip(steps, rows))
        print(f"{method:10s} {quartile * 1e3:14.3f} {times['selection_time_s'] * 1e3:12.3f} {charged * 1e3:16.3f}"
              f"  {time.perf_counter() - t0:6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
