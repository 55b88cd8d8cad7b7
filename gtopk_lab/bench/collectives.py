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
closed-form alpha-beta-gamma time, each with measured/modelled.

``selection``: on one thread, for every ``--numel``, the median time of torch.topk versus
each registered selector on a N(0,1) vector, the count selected and the speed-up; a comment
line per size gives ``x.sum()`` (one read pass) and ``x.abs().sum()`` as references.

Speed numbers depend on the machine; when ranks outnumber cores a note says so, since
ranks then time-share cores and wall times mostly measure the scheduler. With
``--bandwidth`` and P = 2 in ``--workers``, a host check runs first
(:func:`gtopk_lab.bench.stalls.probe_exchange_stalls`, a few seconds): the share of 2-rank
exchanges that stall over 3 ms, which the model does not include (JSON:
``host_exchange_probe``).

Example::

    python benchmarks/collectives.py collectives --workers 2,4 --numel 1M --repeats 3
    gtopk-lab bench selection --numel 1M,25M,100M --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from gtopk_lab.analysis.predict import collective_time_s
from gtopk_lab.bench.stalls import probe_exchange_stalls
from gtopk_lab.bench.timing import START_MARGIN_S, common_start_s
from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.comm.torch_dist import dense_allreduce, gtopk_allreduce, topk_allgather
from gtopk_lab.compression.selection import available_selectors, get_selector
from gtopk_lab.config import k_for
from gtopk_lab.counts import parse_count_list  # the one count parser; re-exported here
from gtopk_lab.network.calibrate import measure_gamma_s_per_element
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.network.pacing import throttled_call

__all__ = ["main", "add_arguments", "run", "parse_count_list", "bench_selection", "bench_collectives",
           "common_start_s"]

COLLECTIVES: tuple[tuple[str, str], ...] = (
    ("dense_allreduce", "ring"), ("topk_allgather", "ring"),
    ("gtopk_allreduce", "butterfly"), ("gtopk_allreduce", "tree"),
)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _fmt_count(n: int) -> str:
    for suffix, mult in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if n % mult == 0:
            return f"{n // mult}{suffix}"
    return str(n)


# ---------------------------------------------------------------------------------------
# selection
def bench_selection(numel: int, density: float, repeats: int) -> list[dict[str, Any]]:
    """Median single-thread time of each selector on N(0,1) of ``numel`` elements."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
        k = k_for(numel, density)
        rows = []
        # references: x.sum() is one read pass; x.abs().sum() also writes and re-reads a
        # temporary of numel elements (and pays its page faults)
        ref: dict[str, list[float]] = {"sum": [], "abs_sum": []}
        for _ in range(repeats + 1):
            for key, fn in (("sum", torch.sum), ("abs_sum", lambda t: t.abs().sum())):
                t0 = time.perf_counter()
                fn(x)
                ref[key].append(time.perf_counter() - t0)
        one_pass_s = statistics.median(ref["sum"][1:])
        abs_sum_s = statistics.median(ref["abs_sum"][1:])
        for name in available_selectors():
            sel = get_selector(name)
            sel(x, k)  # warm-up
            times, count = [], 0
            for _ in range(repeats):
                t0 = time.perf_counter()
                _, idx = sel(x, k)
                times.append(time.perf_counter() - t0)
                count = idx.numel()
            rows.append({"selector": name, "numel": numel, "k": k, "count": count,
                         "median_s": statistics.median(times), "one_pass_s": one_pass_s,
                         "abs_sum_s": abs_sum_s})
        base = next(r["median_s"] for r in rows if r["selector"] == "topk")
        for r in rows:
            r["speedup_vs_topk"] = base / r["median_s"]
        return rows
    finally:
        torch.set_num_threads(threads)


def _bench_rank(rank: int, world_size: int, numels: list[int], density: float, repeats: int,
                bandwidth: str | None, latency: str | None) -> list[dict[str, Any]]:
    network = None
    if bandwidth is not None:
        network = NetworkModel.from_strings(bandwidth, latency)
    rows = []
    for numel in numels:
        k = k_for(numel, density)
        x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        values, indices = get_selector("topk")(x, k)
        gamma_loaded = float("nan")
        if network is not None:
            # every rank merges at once, each merge after one round's idle wait on a fresh
            # operand: gamma under the collective's own load and cache state
            dist.barrier()
            round_s = network.message_time_s(k * (values.element_size() + indices.element_size()))
            gamma_loaded = measure_gamma_s_per_element(k=k, repeats=7, numel=numel, seed=rank,
                                                       idle_before_s=round_s)
        for collective, algorithm in COLLECTIVES:
            if collective == "dense_allreduce":
                buf = x.clone()
                call, args, kwargs = dense_allreduce, (buf,), {}
            elif collective == "topk_allgather":
                # the topk selection has exactly k entries: no count allgather, as in training
                call, args, kwargs = topk_allgather, (values, indices, numel), {"exact_count": k}
            else:
                # exactly k entries: header-free rounds, as in training
                call, args, kwargs = (gtopk_allreduce, (values, indices, numel, k),
                                      {"algorithm": algorithm, "exact_k": True})
            gamma_in_collective = float("nan")
            if network is not None and collective != "dense_allreduce":
                gamma_in_collective = _gamma_in_collective(network, call, args, kwargs)
            times, models = [], []
            late_starts = 0
            result = None
            for rep in range(repeats + 1):
                start_s, late = common_start_s()
                model_s = float("nan")
                if network is not None:
                    result, model_s, _slept = throttled_call(network, call, *args, **kwargs)
                else:
                    result = call(*args, **kwargs)
                elapsed = time.monotonic() - start_s
                if rep > 0:  # the first call is a warm-up (connections, allocations)
                    times.append(elapsed)
                    models.append(model_s)
                    late_starts += late
            assert result is not None
            st = result.stats
            rows.append({"numel": numel, "k": k, "workers": world_size, "collective": collective,
                         "algorithm": algorithm, "times_s": times, "model_s": models,
                         "bytes_sent": st.bytes_sent, "bytes_recv": st.bytes_recv,
                         "rounds": st.rounds, "merge_cpu_s": st.merge_cpu_s, "late_starts": late_starts,
                         "gamma_loaded_s_per_element": gamma_loaded,
                         "gamma_in_collective_s_per_element": gamma_in_collective})
            del result
    return rows


#: untimed throttled calls of a collective whose merges calibrate its gamma
GAMMA_CALLS = 7


def _gamma_in_collective(network: Any, call: Any, args: tuple, kwargs: dict) -> float:
    """gamma as this collective runs its merges: median over :data:`GAMMA_CALLS` untimed
    throttled calls, made just before the timed ones, of ``merge_cpu_s / merged_elements``
    on this rank (0 merged elements: nan).

    These merges run where the timed ones will: right after a paced round, on an operand
    the transport just received, beside the other ranks' merges, so they see the caches
    and contention a standalone merge loop does not reproduce. Each collective gets its
    own: the allgather's coalesce of P k entries costs about half a gTop-k merge per
    element (no top-k selection).
    """
    per_call = []
    for _ in range(GAMMA_CALLS):
        common_start_s()
        result, _model, _slept = throttled_call(network, call, *args, **kwargs)
        if result.stats.merged_elements:
            per_call.append(result.stats.merge_cpu_s / result.stats.merged_elements)
    return statistics.median(per_call) if per_call else float("nan")


def _nanmax(values: Any) -> float:
    """Largest value that is not NaN (NaN if there is none)."""
    return max((v for v in values if v == v), default=float("nan"))


def measure_gamma(numel: int, k: int, repeats: int = 5) -> float:
    """gamma (CPU s per merged element) of a k+k merge over ``numel``, on one thread here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks run with one intra-op thread each
    try:
        return measure_gamma_s_per_element(k=k, repeats=repeats, numel=numel)
    finally:
        torch.set_num_threads(threads)


def bench_collectives(workers: Sequence[int], numels: Sequence[int], density: float, repeats: int,
                      bandwidth: str | None = None, latency: str | None = None,
                      timeout_s: float = 600.0, gamma_s_per_element: float | None = None
                      ) -> list[dict[str, Any]]:
    """One gloo group per P; returns one row per (P, numel, collective) aggregated over ranks.

    Each call is timed from an instant all ranks agreed on (:func:`common_start_s`) to
    the rank's return; the row's time is the slowest rank's. The top-k selection has
    exactly k entries, so, as in training, gTop-k runs with ``exact_k=True`` (no count
    header) and the allgather with ``exact_count=k`` (no count allgather).
    With ``bandwidth`` each row also has ``model_s`` (alpha-beta time of the steps this
    rank really sent) and ``model_abg_s`` (the closed-form alpha-beta-gamma time of
    :meth:`NetworkModel.collective_time_s`, merges on the critical path included, with
    ``host_cores`` = this machine's cores: when more ranks merge at once than there are
    cores, the merges time-share; ``model_abg_core_per_rank_s`` is the same without). When
    ``gamma_s_per_element`` is None, gamma is *calibrated in the collective*: before its
    timed calls every rank makes :data:`GAMMA_CALLS` untimed throttled calls of the same
    collective and takes the median of ``merge_cpu_s / merged_elements``; the slowest
    rank's value is used (dense rows have no merges and no gamma).
    Merges inside a paced collective run on cooled caches and a just-received operand,
    beside the other ranks' merges, and on a shared 2-core VM cost 1.2-1.6x a standalone
    merge loop. Two standalone figures are reported beside it: ``gamma_loaded`` (all P
    ranks time ``merge_sparse`` of k + k random pairs at once, each after one round's
    idle wait, median of 7) and ``gamma_idle`` (one process, back to back).
    """
    network = None
    gammas: dict[int, float] = {}
    cores = _cores()
    if bandwidth is not None:
        network = NetworkModel.from_strings(bandwidth, latency)
        for numel in numels:
            gammas[numel] = measure_gamma(numel, k_for(numel, density))  # idle, one process
    out: list[dict[str, Any]] = []
    for p in workers:
        per_rank = run_gloo(_bench_rank, p, list(numels), density, repeats, bandwidth, latency,
                            timeout_s=timeout_s)
        for j, row0 in enumerate(per_rank[0]):
            rows = [r[j] for r in per_rank]
            slowest = [max(ts) for ts in zip(*(r["times_s"] for r in rows))]
            model = [max(ms) for ms in zip(*(r["model_s"] for r in rows))]  # slowest rank's rounds
            row = {k: row0[k] for k in ("numel", "k", "workers", "collective", "algorithm")}
            row.update(median_s=statistics.median(slowest),
                       bytes_sent_per_rank=max(r["bytes_sent"] for r in rows),
                       rounds=max(r["rounds"] for r in rows),
                       merge_cpu_s=max(r["merge_cpu_s"] for r in rows),
                       late_starts=max(r["late_starts"] for r in rows),
                       model_s=statistics.median(model) if bandwidth is not None else None)
            if network is not None:
                loaded = _nanmax(r["gamma_loaded_s_per_element"] for r in rows)
                in_collective = _nanmax(r["gamma_in_collective_s_per_element"] for r in rows)
                if in_collective != in_collective:  # dense: no merges, no gamma (JSON null)
                    in_collective = None
                gamma = in_collective if gamma_s_per_element is None else float(gamma_s_per_element)
                row["gamma_idle_s_per_element"] = gammas[row["numel"]]
                row["gamma_loaded_s_per_element"] = loaded
                row["gamma_in_collective_s_per_element"] = in_collective
                row["gamma_s_per_element"] = gamma
                shape = (row["collective"], row["numel"], row["k"], p)
                algorithm = None if row["algorithm"] == "ring" else row["algorithm"]
                # the P ranks share this host's cores: merges that outnumber them time-share
                abg_gamma = 0.0 if gamma is None else gamma
                row["model_abg_s"] = collective_time_s(network, *shape, algorithm=algorithm, gamma_s_per_element=abg_gamma, host_cores=cores, exact_k=True)
                row["model_abg_core_per_rank_s"] = collective_time_s(network, *shape, algorithm=algorithm, gamma_s_per_element=abg_gamma, exact_k=True)
                row["host_cores"] = cores
            out.append(row)
    for row in out:
        dense = next(r for r in out if r["numel"] == row["numel"] and r["workers"] == row["workers"]
                     and r["collective"] == "dense_allreduce")
        row["bytes_vs_dense"] = (row["bytes_sent_per_rank"] / dense["bytes_sent_per_rank"]
                                 if dense["bytes_sent_per_rank"] else float("nan"))
        row["time_vs_dense"] = row["median_s"] / dense["median_s"]
        row["measured_vs_model"] = (row["median_s"] / row["model_s"]
                                    if row.get("model_s") else None)
        row["measured_vs_abg"] = (row["median_s"] / row["model_abg_s"]
                                  if row.get("model_abg_s") else None)
    return out


# ---------------------------------------------------------------------------------------
# printing
def _print_collectives(rows: list[dict[str, Any]], modelled: bool) -> None:
    head = f"{'P':>3} {'numel':>6} {'k':>6} {'collective':<26} {'median ms':>10} {'bytes/rank':>12} " \
           f"{'bytes/dense':>11} {'time/dense':>10} {'merge ms':>9}"
    if modelled:
        head += f" {'ab ms':>9} {'meas/ab':>8} {'gamma ns':>8} {'abg ms':>9} {'meas/abg':>8}"
    print(head)
    for r in rows:
        name = r["collective"] + ("" if r["algorithm"] == "ring" else f"/{r['algorithm']}")
        line = (f"{r['workers']:>3} {_fmt_count(r['numel']):>6} {r['k']:>6} {name:<26} "
                f"{r['median_s'] * 1e3:>10.2f} {r['bytes_sent_per_rank']:>12,d} "
                f"{r['bytes_vs_dense']:>11.4f} {r['time_vs_dense']:>10.3f} {r['merge_cpu_s'] * 1e3:>9.2f}")
        if modelled:
            gamma = r["gamma_s_per_element"]
            line += (f" {r['model_s'] * 1e3:>9.2f} {r['measured_vs_model']:>8.2f}"
                     f" {'-' if gamma is None else f'{gamma * 1e9:.1f}':>8}"
                     f" {r['model_abg_s'] * 1e3:>9.2f} {r['measured_vs_abg']:>8.2f}")
        print(line)


def _print_selection(rows: list[dict[str, Any]]) -> None:
    for numel in dict.fromkeys(r["numel"] for r in rows):
        r = next(r for r in rows if r["numel"] == numel)
        print(f"# {_fmt_count(numel)}: one read pass x.sum() {r['one_pass_s'] * 1e3:.1f} ms, "
              f"x.abs().sum() {r['abs_sum_s'] * 1e3:.1f} ms")
    print(f"{'selector':<18} {'numel':>6} {'k':>7} {'count':>7} {'median ms':>10} {'vs topk':>8}")
    for r in rows:
        print(f"{r['selector']:<18} {_fmt_count(r['numel']):>6} {r['k']:>7} {r['count']:>7} "
              f"{r['median_s'] * 1e3:>10.1f} {r['speedup_vs_topk']:>7.2f}x")


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
    cores = _cores()
    if args.what in ("collectives", "all"):
        probe = None
        if bandwidth is not None and 2 in workers:
            # the model has no term for the host's scheduling stalls: measure them first
            probe = probe_exchange_stalls(timeout_s=args.timeout)
            report["host_exchange_probe"] = probe
        rows = bench_collectives(workers, numels, args.density, args.repeats, bandwidth, args.latency,
                                 timeout_s=args.timeout, gamma_s_per_element=gamma)
        report["collectives"] = rows
        if not args.json:
            print(f"# collectives: gloo on 127.0.0.1, density {args.density}, median of {args.repeats} "
                  f"(slowest rank per call), {cores} cores" + (f", link {bandwidth}"
                                                               + (f" @ {args.latency}" if args.latency else "")
                                                               + " (throttled)" if bandwidth else ""))
            if bandwidth:
                print("# ab = alpha-beta time of the bytes sent; abg = alpha-beta-gamma closed form; "
                      "each round is paced to its ab time, merges run after it")
                print(f"# abg charges merges that more ranks run at once than the {cores} cores "
                      "time-shared (x ranks/cores); calls timed from a start all ranks agreed on; "
                      "exact-k messages (no counts)")
                print("# gamma ns = merge CPU per element used by abg: "
                      + ("given" if gamma is not None else
                         f"from {GAMMA_CALLS} untimed calls of the same collective, slowest rank"))
                for p in workers:
                    for n in numels:
                        r = next(x for x in rows if x["workers"] == p and x["numel"] == n)
                        print(f"# standalone merge_sparse k+k, P={p} numel={_fmt_count(n)}: "
                              f"{r['gamma_idle_s_per_element'] * 1e9:.1f} ns/element idle, "
                              f"{r['gamma_loaded_s_per_element'] * 1e9:.1f} with all ranks merging at once")
            if probe is not None:
                print(f"# host check: 2-rank isend/irecv of {probe['bytes'] // 1000} kB after "
                      f"{probe['busy_ms']:g} ms of CPU, {probe['calls']} calls: median "
                      f"{probe['median_s'] * 1e3:.2f} ms, {probe['stall_share']:.0%} over "
                      f"{probe['stall_s'] * 1e3:g} ms (benchmarks/exchange_stalls.py)"
                      + ("; such stalls are not modelled and weigh most in the short P=2 calls"
                         if probe["stall_share"] >= 0.1 else ""))
            if max(workers) > cores:
                print(f"# note: up to {max(workers)} ranks share {cores} cores; wall times include "
                      "time-sharing and are not link-bound"
                      + ("; abg models the time-shared merges" if bandwidth else ""))
            _print_collectives(rows, bandwidth is not None)
    if args.what in ("selection", "all"):
        rows = [row for n in numels for row in bench_selection(n, args.density, args.repeats)]
        report["selection"] = rows
        if not args.json:
            print(f"# selection: one thread, N(0,1), density {args.density}, median of {args.repeats}")
            _print_selection(rows)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: ``python benchmarks/collectives.py [collectives|selection|all] ...``."""
    parser = argparse.ArgumentParser(prog="benchmarks/collectives.py", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
