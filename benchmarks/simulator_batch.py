"""The simulator's cost per virtual rank, sequential vs batched ranks, side by side in one run.

    python benchmarks/simulator_batch.py --workers 1,8,64,256 --iterations 20

For each P: the same simulated run (``gtopk-lab run --simulate`` defaults of issue 29: gTop-k,
density 0.01, the MNIST-1D CNN, 16 samples per rank) with ``simulator.batched`` off and on.
Cost per iteration = the simulator's wall time between the end of the warm-up iteration and
the last one (rank 0's cumulative ``wall_time_s``), so the first iteration's one-time work
(kernel compilation, caches) is left out; per virtual rank = that / P; ratio = per virtual
rank / one P = 1 iteration of the sequential path (issue 29's target: <= 0.15 at P = 64, batched). One
torch thread, as a rank has. Prints the CPU model, the load average and the commit.

On a shared machine wall time follows the other jobs' load; the last two columns give the same
ratio in CPU seconds of this process (``time.process_time`` stamped once per iteration by the
row sink), which the load changes far less.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.counts import split_list
from gtopk_lab.training.simulator import simulate


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def iteration_s(workers: int, batched: str, args: argparse.Namespace) -> tuple[float, float]:
    """Steady (wall, CPU) seconds per iteration of one simulated run (see the module docstring)."""
    per_epoch = args.iterations + 1
    config = RunConfig(method=args.method, density=args.density, model=args.model, dataset=args.dataset,
                       batch_size=args.batch_size, workers=workers, max_iterations=args.iterations + 1,
                       train_samples=workers * args.batch_size * per_epoch, test_samples=100, epochs=10,
                       eval_every_epochs=10, sink_every=1, simulator={"batched": batched, "rows": "rank0"})
    cpu_stamps: list[float] = []
    rows = [r for r in simulate(config, sink=lambda _: cpu_stamps.append(time.process_time())).rows
            if r["kind"] == "iter" and r["rank"] == 0]
    rows.sort(key=lambda r: r["iteration"])
    # one stamp per iteration's row (rank 0's only); the epoch row's flush comes after the last
    cpu = cpu_stamps[:len(rows)]
    return ((rows[-1]["wall_time_s"] - rows[0]["wall_time_s"]) / (len(rows) - 1),
            (cpu[-1] - cpu[0]) / (len(cpu) - 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,8,64,256", help="P values, e.g. 1,8,64,256")
    parser.add_argument("--iterations", type=int, default=20, help="timed iterations per run (after one warm-up)")
    parser.add_argument("--method", default="gtopk")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--dataset", default="mnist1d")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    try:
        workers = [int(w) for w in split_list(args.workers)]
    except ValueError:
        print(f"--workers={args.workers!r} is invalid: expected integers, e.g. 1,8,64", file=sys.stderr)
        return 2
    if args.iterations < 1 or any(w < 1 for w in workers):
        print("--iterations and --workers must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    print(f"# {cpu_model()}, commit {commit()}, load average {os.getloadavg()[0]:.2f} at start")
    print(f"# {args.method}, density {args.density}, {args.model} on {args.dataset}, batch {args.batch_size}, "
          f"{args.iterations} timed iterations")
    one: dict[str, float] = {}
    one_cpu = 0.0
    print("| P | sequential ms/iter | batched ms/iter | sequential ms/rank | batched ms/rank "
          "| sequential ratio | batched ratio | speed-up | sequential CPU ms/iter | batched CPU ms/iter "
          "| batched CPU ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in sorted(set(workers) | {1}):
        measured = {mode: iteration_s(p, mode, args) for mode in ("off", "on")}
        times = {m: t[0] for m, t in measured.items()}
        if p == 1:
            one, one_cpu = dict(times), measured["off"][1]
        if p not in workers:
            continue
        per_rank = {m: t / p for m, t in times.items()}
        cpu_off, cpu_on = measured["off"][1], measured["on"][1]
        print(f"| {p} | {times['off'] * 1e3:.2f} | {times['on'] * 1e3:.2f} | {per_rank['off'] * 1e3:.3f} "
              f"| {per_rank['on'] * 1e3:.3f} | {per_rank['off'] / one['off']:.3f} | {per_rank['on'] / one['off']:.3f} "
              f"| {times['off'] / times['on']:.2f}x | {cpu_off * 1e3:.2f} | {cpu_on * 1e3:.2f} | {cpu_on / p / one_cpu:.3f} |", flush=True)
    print(f"# ratio: per-rank cost / one sequential P = 1 iteration (CPU ratio: in CPU seconds); "
          f"load average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
