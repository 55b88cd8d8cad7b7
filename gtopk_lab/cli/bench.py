"""``gtopk-lab bench collectives|selection``: time the collectives and the selectors."""

from __future__ import annotations

import argparse

NAME = "bench"
HELP = "benchmark collectives (real gloo ranks) and selectors: time, bytes per rank, ratio to dense"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gtopk_lab.bench.collectives import add_arguments as add

    add(parser)


def run(args: argparse.Namespace) -> int:
    from gtopk_lab.bench.collectives import run as run_bench

    return run_bench(args)
