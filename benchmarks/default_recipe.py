#!/usr/bin/env python3
"""Defaults that train: the plain command of issue 27 item 4, dense vs gTop-k, with and without
the model's recipe as defaults.

The command under test gives nothing but the method, P, density, model, dataset and epochs::

    gtopk-lab run --method gtopk --workers 2 --density 0.01 --model cnn --dataset mnist1d --epochs 40

Its target: gTop-k within 3 points of dense's final test accuracy at 40 epochs, two seeds.

Algorithm:

1. for each recipe setting (``auto``: the model's recipe fills the fields not given, the
   default since issue 27; ``none``: the dataclass defaults, what the command got before),
   each method (dense, gtopk) and each seed, run the command (plus ``--seed``, ``--recipe``,
   ``--json`` and, by default, ``--simulate``: P virtual ranks in one process, bitwise the
   real ranks' weights, which a 2-core box shared with other work runs faster; ``--real``
   uses real gloo ranks on an embedded Dask cluster);
2. read each run's summary (final test accuracy, the recipe and the fields it supplied);
3. print a table: per recipe and method the accuracy of each seed and their mean, and per
   recipe gTop-k's gap to dense (mean over seeds) against the 3-point target.

Cost: len(recipes) x 2 methods x len(seeds) runs of 40 epochs (62 iterations each at P = 2).

Example::

    .venv/bin/python benchmarks/default_recipe.py --seeds 0,1 --recipes auto,none
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["--method", "{method}", "--workers", "2", "--density", "0.01", "--model", "cnn",
           "--dataset", "mnist1d", "--epochs", "{epochs}"]
TARGET_POINTS = 3.0


def one_run(method: str, seed: int, recipe: str, epochs: int, real: bool, out: str) -> dict[str, Any]:
    """Step 1-2 for one run: the CLI's JSON summary (last stdout line) and its wall time."""
    argv = [a.format(method=method, epochs=epochs) for a in COMMAND]
    argv += ["--seed", str(seed), "--recipe", recipe, "--json", "--out", out, "--no-progress"]
    if not real:
        argv.append("--simulate")
    started = time.perf_counter()
    # one thread per process: on a shared, oversubscribed box a 2-thread OpenMP barrier waits for
    # the other thread's time slice at every op (a 20 s run took over 10 min at load 12)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "gtopk_lab.cli", "run", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({method}, seed {seed}, recipe {recipe}): "
                         f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    summary["bench_wall_s"] = time.perf_counter() - started
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1", help="seeds (default 0,1)")
    parser.add_argument("--recipes", default="auto,none", help="recipe settings (default auto,none)")
    parser.add_argument("--epochs", type=int, default=40, help="epochs (default 40)")
    parser.add_argument("--real", action="store_true", help="real gloo ranks instead of --simulate")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    acc: dict[tuple[str, str], list[float]] = {}
    supplied: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as out:
        for recipe in recipes:
            for method in ("dense", "gtopk"):
                for seed in seeds:
                    s = one_run(method, seed, recipe, args.epochs, args.real, out)
                    acc.setdefault((recipe, method), []).append(100 * float(s["final_test_accuracy"]))
                    supplied[recipe] = f"{s.get('recipe') or 'none'}: {s.get('recipe_fields') or '-'}"
                    print(f"  {recipe:>5} {method:>6} seed {seed}: {acc[(recipe, method)][-1]:.1f}% "
                          f"({s['iterations']} iterations, {s['bench_wall_s']:.0f} s)", file=sys.stderr)
    mode = "real gloo ranks" if args.real else "simulated ranks (--simulate)"
    print(f"default recipe, P=2, rho=0.01, cnn on mnist1d, {args.epochs} epochs, {mode}")
    print(f"{'recipe':>7} {'method':>7} " + " ".join(f"{'seed ' + str(s):>8}" for s in seeds) + f" {'mean':>7}")
    for (recipe, method), values in acc.items():
        print(f"{recipe:>7} {method:>7} " + " ".join(f"{v:>7.1f}%" for v in values)
              + f" {statistics.mean(values):>6.1f}%")
    for recipe in recipes:
        gap = statistics.mean(acc[(recipe, "dense")]) - statistics.mean(acc[(recipe, "gtopk")])
        verdict = "within" if gap <= TARGET_POINTS else "NOT within"
        print(f"recipe {recipe}: gTop-k {gap:+.1f} points below dense ({verdict} {TARGET_POINTS:g}); "
              f"supplied {supplied[recipe]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
