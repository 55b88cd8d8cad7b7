"""The simulator's cost per virtual rank, sequential vs batched ranks, side by side in one run.

    python benchmarks/simulator_batch.py --workers 1,8,64,256 --iterations 20 --rounds 3

For each P: the same simulated run (``gtopk-lab run --simulate`` defaults of issue 29: gTop-k,
density 0.01, the MNIST-1D CNN, 16 samples per rank) with ``simulator.batched`` off and on.
Cost per iteration = the simulator's wall time between the end of the warm-up iteration and
the last one (rank 0's cumulative ``wall_time_s``), so the first iteration's one-time work
(kernel compilation, caches) is left out; per virtual rank = that / P; ratio = per virtual
rank / one P = 1 iteration of the sequential path (issue 29's target: <= 0.15 at P = 64, batched). One
torch thread, as a rank has. Prints the CPU model, the load average and the commit.

The VM this runs on changes speed by 20-40% within minutes, and a P = 1 iteration is ~2 ms,
so a ratio whose two terms are timed minutes apart, or whose baseline is 20 iterations (40 ms)
long, moves as much as the code does (0.13-0.20 for one commit, 2026-12-07). So the runs go in
rounds: each round times its own P = 1 baseline (``--base-iterations``, default 200: about half
a second) right before its P runs, every ratio is taken within its round, and the table gives
each column's median over the rounds and the batched ratio's range.

On a shared machine wall time follows the other jobs' load; the CPU columns give the same
ratio in CPU seconds of this process (``time.process_time`` stamped once per iteration by the
row sink), which the load changes far less.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from statistics import median

import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.counts import split_list
from gtopk_lab.provenance import cpu_model, short_commit
from gtopk_lab.training.simulator import simulate


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
    parser.add_argument("--base-iterations", type=int, default=200,
                        help="timed iterations of each round's P = 1 sequential baseline")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each with its own P = 1 baseline")
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
    if min(args.iterations, args.base_iterations, args.rounds) < 1 or any(w < 1 for w in workers):
        print("--iterations, --base-iterations, --rounds and --workers must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    print(f"# {cpu_model()}, commit {short_commit()}, load average {os.getloadavg()[0]:.2f} at start")
    print(f"# {args.method}, density {args.density}, {args.model} on {args.dataset}, batch {args.batch_size}, "
          f"{args.iterations} timed iterations ({args.base_iterations} for each round's P = 1 baseline), "
          f"{args.rounds} rounds; each column: the median over the rounds")
    base_args = argparse.Namespace(**{**vars(args), "iterations": args.base_iterations})
    # per P, per round: (seq wall, batched wall, baseline wall, seq CPU, batched CPU, baseline CPU)
    rounds: dict[int, list[tuple[float, ...]]] = {p: [] for p in workers}
    for r in range(args.rounds):
        base_wall, base_cpu = iteration_s(1, "off", base_args)
        print(f"# round {r + 1}: P = 1 sequential baseline {base_wall * 1e3:.3f} ms "
              f"(CPU {base_cpu * 1e3:.3f}), load {os.getloadavg()[0]:.2f}", flush=True)
        for p in workers:
            off, on = iteration_s(p, "off", args), iteration_s(p, "on", args)
            rounds[p].append((off[0], on[0], base_wall, off[1], on[1], base_cpu))
    print("| P | sequential ms/iter | batched ms/iter | sequential ms/rank | batched ms/rank "
          "| sequential ratio | batched ratio | batched ratio range | speed-up | sequential CPU ms/iter "
          "| batched CPU ms/iter | batched CPU ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in workers:
        rows = rounds[p]
        med = [median([row[i] for row in rows]) for i in range(6)]
        ratio_on = [on / p / base for _, on, base, *_ in rows]
        ratio_off = [off / p / base for off, _, base, *_ in rows]
        cpu_ratio = [on_cpu / p / base_cpu for *_, on_cpu, base_cpu in rows]
        print(f"| {p} | {med[0] * 1e3:.2f} | {med[1] * 1e3:.2f} | {med[0] / p * 1e3:.3f} | {med[1] / p * 1e3:.3f} "
              f"| {median(ratio_off):.3f} | {median(ratio_on):.3f} | {min(ratio_on):.3f}-{max(ratio_on):.3f} "
              f"| {median([off / on for off, on, *_ in rows]):.2f}x | {med[3] * 1e3:.2f} | {med[4] * 1e3:.2f} "
              f"| {median(cpu_ratio):.3f} |", flush=True)
    print(f"# ratio: per-rank cost / one sequential P = 1 iteration of the same round (CPU ratio: in CPU "
          f"seconds); load average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
