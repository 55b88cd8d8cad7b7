"""Convergence benchmark: MNIST-1D (4000/1000), 1-D CNN, P=4 -- dense vs Top-k vs gTop-k.

Acceptance: final test accuracy of gTop-k within 1.5 points of dense S-SGD at rho = 0.01
and rho = 0.001, and dense near the published ~94% of this CNN (Greydanus 2020).

Runs in the single-process simulator (4 virtual ranks, same selection / merge / residual
code as real ranks; tests/test_simulator.py shows equal weights to a real gloo run), which
on 2 shared cores is several times faster than 4 real processes.

    .venv/bin/python benchmarks/convergence.py                 # full table (~5-8 min, 2 cores)
    .venv/bin/python benchmarks/convergence.py --epochs 5      # quick look
"""

from __future__ import annotations

import argparse
import time

import torch

from gtopk_lab.training.optim import recipe
from gtopk_lab.training.simulator import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--densities", type=float, nargs="+", default=[0.01, 0.001])
    parser.add_argument("--methods", nargs="+", default=["topk", "gtopk"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    def run(method: str, density: float) -> dict:
        cfg = recipe("cnn-mnist1d", method=method, workers=args.workers, density=density,
                     epochs=args.epochs, seed=args.seed, bandwidth="1GbE",
                     lr_milestones=(int(args.epochs * 0.75),), eval_every_epochs=max(1, args.epochs // 4),
                     density_warmup=None if method == "dense" else (max(0.004, density), 1))
        t0 = time.perf_counter()
        s = simulate(cfg, rows="rank0").summary
        return {"method": method, "density": density if method != "dense" else 1.0,
                "acc": s["final_test_accuracy"], "loss": s["final_test_loss"],
                "iters": s["iterations"], "bytes/iter": s["bytes_sent_per_rank_per_iter"],
                "virtual_s": s["virtual_time_s"], "sim_s": time.perf_counter() - t0}

    results = [run("dense", 1.0)]
    print(f"dense: {results[0]}", flush=True)
    for density in args.densities:
        for method in args.methods:
            results.append(run(method, density))
            print(f"{method} rho={density}: {results[-1]}", flush=True)
    dense_acc = results[0]["acc"]
    print()
    print(f"MNIST-1D 4000/1000, CNN, P={args.workers}, batch 32/worker, {args.epochs} epochs, "
          f"seed {args.seed} (simulator)")
    print("| method | density | test acc | delta vs dense (points) | bytes sent/rank/iter | "
          "virtual time (s, 1GbE) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['method']} | {r['density']:g} | {100 * r['acc']:.1f}% | "
              f"{100 * (r['acc'] - dense_acc):+.1f} | {r['bytes/iter']:.0f} | {r['virtual_s']:.1f} |")


if __name__ == "__main__":
    main()
