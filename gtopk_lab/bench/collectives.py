"""Benchmarks of the collectives (real gloo ranks) and of the local selectors.

``collectives``: for every world size P in ``--workers`` one gloo group of P spawned ranks
runs, for every ``--numel``, each collective ``--repeats`` times (after one warm-up) on a
top-k selection of density ``--density``: dense_allreduce, topk_allgather,
gtopk_allreduce (butterfly, tree). A call's time is the slowest rank's wall time
(``time.perf_counter`` around the call, after a barrier); the table shows the median over
repeats, bytes sent per rank (max over ranks) and both as a ratio to dense. With
``--bandwidth`` (and optionally ``--latency``) every call runs under
``gtopk_lab.network.pacing.throttled_call``, the throttling of
``VirtualClock(network, throttle=True)`` without the clock's one MAX all_reduce per call
(bookkeeping, not network): every round is paced to its alpha-beta time before the merge
that needs it. The table adds the alpha-beta time of the slowest rank's rounds and the
closed-form alpha-beta-gamma time, each with measured/modelled, and the wake-up term
(the probed delay of a dependent round x the rounds on the critical path,
:mod:`gtopk_lab.network.wakeup`) with ``abgw`` = alpha-beta-gamma + it.

After the timed calls of each gTop-k algorithm, ``--profile-repeats`` (default: as many as
``--repeats``; 0: none) more calls run with the timing hooks of
:mod:`gtopk_lab.comm.profiling` on, and two more tables say where the time goes: per round
the pack, send/recv, unpack and merge milliseconds (plus prep and finish), and per rank
its thread and process CPU time beside its wall time (:mod:`gtopk_lab.bench.profile`).

``selection``: on one thread, for every ``--numel``, the median time of torch.topk versus
each registered selector on a N(0,1) vector, the count selected and the speed-up; a comment
line per size gives ``x.sum()`` (one read pass) and ``x.abs().sum()`` as references.

Speed numbers depend on the machine; when ranks outnumber cores a note says so, since
ranks then time-share cores and wall times mostly measure the scheduler. With
``--bandwidth`` and P = 2 in ``--workers``, a host check runs first
(:func:`gtopk_lab.bench.stalls.probe_exchange_stalls`, a few seconds): the share of 2-rank
exchanges that stall over 3 ms, which the model does not include (JSON:
``host_exchange_probe``).

The work is split by job: :mod:`.collective_calls` (timed calls on gloo ranks),
:mod:`.profile` (the per-round profile), :mod:`.selection`, :mod:`.tables` (printing),
:mod:`.timing` (common start, host cores); this module is the command line and
re-exports their public names.

Example::

    python benchmarks/collectives.py collectives --workers 2,4 --numel 1M --repeats 3
    gtopk-lab bench selection --numel 1M,25M,100M --repeats 3
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from gtopk_lab.bench.collective_calls import COLLECTIVES, GAMMA_CALLS, bench_collectives, measure_gamma
from gtopk_lab.bench.selection import bench_selection, cpu_model
from gtopk_lab.bench.stalls import probe_exchange_stalls
from gtopk_lab.bench.tables import print_collectives, print_collectives_notes, print_profile, print_selection
from gtopk_lab.bench.timing import common_start_s, host_cores
from gtopk_lab.counts import parse_count_list  # the one count parser; re-exported here
from gtopk_lab.network.model import NetworkModel

# bench_selection, bench_collectives, common_start_s, COLLECTIVES, GAMMA_CALLS and
# measure_gamma lived here before the split: re-exported so importers keep working
__all__ = ["main", "add_arguments", "run", "parse_count_list", "bench_selection", "bench_collectives",
           "common_start_s", "COLLECTIVES", "GAMMA_CALLS", "measure_gamma"]
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by ``benchmarks/collectives.py`` and ``gtopk-lab bench``."""
    parser.add_argument("what", nargs="?", choices=("collectives", "selection", "all"), default="all",
                        help="which benchmark (default: all)")
    parser.add_argument("--workers", default="2,4,8", help="world sizes, e.g. 2,4,8 (default)")
    parser.add_argument("--numel", default="1M,25M", help="buffer sizes, e.g. 1M,25M (default)")
    parser.add_argument("--density", type=float, default=0.001, help="k = density * numel (default 0.001)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per case (default 5)")
    parser.add_argument("--bandwidth", default="none",
                        help="model and throttle this link (e.g. 1Gbps, 10GbE, a calibration JSON); "
                             "'none' (default) = no network model")
    parser.add_argument("--latency", default=None, help="per-message latency, e.g. 0.5ms (with --bandwidth)")
    parser.add_argument("--gamma", default="auto",
                        help="merge CPU seconds per element for the alpha-beta-gamma column: 'auto' "
                             "(default: from the merges of untimed throttled calls of the same "
                             "collective, slowest rank) "
                             "or a number, e.g. 4e-8")
    parser.add_argument("--profile-repeats", type=int, default=None,
                        help="profiled gTop-k calls per case for the where-the-time-goes tables "
                             "(default: as many as --repeats; 0: no profile)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per process group (default 600)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark(s) described by parsed ``args``; returns the exit code."""
    workers = parse_count_list(args.workers, "--workers")
    numels = parse_count_list(args.numel, "--numel")
    if not 0.0 < args.density <= 1.0:
        raise ValueError(f"--density={args.density!r} is invalid: expected a number in (0, 1]")
    if args.repeats < 1:
        raise ValueError(f"--repeats={args.repeats!r} is invalid: expected an integer >= 1")
    profile_repeats = args.repeats if getattr(args, "profile_repeats", None) is None else args.profile_repeats
    if profile_repeats < 0:
        raise ValueError(f"--profile-repeats={profile_repeats!r} is invalid: expected an integer >= 0")
    bandwidth = None if str(args.bandwidth).strip().lower() == "none" else args.bandwidth
    if bandwidth is None and args.latency is not None:
        raise ValueError("--latency needs --bandwidth: a latency alone models no link")
    gamma: float | None = None
    if str(args.gamma).strip().lower() != "auto":
        try:
            gamma = float(args.gamma)
        except ValueError:
            gamma = float("nan")
        if not (gamma >= 0 and gamma < float("inf")):
            raise ValueError(f"--gamma={args.gamma!r} is invalid: expected 'auto' or a number >= 0 "
                             "(seconds per element)")
    if bandwidth is not None:
        NetworkModel.from_strings(bandwidth, args.latency)  # fail before spawning anything
    report: dict[str, Any] = {}
    cores = host_cores()
    if args.what in ("collectives", "all"):
        probe = None
        if bandwidth is not None and 2 in workers:
            # the model has no term for the host's scheduling stalls: measure them first
            probe = probe_exchange_stalls(timeout_s=args.timeout)
            report["host_exchange_probe"] = probe
        rows = bench_collectives(workers, numels, args.density, args.repeats, bandwidth, args.latency,
                                 timeout_s=args.timeout, gamma_s_per_element=gamma,
                                 profile_repeats=profile_repeats)
        report["collectives"] = rows
        if not args.json:
            print_collectives_notes(rows, workers, numels, args.density, args.repeats, cores, bandwidth,
                                    args.latency, gamma, probe)
            print_collectives(rows, bandwidth is not None)
            print_profile(rows, cores)
    if args.what in ("selection", "all"):
        rows = [row for n in numels for row in bench_selection(n, args.density, args.repeats)]
        report["selection"] = rows
        report["selection_cpu"] = cpu_model()
        if not args.json:
            print(f"# selection: one thread, N(0,1), density {args.density}, median of {args.repeats}")
            print_selection(rows, cpu_model())
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: ``python benchmarks/collectives.py [collectives|selection|all] ...``."""
    parser = argparse.ArgumentParser(prog="benchmarks/collectives.py", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
