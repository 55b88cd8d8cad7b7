"""Where a gTop-k call's time goes, per round and phase, with each rank's CPU beside its wall.

``gtopk-lab bench collectives`` runs, after the timed calls of each gTop-k algorithm,
``--profile-repeats`` more calls of it inside :func:`gtopk_lab.comm.profiling.profiling`
(the timed calls run with the hooks off, so the main table is unaffected). Each profiled
call records on every rank:

1. the call's wall time (``perf_counter``), this thread's CPU (``thread_time``) and the
   process's CPU (``process_time``: gloo's I/O threads included);
2. per round (the rank's schedule step: "butterfly exchange", "reduce recv", ...) the
   wall and thread CPU of pack, send/recv, unpack and merge;
3. per call the prep (checks, wire dtypes, the local sort) and finish (stats, result
   copies) phases;
4. the call's virtual time on this rank as :meth:`VirtualClock.collective
   <gtopk_lab.network.clock.VirtualClock.collective>` with ``include_merge_cpu=True``
   charges it: the modelled alpha-beta time of the rounds it really sent
   (``CommStats.steps``) on ``virtual_network`` (the benchmark's ``--bandwidth``, else
   10GbE) plus its measured merge CPU (``CommStats.merge_cpu_s``, the local sort included).

:func:`summarise_profile` then takes, per rank, the median over calls of each figure and
reports per round position the mean over the ranks that have such a round (butterfly
ranks at a power of two P all run the same steps; tree ranks do not, so a tree round
position mixes e.g. rank 0's "reduce recv" with rank 1's "reduce send" and lists both
labels). The critical path is the slowest rank: per call the max over ranks of thread
CPU (``thread_cpu_max_s``) and of virtual time (``virtual_s``, the clock's max over ranks),
each the median over calls; a mean over ranks flatters the tree, whose ranks 1..P-1 merge
less than rank 0, which merges as often as every butterfly rank. Why thread CPU: on a host with fewer cores than ranks (the 2-core box at
P = 4), a butterfly round has every rank merging at once and a rank's wall time includes
its wait for a core; CPU time does not, so the two together tell work from contention.

Cost: ``repeats`` extra calls per algorithm, each after a common start (~30 ms).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from gtopk_lab.bench.timing import common_start_s
from gtopk_lab.comm.profiling import PHASES, ROUND_PHASES, profiling
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.network.pacing import pacing

__all__ = ["VIRTUAL_LINK", "profile_calls", "summarise_profile"]

#: the link of the profile's virtual-time column when the benchmark models none
VIRTUAL_LINK = "10GbE"


def profile_calls(call: Callable[..., Any], args: tuple, kwargs: dict[str, Any], repeats: int,
                  network: NetworkModel | None = None,
                  virtual_network: NetworkModel | None = None) -> list[dict[str, Any]]:
    """On one rank (all ranks call it together): ``repeats`` profiled calls of ``call``.

    Each call starts at an instant all ranks agreed on, runs with its rounds paced to
    ``network`` when given (as the timed calls are), and yields ``{"wall_s", "thread_cpu_s",
    "process_cpu_s", "merge_cpu_s", "virtual_s", "call": {prep, finish, ...}, "rounds":
    [{label, pack, ...}, ...]}``; ``virtual_s`` is the alpha-beta time of the call's steps on
    ``virtual_network`` (default: ``network``, else 10GbE) plus its merge CPU.
    """
    if virtual_network is None:
        virtual_network = network if network is not None else NetworkModel.from_strings(VIRTUAL_LINK)
    out = []
    for _ in range(repeats):
        common_start_s()
        with profiling() as prof:
            t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
            if network is not None:
                # the rounds paced as in the timed calls; no top-up sleep after the call
                # (gTop-k paces every round itself), so the phases cover the whole call
                with pacing(network):
                    result = call(*args, **kwargs)
            else:
                result = call(*args, **kwargs)
            wall, cpu, proc = time.perf_counter() - t0, time.thread_time() - c0, time.process_time() - p0
        merge_cpu = float(result.stats.merge_cpu_s)
        out.append({"wall_s": wall, "thread_cpu_s": cpu, "process_cpu_s": proc, "merge_cpu_s": merge_cpu,
                    "virtual_s": virtual_network.steps_time_s(result.stats.steps) + merge_cpu,
                    "call": dict(prof.call), "rounds": [dict(r) for r in prof.rounds]})
    return out


def _phase_totals(record: dict[str, Any], suffix: str = "") -> dict[str, float]:
    """Seconds per phase of one profiled call (thread CPU with ``suffix="_cpu"``)."""
    totals = {p: float(record["call"].get(p + suffix, 0.0)) for p in PHASES}
    for rnd in record["rounds"]:
        for p in ROUND_PHASES:
            totals[p] += float(rnd.get(p + suffix, 0.0))
    return totals


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _rank_summary(rank: int, calls: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median over one rank's profiled calls: wall, CPU, phase totals and their sum."""
    totals = [_phase_totals(c) for c in calls]
    cpu_totals = [_phase_totals(c, "_cpu") for c in calls]
    return {
        "rank": rank,
        "rounds": len(calls[0]["rounds"]) if calls else 0,
        "wall_s": _median([c["wall_s"] for c in calls]),
        "thread_cpu_s": _median([c["thread_cpu_s"] for c in calls]),
        "process_cpu_s": _median([c["process_cpu_s"] for c in calls]),
        "phases_s": {p: _median([t[p] for t in totals]) for p in PHASES},
        "phases_cpu_s": {p: _median([t[p] for t in cpu_totals]) for p in PHASES},
        # the median of per-call sums, so that it compares with the median call time
        "phases_sum_s": _median([sum(t.values()) for t in totals]),
        # per call, the share of its wall time inside a phase: a preemption between two
        # phases (the host's other work) lowers one call's share, a missing phase all of them
        "phases_share_per_call": [sum(t.values()) / c["wall_s"] if c["wall_s"] > 0 else 0.0
                                  for t, c in zip(totals, calls)],
    }


def _round_rows(per_rank_calls: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per round position: mean over the ranks that have it of each phase's median."""
    n_rounds = max((len(calls[0]["rounds"]) for calls in per_rank_calls if calls), default=0)
    rows = []
    for i in range(n_rounds):
        labels: list[str] = []
        per_rank: list[dict[str, float]] = []
        for calls in per_rank_calls:
            if not calls or len(calls[0]["rounds"]) <= i:
                continue
            label = str(calls[0]["rounds"][i]["label"])
            if label not in labels:
                labels.append(label)
            per_rank.append({key: _median([float(c["rounds"][i].get(key, 0.0)) for c in calls])
                             for key in (*ROUND_PHASES, *(f"{p}_cpu" for p in ROUND_PHASES))})
        row: dict[str, Any] = {"round": i + 1, "label": " / ".join(labels), "ranks": len(per_rank)}
        for p in ROUND_PHASES:
            row[f"{p}_s"] = statistics.fmean(r[p] for r in per_rank)
            row[f"{p}_cpu_s"] = statistics.fmean(r[f"{p}_cpu"] for r in per_rank)
        rows.append(row)
    return rows


def _median_of_max(per_rank: Sequence[dict[str, Any]], key: str) -> float:
    """Median over calls of the max over ranks of ``key`` (the slowest rank of each call)."""
    return _median([max(float(c.get(key, 0.0)) for c in calls)
                    for calls in zip(*(p["calls"] for p in per_rank))])


def summarise_profile(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One row from every rank's profile of one (P, numel, algorithm).

    ``per_rank[r]``: ``{"numel", "k", "workers", "algorithm", "calls": profile_calls(...)}``
    of rank r. The row has ``ranks`` (per rank: medians of wall, thread/process CPU, phase
    totals, their sum and each call's share of its wall time in phases), ``rounds`` (per
    round position, mean over ranks of each phase), and the means over ranks ``wall_mean_s``, ``thread_cpu_mean_s``, ``process_cpu_mean_s``,
    ``phases_mean_s`` plus ``wall_max_s`` (the slowest rank's median wall time) and the
    critical path: ``thread_cpu_max_s`` and ``virtual_s``, per call the max over ranks, then
    the median over calls (calls are aligned: every rank makes the same ones in turn).
    """
    first = per_rank[0]
    ranks = [_rank_summary(r, p["calls"]) for r, p in enumerate(per_rank)]
    return {
        "numel": first["numel"], "k": first["k"], "workers": first["workers"],
        "collective": "gtopk_allreduce", "algorithm": first["algorithm"],
        "calls": len(first["calls"]),
        "ranks": ranks,
        "rounds": _round_rows([p["calls"] for p in per_rank]),
        "wall_max_s": max(r["wall_s"] for r in ranks),
        "wall_mean_s": statistics.fmean(r["wall_s"] for r in ranks),
        "thread_cpu_mean_s": statistics.fmean(r["thread_cpu_s"] for r in ranks),
        "process_cpu_mean_s": statistics.fmean(r["process_cpu_s"] for r in ranks),
        "thread_cpu_max_s": _median_of_max(per_rank, "thread_cpu_s"),
        "virtual_s": _median_of_max(per_rank, "virtual_s"),
        "phases_mean_s": {p: statistics.fmean(r["phases_s"][p] for r in ranks) for p in PHASES},
        "phases_cpu_mean_s": {p: statistics.fmean(r["phases_cpu_s"][p] for r in ranks) for p in PHASES},
    }
