"""Every method of the registry's modern family against dense, Top-k and gTop-k, one table.

notebooks/05_modern_methods.ipynb at a size that runs in about three minutes on two cores,
without Dask: each (workload, method, P) is one in-process simulator run
(:func:`gtopk_lab.training.simulator.simulate`, P virtual ranks, every rank's rows), recorded
on ``--record`` (1GbE) and priced on every ``--networks`` entry from the same rows
(:mod:`gtopk_lab.analysis.reprice`). Virtual compute is one fixed charge per iteration and
workload (forward + backward + optimiser step of one rank's batch, the median of 9 passes
measured once, ``measure_iteration_times``) plus each iteration's measured selection
(median over ranks), so efficiencies differ by what a method selects and sends only.

1. per workload, dense at P = 1 (the efficiency baseline) and every method at each P, same
   seed, same iteration budget, AdamW at one learning rate for all
2. the target training loss: 5% above the worst final loss of dense at P > 1
3. per network: time to the target on the virtual clock, bytes per rank per iteration,
   final validation loss, scaling efficiency (dense P = 1 = 100%)
4. SparseLoCo against SparseLoCo over gTop-k, seeds 0 .. ``--seeds``-1, same budget: both
   final losses and bytes per rank per iteration

    .venv/bin/python benchmarks/modern_methods.py                    # ~3 min on 2 cores
    .venv/bin/python benchmarks/modern_methods.py --gpt-iterations 40 --mnist-iterations 60  # quick look
"""

from __future__ import annotations

import argparse
import statistics
import time

import pandas as pd
import torch

from gtopk_lab.analysis.reprice import auto_target_loss, method_comparison
from gtopk_lab.config import RunConfig
from gtopk_lab.training.compute_time import measure_iteration_times
from gtopk_lab.training.simulator import simulate

METHODS = ("dense", "topk", "gtopk", "clt-k", "ef21", "ef21-sgdm", "powersgd", "diloco", "sparseloco",
           "sparseloco-gtopk")


def workloads(args: argparse.Namespace) -> dict[str, dict]:
    """RunConfig fields of each workload (issue 17: a small GPT on offline text, MNIST-1D)."""
    return {
        "gpt": dict(model=args.gpt_model, dataset="text", max_iterations=args.gpt_iterations, batch_size=8,
                    train_samples=10**9, test_samples=256, workers_list=args.gpt_workers),
        "mnist1d": dict(model="mlp", dataset="mnist1d", max_iterations=args.mnist_iterations, batch_size=32,
                        train_samples=4000, test_samples=1000, workers_list=args.mnist_workers),
    }


def config_for(spec: dict, method: str, workers: int, seed: int, args: argparse.Namespace) -> RunConfig:
    fields = {k: v for k, v in spec.items() if k not in ("workers_list", "compute_time_s")}
    return RunConfig(method=method, workers=workers, density=args.density, epochs=10**4, lr=args.lr,
                     momentum=0.0, weight_decay=0.0, bandwidth=args.record, seed=seed, sink_every=10**6,
                     extra={"optimizer": "adamw", "sync_every": args.sync_every}, **fields)


def run(spec: dict, method: str, workers: int, seed: int, args: argparse.Namespace) -> tuple[pd.DataFrame, dict]:
    config = config_for(spec, method, workers, seed, args)
    run_id = f"{spec['dataset']}-{method}-p{workers}-s{seed}"
    result = simulate(config, rows="all", compute_time_s=spec["compute_time_s"])
    return pd.DataFrame(result.rows).assign(run_id=run_id), {**result.summary, "run_id": run_id, "seed": seed,
                                                            "source": "simulated", "status": "completed"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt-model", default="gpt_tiny")
    parser.add_argument("--gpt-iterations", type=int, default=96)
    parser.add_argument("--gpt-workers", type=int, nargs="+", default=[4])
    parser.add_argument("--mnist-iterations", type=int, default=200)
    parser.add_argument("--mnist-workers", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--sync-every", type=int, default=8, help="H of DiLoCo / SparseLoCo")
    parser.add_argument("--record", default="1GbE", help="the network the runs are recorded on")
    parser.add_argument("--networks", nargs="+", default=["1GbE", "10GbE"])
    parser.add_argument("--seeds", type=int, default=2, help="seeds of the SparseLoCo comparison")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    pd.set_option("display.width", 200)
    print(f"density {args.density}, AdamW lr {args.lr}, H = {args.sync_every}, recorded on {args.record}, "
          f"priced on {', '.join(args.networks)}; simulator, fixed compute per workload")
    pair: dict[tuple[str, str], list[dict]] = {}
    for name, spec in workloads(args).items():
        # one fixed compute charge per workload, so efficiencies differ only by what each
        # method communicates and selects (the measured charge wanders 3-5x on a loaded box)
        spec["compute_time_s"] = measure_iteration_times(config_for(spec, "dense", 1, 0, args),
                                                         repeats=9)["compute_time_s"]
        frames, summaries = [], []
        for method, workers in [("dense", 1)] + [(m, p) for p in spec["workers_list"] for m in METHODS]:
            rows, summary = run(spec, method, workers, 0, args)
            frames.append(rows)
            summaries.append(summary)
        metrics, table_in = pd.concat(frames, ignore_index=True), pd.DataFrame(summaries)
        target = auto_target_loss(metrics, table_in)
        table = method_comparison(table_in, metrics, args.networks, target)
        table = table[table["workers"] > 1]
        print(f"\n{name}: {spec['model']}, {spec['max_iterations']} iterations, batch {spec['batch_size']}/rank, "
              f"d = {int(table_in['numel'].iloc[0])}, compute {1e3 * spec['compute_time_s']:.2f} ms/iteration; "
              f"target training loss {target:.4f}")
        shown = table.assign(time_to_target_s=table["time_to_target_s"].map(
            lambda t: "not reached" if pd.isna(t) else f"{t:.3f}"))
        print(shown[["network", "method", "workers", "time_to_target_s", "bytes_per_rank_per_iter", "final_loss",
                     "efficiency"]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        largest = max(spec["workers_list"])
        for seed in range(args.seeds):
            for method in ("sparseloco", "sparseloco-gtopk"):
                done = [s for s in summaries if s["method"] == method and s["workers"] == largest and s["seed"] == seed]
                summary = done[0] if done else run(spec, method, largest, seed, args)[1]
                pair.setdefault((name, method), []).append(summary)
    print(f"\nSparseLoCo vs SparseLoCo over gTop-k: same seeds (0..{args.seeds - 1}), same budget, largest P")
    print(f"{'workload':>9} {'method':>17} {'P':>3} {'final val loss (per seed)':>30} {'mean':>7} "
          f"{'bytes/rank/iter':>15}")
    for (name, method), runs in pair.items():
        losses = [s["final_test_loss"] for s in runs]
        sent = statistics.mean(s["bytes_sent_per_rank_per_iter"] for s in runs)
        print(f"{name:>9} {method:>17} {runs[0]['workers']:>3} {' '.join(f'{v:.4f}' for v in losses):>30} "
              f"{statistics.mean(losses):>7.4f} {sent:>15.1f}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
