"""``gtopk-lab methods``: list the method registry (built-ins and plugins)."""

from __future__ import annotations

import argparse
import json

from gtopk_lab.methods import available_collectives, available_methods, get_collective, get_method
from gtopk_lab.training.state_size import method_state_bytes_per_parameter

NAME = "methods"
HELP = "list the methods gtopk-lab can run (built-ins and $GTOPK_LAB_METHODS plugins) and their collectives"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def run(args: argparse.Namespace) -> int:
    # bytes of state per parameter, counted from each method's step after 3 iterations on the
    # CNN's layout (training.state_size), not from a table
    methods = [{**get_method(m).summary(), "state_bytes_per_param": round(method_state_bytes_per_parameter(m), 3)}
               for m in available_methods()]
    collectives = [{"collective": c.name, "aliases": ",".join(c.aliases) or "-", "input": c.input,
                    "lossless": c.lossless, "patterns": ",".join(c.algorithms) or "-",
                    "description": c.description}
                   for c in map(get_collective, available_collectives())]
    if args.json:
        print(json.dumps({"methods": methods, "collectives": collectives}, indent=2))
        return 0
    keys = ("method", "selector", "collective", "memory", "exact_k", "sync_every", "state_bytes_per_param",
            "description")
    _table(keys, [tuple(str(m[k]) for k in keys) for m in methods])
    print()
    keys = ("collective", "aliases", "input", "lossless", "patterns", "description")
    _table(keys, [tuple(str(c[k]) for k in keys) for c in collectives])
    return 0
