"""Cost of the client-side plotting: one live refresh, and one HTML report.

    .venv/bin/python benchmarks/plotting.py [--repeats 3]

1. Live refresh (gtopk_lab.plotting.live): what a ``LiveFigure`` does per batch of rows --
   rebuild the convergence figure from all rows so far and copy it into a
   ``go.FigureWidget`` inside one ``batch_update`` -- for 4 runs x P=4 ranks at growing
   iteration counts. This runs on the Lab's monitor thread, at most every
   ``min_interval_s`` (0.5 s by default), so it must stay well below that.
2. Report (gtopk_lab.plotting.report.write_report): a results folder of 12 runs (dense / topk /
   gtopk x P in {1, 2, 4, 8}) written through the results store.

Rows are synthetic but in the exact schema of docs/architecture.md; the figures do not
depend on the values. Prints one table per part (medians over repeats).
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration.results import rows_to_frame, run_summary, write_run
from gtopk_lab.plotting import figures
from gtopk_lab.plotting.live import _copy_into
from gtopk_lab.plotting.report import write_report


def run_rows(method: str, workers: int, iterations: int, density: float = 0.01, numel: int = 100_000,
             iters_per_epoch: int = 100, seed: int = 0) -> tuple[list[dict], dict]:
    rng = np.random.default_rng(seed)
    k = max(1, int(math.floor(density * numel)))
    sent = figures.comm_bytes_per_rank_formula(method, workers, numel, k)
    rows: list[dict] = []
    t = 0.0
    for it in range(iterations):
        t += 0.01
        loss = 2.3 * math.exp(-it / 300)
        for rank in range(workers):
            rows.append({"kind": "iter", "rank": rank, "iteration": it, "epoch": it / iters_per_epoch,
                         "method": method, "workers": workers, "density": density, "k": k,
                         "train_loss": loss + 0.05 * rng.random(), "lr": 0.05, "compute_s": 0.006,
                         "selection_s": 0.001, "comm_s": 0.002, "update_s": 0.001, "comm_model_s": sent * 8e-9,
                         "bytes_sent": int(sent), "bytes_recv": int(sent), "wall_time_s": t,
                         "virtual_time_s": t + it * sent * 8e-9})
        if (it + 1) % iters_per_epoch == 0:
            rows.append({"kind": "epoch", "rank": 0, "iteration": it, "epoch": (it + 1) / iters_per_epoch,
                         "method": method, "workers": workers, "density": density, "k": k, "train_loss": loss,
                         "test_loss": loss, "test_accuracy": 0.9 - 0.5 * math.exp(-it / 300),
                         "test_perplexity": float("nan"), "wall_time_s": t, "virtual_time_s": t})
    virt = rows[-1]["virtual_time_s"]
    summary = {"method": method, "workers": workers, "density": density, "k": k, "numel": numel,
               "bandwidth_bps": 1e9, "latency_s": 1e-4, "iterations": iterations,
               "final_train_loss": rows[-1]["train_loss"], "final_test_accuracy": 0.9,
               "wall_time_s": t, "virtual_time_s": virt, "samples_per_s_wall": 32 * workers * iterations / t,
               "samples_per_s_virtual": 32 * workers * iterations / virt, "bytes_sent_per_rank_per_iter": sent,
               "time_breakdown_s": {"compute": 0.006, "selection": 0.001, "communication": 0.002,
                                    "update": 0.001}}
    return rows, summary


def bench_live(repeats: int) -> None:
    print("live refresh: 4 runs x P=4, rebuild + copy into a FigureWidget (batch_update)")
    print(f"{'iterations/run':>15} {'rows':>8} {'build ms':>10} {'copy ms':>9} {'total ms':>9}")
    for iterations in (100, 1000, 5000):
        frames = []
        for i, method in enumerate(("dense", "topk", "gtopk", "gaussiank")):
            rows, _ = run_rows(method, 4, iterations, seed=i)
            frames.append(pd.DataFrame(rows).assign(run_id=f"{method}-run"))
        metrics = pd.concat(frames, ignore_index=True)
        widget = go.FigureWidget(figures.convergence_figure(metrics.iloc[: len(metrics) // 2]))
        build, copy = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fig = figures.convergence_figure(metrics)
            t1 = time.perf_counter()
            _copy_into(widget, fig)
            t2 = time.perf_counter()
            build.append(t1 - t0)
            copy.append(t2 - t1)
        b, c = statistics.median(build) * 1e3, statistics.median(copy) * 1e3
        print(f"{iterations:>15} {len(metrics):>8} {b:>10.1f} {c:>9.1f} {b + c:>9.1f}")


def bench_report(repeats: int) -> None:
    print("\nreport: 12 runs (dense/topk/gtopk x P 1,2,4,8), 1000 iterations each")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results"
        for method, density in (("dense", 1.0), ("topk", 0.01), ("gtopk", 0.01)):
            for p in (1, 2, 4, 8):
                run_id = f"{method}-p{p}"
                rows, summary = run_rows(method, p, 1000, density=density, seed=p)
                config = RunConfig(method=method, workers=p, density=density, run_id=run_id, bandwidth="1Gbps")
                write_run(out, config, rows_to_frame(rows), run_summary(config, summary, status="completed"))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            path = write_report(out, Path(tmp) / "report.html")
            times.append(time.perf_counter() - t0)
        size_mb = path.stat().st_size / 1e6
        print(f"{'runs':>5} {'metric rows':>12} {'seconds':>8} {'MB':>6}")
        rows_total = 12 * 1000 * 15 // 4  # iterations x mean P (15/4) x runs
        print(f"{12:>5} {rows_total:>12} {statistics.median(times):>8.2f} {size_mb:>6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.repeats < 1:
        raise SystemExit(f"--repeats={args.repeats} is invalid: expected an integer >= 1")
    bench_live(args.repeats)
    bench_report(args.repeats)


if __name__ == "__main__":
    main()
