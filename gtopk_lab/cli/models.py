"""``gtopk-lab models``: list the model registry (name, parameters, input, datasets)."""

from __future__ import annotations

import argparse
import json

NAME = "models"
HELP = "list the models gtopk-lab can train, with parameter counts and the datasets they fit"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from gtopk_lab.training.models import model_table

    rows = model_table()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("name", "params", "input", "datasets", "description")
    table = [(r["name"], f"{r['params']:,}", r["input_shape"], r["datasets"], r["description"])
             for r in rows]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths)))
    try:
        import torchvision  # noqa: F401
    except ImportError:
        print("(resnet50 and alexnet need torchvision, which is not installed)")
    return 0
