"""``gtopk-lab model scaling``: predicted iteration time and scaling efficiency per method.

The rows are the registry's methods (every registered one by default, ``--methods`` to
choose; one row per pattern a method may choose) and the sparse lower bound, priced by
``analysis.predict.predict_scaling``, i.e. by each method's ``Method.predicted_time_s``.
``--model NAME`` takes d and the parameter shapes from one of the project's models
(``training.models``), so a method whose formula needs the shapes (PowerSGD, at its
default options) is priced too; ``--model-size`` gives d alone.
"""

from __future__ import annotations

import argparse
import json

from gtopk_lab.cli.errors import UsageError
from gtopk_lab.network.model import DEFAULT_NETWORK

NAME = "model"
HELP = "alpha-beta model predictions (scaling: iteration time and efficiency per method and P)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=("scaling",), help="what to predict")
    parser.add_argument("--model-size", default=None, help="parameters d, e.g. 25M, 270K (default 25M)")
    parser.add_argument("--model", default=None,
                        help="one of the project's models (cnn_wide, resnet20, vgg16, ...): d and the parameter "
                             "shapes from it, so PowerSGD is priced too (instead of --model-size)")
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
    parser.add_argument("--methods", default=None,
                        help="comma-separated methods or bounds (lower_bound, oktopk_paper_bound); default every "
                             "registered method whose formula needs no more than these flags, and lower_bound")
    parser.add_argument("--json", action="store_true", help="print rows as JSON")


def run(args: argparse.Namespace) -> int:
    from gtopk_lab.analysis.predict import parse_count, parse_workers, predict_scaling, scaling_rows
    from gtopk_lab.network.model import network_model

    net = network_model(args.bandwidth, args.latency)
    if args.model is not None and args.model_size is not None:
        raise UsageError("--model and --model-size are invalid together: the model fixes d; give one of them")
    formulas = None
    if args.model is not None:
        numel, formulas = model_formulas(args.model)
    else:
        numel = parse_count(args.model_size or "25M", "--model-size")
    workers = parse_workers(args.workers)
    if not (0.0 < args.density <= 1.0):
        raise UsageError(f"--density={args.density} is invalid: expected a number in (0, 1]")
    if not args.compute_time > 0:
        raise UsageError(f"--compute-time={args.compute_time} is invalid: expected seconds > 0")
    methods = None
    if args.methods is not None:
        names = [m.strip() for m in args.methods.split(",") if m.strip()]
        if not names:
            raise UsageError(f"--methods={args.methods!r} is invalid: expected comma-separated method names")
        try:
            methods = scaling_rows(names)
        except ValueError as exc:
            raise UsageError(f"--methods: {str(exc).splitlines()[0]}") from None
    try:
        rows = predict_scaling(numel, args.density, args.compute_time, net, workers,
                               selection_s=args.selection_time, gamma_s_per_element=args.gamma, methods=methods,
                               formulas=formulas)
    except ValueError as exc:  # a method asked for whose formula needs more (PowerSGD's layout)
        raise UsageError(str(exc).splitlines()[0]) from None
    if args.json:
        print(json.dumps({"network": net.to_dict(), "rows": rows}, indent=2))
        return 0
    print(f"network {net}; {'model ' + args.model + ', ' if args.model else ''}d = {numel:,}, "
          f"k = {rows[0]['k']:,} (density {args.density:g}), "
          f"compute {args.compute_time:g} s, selection {args.selection_time:g} s")
    print(format_scaling(rows, workers))
    if methods is None:
        shown = {r["method"] for r in rows}
        left = [label for label, _, _ in scaling_rows() if label not in shown]
        if left:
            print(f"not predicted (the formula needs more than a model size, e.g. the parameter layout: "
                  f"give --model): {', '.join(left)}")
    return 0


def model_formulas(name: str) -> tuple[int, dict[str, dict]]:
    """d of the project's model ``name`` and, per registered method, what its formula needs
    beyond d at the method's default options (``Method.formula_kwargs`` of the model's
    parameter shapes); a ``UsageError`` naming ``--model`` for a model that is not one."""
    from gtopk_lab.methods import available_methods, get_method
    from gtopk_lab.training.models import build_model, count_parameters

    try:
        model = build_model(name)
    except (ValueError, ImportError) as exc:
        raise UsageError(f"--model: {str(exc).splitlines()[0]}") from None
    layout = [tuple(p.shape) for p in model.parameters() if p.requires_grad]
    return count_parameters(model), {m: get_method(m).formula_kwargs({}, layout) for m in available_methods()}


def format_scaling(rows: list[dict], workers: list[int]) -> str:
    """Two tables, one row per method and a column per P: iteration time (ms), then scaling
    efficiency (%). O(rows)."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by = {(r["method"], r["workers"]): r for r in rows}
    width = max(len(m) for m in methods) + 2
    cell = max(8, max(len(str(p)) for p in workers) + 3)
    head = f"{'':<{width}}" + "".join(f"{'P=' + str(p):>{cell}}" for p in workers)
    lines = ["iteration time (ms)", head]
    lines += [f"{m:<{width}}" + "".join(f"{by[(m, p)]['iteration_s'] * 1e3:>{cell}.1f}" for p in workers)
              for m in methods]
    lines += ["", "scaling efficiency (%)", head]
    lines += [f"{m:<{width}}" + "".join(f"{by[(m, p)]['scaling_efficiency'] * 100:>{cell}.1f}" for p in workers)
              for m in methods]
    return "\n".join(lines)
