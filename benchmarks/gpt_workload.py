"""GPT workload benchmark: a byte-level GPT on the offline ``text`` corpus, AdamW.

Trains ``gpt_tiny`` (72,000 parameters, context 64; issue 17's CI size) on the pinned
CPython 3.11 stdlib corpus (553,500 bytes, last 10% validation) and prints one row per
evaluation (every epoch of the full training split, 486 iterations at batch 16, and at
the end): steps, validation loss (nats per byte), bits per byte, the unigram baseline
(entropy of the training split's byte distribution) and wall time.

``--methods dense`` runs as one process (``train_rank``, workers=1, no process group);
sparse methods run P = ``--workers`` virtual ranks in the single-process simulator
(``simulate``), batch ``--batch-size`` per rank, so they see P times the samples per step.

    .venv/bin/python benchmarks/gpt_workload.py                          # dense + gtopk P=4, 2000 steps
    .venv/bin/python benchmarks/gpt_workload.py --methods dense --steps 300
    .venv/bin/python benchmarks/gpt_workload.py --model gpt --steps 200   # default size, slow on CPU
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.training.text_data import bits_per_byte, split_corpus, stdlib_corpus, unigram_entropy_nats


def run_one(args: argparse.Namespace, method: str) -> list[dict]:
    workers = 1 if method == "dense" else args.workers
    cfg = RunConfig(method=method, workers=workers, density=args.density, model=args.model,
                    dataset="text", train_samples=10**9, test_samples=10**9, epochs=10**4,
                    max_iterations=args.steps, batch_size=args.batch_size, lr=args.lr, momentum=0.0,
                    weight_decay=args.weight_decay, device=args.device, seed=args.seed,
                    sink_every=10**6, extra={"optimizer": "adamw"})
    t0 = time.perf_counter()
    if workers == 1:
        from gtopk_lab.training.loop import train_rank

        result = train_rank(cfg)
    else:
        from gtopk_lab.training.simulator import simulate

        result = simulate(cfg, rows="rank0")
    wall = time.perf_counter() - t0
    rows = [r for r in result.rows if r["kind"] == "epoch" and not math.isnan(r["test_loss"])]
    k = "-" if method == "dense" else result.summary["k"]
    return [{"method": method, "P": workers, "k": k, "numel": result.summary["numel"],
             "steps": r["iteration"], "val_loss": r["test_loss"], "wall_s": r["wall_time_s"],
             "total_s": wall} for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt_tiny")
    parser.add_argument("--methods", nargs="+", default=["dense", "gtopk"])
    parser.add_argument("--workers", type=int, default=4, help="P of the sparse (simulated) runs")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: one core)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    train, _ = split_corpus(stdlib_corpus())
    baseline = unigram_entropy_nats(train)
    print(f"model {args.model}, AdamW lr {args.lr}, wd {args.weight_decay}, batch {args.batch_size}/rank, "
          f"{args.threads} thread(s); unigram baseline {baseline:.4f} nats = "
          f"{bits_per_byte(baseline):.4f} bits/byte")
    header = (f"{'method':>7} {'P':>2} {'k':>6} {'steps':>6} {'val loss':>9} {'bits/byte':>9} "
              f"{'unigram':>8} {'wall s':>7}")
    print(header)
    print("-" * len(header))
    for method in args.methods:
        for row in run_one(args, method):
            print(f"{row['method']:>7} {row['P']:>2} {row['k']:>6} {row['steps']:>6} {row['val_loss']:>9.4f} "
                  f"{bits_per_byte(row['val_loss']):>9.4f} {baseline:>8.4f} {row['wall_s']:>7.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
