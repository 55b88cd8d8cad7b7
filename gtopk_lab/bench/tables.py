"""Plain-text tables of ``gtopk-lab bench``: collectives, selection and the gTop-k profile.

Every function prints to stdout from the rows that :mod:`gtopk_lab.bench.collective_calls`,
:mod:`gtopk_lab.bench.selection` and :mod:`gtopk_lab.bench.profile` return (the JSON
output of ``--json`` holds the same rows), so the measurement code prints nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from gtopk_lab.bench.collective_calls import GAMMA_CALLS
from gtopk_lab.comm.profiling import PHASES, ROUND_PHASES

__all__ = ["fmt_count", "print_collectives_notes", "print_collectives", "print_selection", "print_profile"]


def fmt_count(n: int) -> str:
    """1_000_000 -> "1M", 25_000 -> "25K"; counts without such a factor print in full."""
    for suffix, mult in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if n % mult == 0:
            return f"{n // mult}{suffix}"
    return str(n)


def print_collectives_notes(rows: list[dict[str, Any]], workers: Sequence[int], numels: Sequence[int],
                            density: float, repeats: int, cores: int, bandwidth: str | None,
                            latency: str | None, gamma: float | None,
                            probe: dict[str, Any] | None) -> None:
    """The comment lines above the collectives table: setup, model legend, host check, and
    a note when ranks outnumber cores (their wall times then include time-sharing)."""
    print(f"# collectives: gloo on 127.0.0.1, density {density}, median of {repeats} "
          f"(slowest rank per call), {cores} cores" + (f", link {bandwidth}"
                                                       + (f" @ {latency}" if latency else "")
                                                       + " (throttled)" if bandwidth else ""))
    if bandwidth:
        print("# ab = alpha-beta time of the bytes sent; abg = alpha-beta-gamma closed form; "
              "each round is paced to its ab time, merges run after it")
        print(f"# abg charges merges that more ranks run at once than the cores they get time-shared "
              f"(x ranks/cores; cores = the share of the {cores} the ranks got computing all at once, "
              "measured before and after each row's calls: other jobs take the rest); calls timed "
              "from a start all ranks agreed on; exact-k messages (no counts)")
        print("# wake ms = wake-up delay per dependent round (a paced wait's end to the peer exchange "
              "done, slowest rank, median of 40 probe rounds before and after each row's calls) x the rounds on the "
              "critical path (butterfly log2 P, tree 2 log2 P, paced-as-a-whole collectives 1); "
              "abgw = abg + wake")
        print("# gamma ns = merge CPU per element used by abg: "
              + ("given" if gamma is not None else
                 f"from {GAMMA_CALLS} untimed calls of the same collective, slowest rank"))
        for p in workers:
            for n in numels:
                r = next(x for x in rows if x["workers"] == p and x["numel"] == n)
                print(f"# standalone merge_sparse k+k, P={p} numel={fmt_count(n)}: "
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


def print_collectives(rows: list[dict[str, Any]], modelled: bool) -> None:
    """The collectives table: one line per (P, numel, collective); model columns if ``modelled``."""
    head = f"{'P':>3} {'numel':>6} {'k':>6} {'collective':<26} {'median ms':>10} {'bytes/rank':>12} " \
           f"{'bytes/dense':>11} {'time/dense':>10} {'merge ms':>9}"
    if modelled:
        head += f" {'ab ms':>9} {'meas/ab':>8} {'gamma ns':>8} {'cores':>5} {'abg ms':>9} {'meas/abg':>8}"
        head += f" {'abgc ms':>9} {'meas/abgc':>9}"  # + off-wire CPU sharing the cores (processor sharing), profiled rows
        head += f" {'wake ms':>7} {'abgw ms':>9} {'meas/abgw':>9}"  # + wake-up delay x critical rounds
    print(head)
    for r in rows:
        name = r["collective"] + ("" if r["algorithm"] == "ring" else f"/{r['algorithm']}")
        line = (f"{r['workers']:>3} {fmt_count(r['numel']):>6} {r['k']:>6} {name:<26} "
                f"{r['median_s'] * 1e3:>10.2f} {r['bytes_sent_per_rank']:>12,d} "
                f"{r['bytes_vs_dense']:>11.4f} {r['time_vs_dense']:>10.3f} {r['merge_cpu_s'] * 1e3:>9.2f}")
        if modelled:
            gamma = r["gamma_s_per_element"]
            line += (f" {r['model_s'] * 1e3:>9.2f} {r['measured_vs_model']:>8.2f}"
                     f" {'-' if gamma is None else f'{gamma * 1e9:.1f}':>8}"
                     f" {r['available_cores']:>5.2f} {r['model_abg_s'] * 1e3:>9.2f} {r['measured_vs_abg']:>8.2f}")
            if r.get("model_abgc_s"):
                line += f" {r['model_abgc_s'] * 1e3:>9.2f} {r['measured_vs_abgc']:>9.2f}"
            else:
                line += f" {'-':>9} {'-':>9}"
            line += (f" {r['wakeup_s'] * 1e3:>7.2f} {r['model_abgw_s'] * 1e3:>9.2f}"
                     f" {r['measured_vs_abgw']:>9.2f}")
        print(line)


def print_selection(rows: list[dict[str, Any]], cpu: str = "") -> None:
    """The selection table (passes: median time / median ``x.sum()`` beside it), after the
    CPU and one reference line per size."""
    if cpu:
        print(f"# CPU: {cpu}")
    for numel in dict.fromkeys(r["numel"] for r in rows):
        same = [r for r in rows if r["numel"] == numel]
        print(f"# {fmt_count(numel)}: one read pass x.sum() {statistics.median(r['one_pass_s'] for r in same) * 1e3:.1f} ms "
              f"(median over the selectors' runs), x.abs().sum() {same[0]['abs_sum_s'] * 1e3:.1f} ms")
    print(f"{'selector':<18} {'numel':>6} {'k':>7} {'count':>7} {'median ms':>10} {'vs topk':>8} {'passes':>7}")
    for r in rows:
        print(f"{r['selector']:<18} {fmt_count(r['numel']):>6} {r['k']:>7} {r['count']:>7} "
              f"{r['median_s'] * 1e3:>10.1f} {r['speedup_vs_topk']:>7.2f}x {r['passes']:>7.2f}")


def print_profile(rows: list[dict[str, Any]], cores: int) -> None:
    """Where each gTop-k call's time goes (ms), per round, then each rank's CPU vs wall.

    First table, per (P, numel, algorithm): one line per round position (mean over the
    ranks that have it; tree ranks differ, so several step labels may share a line), then
    ``prep``/``finish``, the sum of all phases and the median call time, each the mean over
    ranks. Second table: per (P, numel, algorithm) the mean over ranks of wall, thread CPU
    and process CPU per call, the slowest rank's wall, merge wall vs merge CPU, and the
    critical path: the slowest rank's thread CPU and virtual time per call.
    """
    profiles = [r["profile"] for r in rows if r.get("profile")]
    if not profiles:
        return
    calls = profiles[0]["calls"]
    print(f"# where the time goes: gtopk_allreduce (exact-k), ms per call, median of {calls} profiled "
          "calls per rank, mean over ranks; sendrecv = posting isend/irecv and waiting for the peer")
    head = (f"{'P':>3} {'numel':>6} {'algorithm':<9} {'round':<48} " +
            " ".join(f"{p:>8}" for p in ROUND_PHASES) + f" {'total':>8}")
    print(head)
    for prof in profiles:
        key = f"{prof['workers']:>3} {fmt_count(prof['numel']):>6} {prof['algorithm']:<9}"
        mean = prof["phases_mean_s"]
        blank = " ".join(f"{'':>8}" for _ in ROUND_PHASES)
        print(f"{key} {'prep (checks, sort)':<48} {blank} {mean['prep'] * 1e3:>8.3f}")
        for rnd in prof["rounds"]:
            label = f"{rnd['round']}: {rnd['label']}"
            cells = " ".join(f"{rnd[f'{p}_s'] * 1e3:>8.3f}" for p in ROUND_PHASES)
            total = sum(rnd[f"{p}_s"] for p in ROUND_PHASES)
            print(f"{key} {label[:48]:<48} {cells} {total * 1e3:>8.3f}")
        print(f"{key} {'finish (stats, copies)':<48} {blank} {mean['finish'] * 1e3:>8.3f}")
        cells = " ".join(f"{mean[p] * 1e3:>8.3f}" for p in ROUND_PHASES)
        print(f"{key} {'sum of phases':<48} {cells} {sum(mean[p] for p in PHASES) * 1e3:>8.3f}")
        print(f"{key} {'call (wall)':<48} {blank} {prof['wall_mean_s'] * 1e3:>8.3f}")
    ranks = max(p["workers"] for p in profiles)
    print(f"# per-rank CPU vs wall, ms per call (mean over ranks; {cores} cores"
          + (f", up to {ranks} ranks share them: wall includes waiting for a core)" if ranks > cores else ")"))
    print(f"# critical path: max thread = the slowest rank's thread CPU, virtual = the slowest rank's "
          f"alpha-beta time of its rounds on {profiles[0].get('virtual_link', '10GbE')} + its merge CPU "
          "(VirtualClock with include_merge_cpu); both per call, median over calls")
    print(f"{'P':>3} {'numel':>6} {'algorithm':<9} {'wall':>8} {'max wall':>8} {'thread':>8} {'process':>8} "
          f"{'cpu/wall':>8} {'merge':>8} {'merge cpu':>9} {'max thread':>10} {'virtual':>8}")
    for prof in profiles:
        wall, cpu = prof["wall_mean_s"], prof["thread_cpu_mean_s"]
        print(f"{prof['workers']:>3} {fmt_count(prof['numel']):>6} {prof['algorithm']:<9} "
              f"{wall * 1e3:>8.3f} {prof['wall_max_s'] * 1e3:>8.3f} {cpu * 1e3:>8.3f} "
              f"{prof['process_cpu_mean_s'] * 1e3:>8.3f} {cpu / wall if wall else float('nan'):>8.2f} "
              f"{prof['phases_mean_s']['merge'] * 1e3:>8.3f} {prof['phases_cpu_mean_s']['merge'] * 1e3:>9.3f} "
              f"{prof['thread_cpu_max_s'] * 1e3:>10.3f} {prof['virtual_s'] * 1e3:>8.3f}")
