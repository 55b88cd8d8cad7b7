"""Time to accuracy at an equal budget: why gTop-k needs more epochs than dense on MNIST-1D.

Issue 16 item 6. One fixed grid of recipes (no tuning loop): MNIST-1D 4000/1000, the
``cnn`` model (d = 5,210), P = 2, rho = 0.01 (k = 52), 40 epochs of the ``cnn-mnist1d``
recipe (lr 0.05, momentum 0.9, batch 32 per worker, 1-epoch LR warm-up, x0.1 at 75%),
evaluated every epoch. Each row changes one thing against ``reference-warmup``:

1. ``dense``: the baseline;
2. ``reference-warmup``: gTop-k (butterfly, mass residual rule) with the seed paper's
   density warm-up, 0.004 in epoch 1 (the recipe's default until 2026-12-01; a density
   *lower* than 0.01: the reference's warm-up is for rho = 0.001);
3. ``no-density-warmup``: rho = 0.01 from the first iteration;
4. ``paper rule``: the paper's residual rule (residual = what this rank did not
   contribute, Shi et al. Alg. 1) instead of the mass-conserving rule;
5. ``tree``: the paper's tree merge instead of the butterfly;
6. ``DGC momentum correction``: momentum accumulated before selection (Lin et al.);
7. ``recipe``: the recipe as it is now, rho = 0.05 for the first 10 epochs (the "larger k
   early" remedy of the literature), then rho;
8. ``no momentum``: momentum 0 (is momentum on the sparse G/P the problem?);
9. ``lr x2``: lr 0.1 (too few updates per parameter: a larger step instead).

Reported per run: final test accuracy, the first evaluation at or above 90% (iterations
and virtual seconds on 1GbE: the virtual clock of the run, compute = measured CPU time of
the simulator's ranks), and updates/param = iterations * k / d. Runs in the single-process
simulator (P = 2 virtual ranks; equal weights to real gloo ranks, tests/test_simulator.py).

    .venv/bin/python benchmarks/time_to_accuracy.py                 # the grid (~5 min, 2 cores)
    .venv/bin/python benchmarks/time_to_accuracy.py --epochs 5      # quick look
    .venv/bin/python benchmarks/time_to_accuracy.py --rows dense,default,tree
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import torch

from gtopk_lab.training.optim import recipe
from gtopk_lab.training.simulator import simulate

TARGET_ACCURACY = 0.90

#: row name -> overrides of the shared recipe (method gtopk unless said)
GRID: dict[str, dict[str, Any]] = {
    "dense": {"method": "dense", "density_warmup": None},
    "reference-warmup": {"density_warmup": (0.004, 1)},
    "no-density-warmup": {"density_warmup": None},
    "paper-rule": {"residual_rule": "paper", "density_warmup": (0.004, 1)},
    "tree": {"algorithm": "tree", "density_warmup": (0.004, 1)},
    "dgc-momentum-correction": {"momentum_correction": True, "density_warmup": (0.004, 1)},
    "recipe": {},
    "no-momentum": {"momentum": 0.0, "density_warmup": (0.004, 1)},
    "lr-x2": {"lr": 0.1, "density_warmup": (0.004, 1)},
}


def run_row(name: str, epochs: int, workers: int, density: float, seed: int) -> dict[str, Any]:
    overrides = {"method": "gtopk", **GRID[name]}
    cfg = recipe("cnn-mnist1d", workers=workers, density=density, epochs=epochs, seed=seed,
                 bandwidth="1GbE", lr_milestones=(int(epochs * 0.75),), eval_every_epochs=1,
                 **overrides)
    t0 = time.perf_counter()
    result = simulate(cfg, rows="rank0")
    s = result.summary
    evals = [r for r in result.rows if r["kind"] == "epoch" and not math.isnan(r["test_accuracy"])]
    hit = next((r for r in evals if r["test_accuracy"] >= TARGET_ACCURACY), None)
    return {"row": name, "acc": s["final_test_accuracy"], "best": max(r["test_accuracy"] for r in evals),
            "iters": s["iterations"], "hit_iter": hit["iteration"] if hit else None,
            "hit_virtual_s": hit["virtual_time_s"] if hit else None,
            "hit_epoch": hit["epoch"] if hit else None, "virtual_s": s["virtual_time_s"],
            "updates_per_param": s["iterations"] * s["k"] / s["numel"] if cfg.method != "dense" else float("nan"),
            "train_loss": s["final_train_loss"], "sim_s": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", default=",".join(GRID), help=f"comma-separated, of {', '.join(GRID)}")
    args = parser.parse_args()
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in GRID]
    if unknown:
        parser.error(f"--rows: unknown {', '.join(unknown)}; expected some of {', '.join(GRID)}")
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    results = []
    for name in rows:
        r = run_row(name, args.epochs, args.workers, args.density, args.seed)
        results.append(r)
        print(f"{name}: acc {100 * r['acc']:.1f}% ({r['sim_s']:.0f} s)", flush=True)
    print()
    print(f"MNIST-1D 4000/1000, cnn, P={args.workers}, rho={args.density:g}, {args.epochs} epochs, seed "
          f"{args.seed} (simulator, 1GbE virtual clock); target {TARGET_ACCURACY:.0%} test accuracy")
    print("| recipe | final acc | best acc | epoch at 90% | iterations to 90% | virtual s to 90% | "
          "updates/param | final train loss |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        hit = (f"{r['hit_epoch']} | {r['hit_iter']} | {r['hit_virtual_s']:.2f}" if r["hit_iter"] is not None
               else "not reached | - | -")
        upp = "-" if math.isnan(r["updates_per_param"]) else f"{r['updates_per_param']:.0f}"
        print(f"| {r['row']} | {100 * r['acc']:.1f}% | {100 * r['best']:.1f}% | {hit} | {upp} | "
              f"{r['train_loss']:.3f} |")
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
