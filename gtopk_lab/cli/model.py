"""``gtopk-lab model scaling``: predicted iteration time and scaling efficiency per method."""

from __future__ import annotations

import argparse
import json

from gtopk_lab.cli.errors import UsageError
from gtopk_lab.network.model import DEFAULT_NETWORK

NAME = "model"
HELP = "alpha-beta model predictions (scaling: iteration time and efficiency per method and P)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=("scaling",), help="what to predict")
    parser.add_argument("--model-size", default="25M", help="parameters d, e.g. 25M, 270K (default 25M)")
    parser.add_argument("--density", type=float, default=0.001, help="rho, k = floor(rho d) (default 0.001)")
    parser.add_argument("--compute-time", type=float, default=0.15,
                        help="forward+backward seconds per iteration on one worker (default 0.15)")
    parser.add_argument("--selection-time", type=float, default=0.0,
                        help="top-k selection seconds per iteration, sparse methods (default 0)")
    parser.add_argument("--gamma", type=float, default=None,
                        help="merge seconds per element on the critical path (default: the network's, 0)")
    parser.add_argument("--bandwidth", default=DEFAULT_NETWORK,
                        help=f"rate, preset or calibration JSON (default {DEFAULT_NETWORK})")
    parser.add_argument("--latency", default=None, help="per-message latency, e.g. 0.5ms (default: preset's)")
    parser.add_argument("--workers", default="1,2,4,...,1024", help="P values; '...' doubles (default 1,2,4,...,1024)")
    parser.add_argument("--json", action="store_true", help="print rows as JSON")


def run(args: argparse.Namespace) -> int:
    from gtopk_lab.analysis.predict import parse_count, parse_workers, predict_scaling
    from gtopk_lab.network.model import network_model

    net = network_model(args.bandwidth, args.latency)
    numel = parse_count(args.model_size, "--model-size")
    workers = parse_workers(args.workers)
    if not (0.0 < args.density <= 1.0):
        raise UsageError(f"--density={args.density} is invalid: expected a number in (0, 1]")
    if not args.compute_time > 0:
        raise UsageError(f"--compute-time={args.compute_time} is invalid: expected seconds > 0")
    rows = predict_scaling(numel, args.density, args.compute_time, net, workers,
                           selection_s=args.selection_time, gamma_s_per_element=args.gamma)
    if args.json:
        print(json.dumps({"network": net.to_dict(), "rows": rows}, indent=2))
        return 0
    print(f"network {net}; d = {numel:,}, k = {rows[0]['k']:,} (density {args.density:g}), "
          f"compute {args.compute_time:g} s, selection {args.selection_time:g} s")
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by = {(r["method"], r["workers"]): r for r in rows}
    width = max(len(m) for m in methods) + 2
    print("iteration time (ms) / scaling efficiency (%)")
    print(f"{'P':>6}" + "".join(f"{m:>{width + 8}}" for m in methods))
    for p in workers:
        cells = []
        for m in methods:
            r = by[(m, p)]
            cells.append(f"{r['iteration_s'] * 1e3:>{width}.1f} {r['scaling_efficiency']:>6.1%}")
        print(f"{p:>6}" + "".join(cells))
    return 0
