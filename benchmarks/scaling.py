"""Scaling-efficiency benchmark: ResNet-20 and VGG-16 on synthetic CIFAR-shaped data, 1GbE.

Virtual-time scaling efficiency throughput(P) / (P * throughput(1)) at P = 4, 8, 16, 32 for
dense S-SGD, Top-k S-SGD and gTop-k S-SGD (rho = 0.001), computed by the single-process
simulator (P virtual ranks, real forward/backward and selection per rank on this CPU, the
real collective programs, the paper's fitted 1GbE alpha/beta). The P=1 baseline is dense.
Compare with the paper's 32-worker figures (docs background, section 3).

    .venv/bin/python benchmarks/scaling.py                                 # both models
    .venv/bin/python benchmarks/scaling.py --models resnet20 --iterations 3
"""

from __future__ import annotations

import argparse
import time

import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.training.scaling import scaling_table
from gtopk_lab.training.simulator import simulate

PAPER_32 = {("vgg16", "dense"): 0.96, ("vgg16", "topk"): 4.78, ("vgg16", "gtopk"): 9.35,
            ("resnet20", "dense"): 31.3, ("resnet20", "topk"): 75.6, ("resnet20", "gtopk"): 85.7}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet20", "vgg16"])
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--methods", nargs="+", default=["dense", "topk", "gtopk"])
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--bandwidth", default="1GbE")
    parser.add_argument("--density", type=float, default=0.001)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per virtual rank, as the virtual clock assumes
    runs = []
    for model in args.models:
        for method, p in [("dense", 1)] + [(m, p) for m in args.methods for p in args.workers]:
            cfg = RunConfig(method=method, workers=p, model=model, dataset="synthetic", batch_size=32,
                            train_samples=32 * p, test_samples=32, epochs=args.iterations,
                            max_iterations=args.iterations, density=args.density, lr=0.1,
                            bandwidth=args.bandwidth, device="cpu")
            t0 = time.perf_counter()
            result = simulate(cfg, rows="rank0")
            s = result.summary
            runs.append(s)
            tb = s["time_breakdown_s"]
            print(f"{model} {method} P={p}: {s['samples_per_s_virtual']:.1f} samples/s virtual, "
                  f"compute {tb['compute']:.3f} s, selection {tb['selection']:.4f} s, "
                  f"comm(model) {tb['communication_model']:.4f} s, "
                  f"{s['bytes_sent_per_rank_per_iter'] / 1e6:.3f} MB sent/rank/iter "
                  f"(simulated in {time.perf_counter() - t0:.0f} s)", flush=True)
    table = scaling_table(runs)
    print()
    print(f"Scaling efficiency (%), virtual time, {args.bandwidth}, rho={args.density}, batch 32/worker")
    print(table.round(2).to_string())
    print()
    print("| model | method | ours P=32 | paper P=32 |")
    print("|---|---|---|---|")
    for (model, method), paper in PAPER_32.items():
        key = (model, method) if table.index.nlevels == 2 else method
        ours = table.loc[key, 32] if 32 in table.columns and key in table.index else float("nan")
        if model in args.models:
            print(f"| {model} | {method} | {ours:.2f}% | {paper}% |")


if __name__ == "__main__":
    main()
