"""Timed calls of the collectives on real gloo ranks, with the alpha-beta(-gamma) columns.

For every world size P one gloo group of P spawned ranks runs, for every numel, each of
:data:`COLLECTIVES` ``repeats`` times after one warm-up, on a top-k selection of the
given density. A call is timed from an instant all ranks agreed on
(:func:`~gtopk_lab.bench.timing.common_start_s`) to the rank's return; a row's time is
the median over calls of the slowest rank's. With a network model every call runs under
:func:`~gtopk_lab.network.pacing.throttled_call` and the row adds the alpha-beta time of
the rounds really sent and the closed-form alpha-beta-gamma time, gamma calibrated inside
the collective. Optionally each gTop-k row also gets a per-round profile
(:mod:`gtopk_lab.bench.profile`). The command line around it is
:mod:`gtopk_lab.bench.collectives`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from gtopk_lab.analysis.predict import collective_time_s
from gtopk_lab.bench.profile import VIRTUAL_LINK, profile_calls, summarise_profile
from gtopk_lab.bench.timing import available_cores, common_start_s, host_cores, wakeup_delays_s
from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.comm.torch_dist import dense_allreduce, gtopk_allreduce, topk_allgather
from gtopk_lab.compression.selection import get_selector
from gtopk_lab.config import k_for
from gtopk_lab.network.calibrate import measure_gamma_s_per_element
from gtopk_lab.network.cpu_contention import off_wire_cpu_s, off_wire_wall_s
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.network.pacing import throttled_call
from gtopk_lab.network.wakeup import wakeup_time_s

__all__ = ["COLLECTIVES", "GAMMA_CALLS", "collective_call", "measure_gamma", "bench_collectives"]

COLLECTIVES: tuple[tuple[str, str], ...] = (
    ("dense_allreduce", "ring"), ("topk_allgather", "ring"),
    ("gtopk_allreduce", "butterfly"), ("gtopk_allreduce", "tree"),
)


def collective_call(collective: str, algorithm: str, x: torch.Tensor, values: torch.Tensor,
                    indices: torch.Tensor, numel: int, k: int
                    ) -> tuple[Callable[..., Any], tuple, dict[str, Any]]:
    """``(call, args, kwargs)`` of one benchmarked collective on this rank's data, as
    training calls it: the selection has exactly k entries, so gTop-k runs header-free
    (``exact_k=True``) and the allgather without its count allgather (``exact_count=k``);
    dense works on a copy of ``x`` (it reduces in place)."""
    if collective == "dense_allreduce":
        return dense_allreduce, (x.clone(),), {}
    if collective == "topk_allgather":
        return topk_allgather, (values, indices, numel), {"exact_count": k}
    return gtopk_allreduce, (values, indices, numel, k), {"algorithm": algorithm, "exact_k": True}


def _bench_rank(rank: int, world_size: int, numels: list[int], density: float, repeats: int,
                bandwidth: str | None, latency: str | None, profile_repeats: int = 0
                ) -> list[dict[str, Any]]:
    """``run_gloo`` target: this rank's row per (numel, collective); gTop-k rows carry
    this rank's profiled calls under ``"profile_calls"`` when ``profile_repeats`` > 0."""
    network = None
    if bandwidth is not None:
        network = NetworkModel.from_strings(bandwidth, latency)
    rows = []
    for numel in numels:
        k = k_for(numel, density)
        x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        values, indices = get_selector("topk")(x, k)
        gamma_loaded = float("nan")
        round_s = 0.0
        if network is not None:
            # every rank merges at once, each merge after one round's idle wait on a fresh
            # operand: gamma under the collective's own load and cache state
            dist.barrier()
            round_s = network.message_time_s(k * (values.element_size() + indices.element_size()))
            gamma_loaded = measure_gamma_s_per_element(k=k, repeats=7, numel=numel, seed=rank,
                                                       idle_before_s=round_s)
        for collective, algorithm in COLLECTIVES:
            call, args, kwargs = collective_call(collective, algorithm, x, values, indices, numel, k)
            gamma_in_collective = float("nan")
            if network is not None and collective != "dense_allreduce":
                gamma_in_collective = _gamma_in_collective(network, call, args, kwargs)
            times, models = [], []
            late_starts = 0
            result = None
            # the cores these ranks get right now (other jobs take some): before and after
            cores_before = available_cores() if network is not None else float("nan")
            # and how long a rank woken after a paced wait takes to complete an exchange
            wakes = wakeup_delays_s(min(round_s, 0.004)) if network is not None else []
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
            cores_now = (cores_before + available_cores()) / 2 if network is not None else float("nan")
            if network is not None:
                wakes += wakeup_delays_s(min(round_s, 0.004))
            st = result.stats
            rows.append({"numel": numel, "k": k, "workers": world_size, "collective": collective,
                         "algorithm": algorithm, "times_s": times, "model_s": models,
                         "bytes_sent": st.bytes_sent, "bytes_recv": st.bytes_recv,
                         "rounds": st.rounds, "merge_cpu_s": st.merge_cpu_s, "late_starts": late_starts,
                         "gamma_loaded_s_per_element": gamma_loaded, "available_cores": cores_now,
                         "wakeup_delays_s": wakes,
                         "gamma_in_collective_s_per_element": gamma_in_collective})
            if profile_repeats > 0 and collective == "gtopk_allreduce":
                # after the timed calls, so those run with the hooks off
                rows[-1]["profile_calls"] = profile_calls(call, args, kwargs, profile_repeats, network)
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


def _add_off_wire_term(row: dict[str, Any], workers: int, cores: float) -> None:
    """With a profile, add ``off_wire_cpu_s`` (slowest rank's prep + pack + unpack + finish CPU
    per call) and ``model_abgc_s`` = alpha-beta-gamma + the slowest rank's wall time for its
    off-wire CPU when the ``workers`` ranks share the ``cores`` they got
    (:func:`~gtopk_lab.network.cpu_contention.off_wire_wall_s`, as the TCP model prices it;
    ranks without a profile are taken as busy as the busiest): when ranks outnumber the
    cores, their off-wire work waits for a core like their merges do; alike work gives
    ``c max(1, P / cores)``."""
    ranks = (row.get("profile") or {}).get("ranks") or []
    if not ranks:
        return
    cpus = [off_wire_cpu_s(r["phases_cpu_s"]) for r in ranks]
    row["off_wire_cpu_s"] = max(cpus)
    row["model_abgc_s"] = row["model_abg_s"] + max(off_wire_wall_s(cpus, workers, float(cores)))


def _add_wakeup_term(row: dict[str, Any], delays_s: list[float]) -> None:
    """Add ``wakeup_delay_s`` (the median probed delay per dependent round, before and after
    the row's calls; ``wakeup_delay_mean_s`` beside it), ``wakeup_s`` (that delay x the critical
    path's rounds, :mod:`gtopk_lab.network.wakeup`) and ``model_abgw_s`` = alpha-beta-gamma +
    it; with the off-wire term (profiled rows) also ``model_abgcw_s``."""
    algorithm = None if row["algorithm"] == "ring" else row["algorithm"]
    # the row's time is a median of calls, so the term takes the probe rounds' median: the
    # rare round that stalls ~4 ms (gloo's wake-ups behind a busy core) sets the mean of
    # rounds, not the typical call (the mean stays in the JSON beside it)
    delay_s = statistics.median(delays_s)
    row["wakeup_delay_s"] = delay_s
    row["wakeup_delay_mean_s"] = statistics.fmean(delays_s)
    row["wakeup_s"] = wakeup_time_s(delay_s, row["collective"], row["workers"], algorithm)
    row["model_abgw_s"] = row["model_abg_s"] + row["wakeup_s"]
    if "model_abgc_s" in row:
        row["model_abgcw_s"] = row["model_abgc_s"] + row["wakeup_s"]


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
                      timeout_s: float = 600.0, gamma_s_per_element: float | None = None,
                      profile_repeats: int = 0) -> list[dict[str, Any]]:
    """One gloo group per P; returns one row per (P, numel, collective) aggregated over ranks.

    Each call is timed from an instant all ranks agreed on (:func:`common_start_s`) to
    the rank's return; the row's time is the slowest rank's. The top-k selection has
    exactly k entries, so, as in training, gTop-k runs with ``exact_k=True`` (no count
    header) and the allgather with ``exact_count=k`` (no count allgather).
    With ``bandwidth`` each row also has ``model_s`` (alpha-beta time of the steps this
    rank really sent) and ``model_abg_s`` (the closed-form alpha-beta-gamma time of the
    collective, :func:`gtopk_lab.analysis.predict.collective_time_s` with ``exact_k=True`` as the
    calls run: the same formula ``Method.predicted_time_s`` gives the topk, gtopk and dense
    methods, merges on the critical path included, with
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
    With ``profile_repeats`` > 0 each gTop-k row has ``profile``: where its time goes per
    round and phase, and each rank's CPU beside its wall time
    (:func:`gtopk_lab.bench.profile.summarise_profile` of that many extra calls).
    """
    network = None
    gammas: dict[int, float] = {}
    cores = host_cores()
    if bandwidth is not None:
        network = NetworkModel.from_strings(bandwidth, latency)
        for numel in numels:
            gammas[numel] = measure_gamma(numel, k_for(numel, density))  # idle, one process
    out: list[dict[str, Any]] = []
    for p in workers:
        per_rank = run_gloo(_bench_rank, p, list(numels), density, repeats, bandwidth, latency,
                            profile_repeats, timeout_s=timeout_s)
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
            if "profile_calls" in row0:
                row["profile"] = summarise_profile(
                    [{**{key: row0[key] for key in ("numel", "k", "workers", "algorithm")},
                      "calls": r["profile_calls"]} for r in rows])
                row["profile"]["virtual_link"] = bandwidth if bandwidth is not None else VIRTUAL_LINK
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
                # the P ranks share this host's cores, and other jobs take some of them: merges
                # that outnumber the cores the ranks get time-share them
                abg_gamma = 0.0 if gamma is None else gamma
                available = min(float(cores), rows[0]["available_cores"])
                row["available_cores"] = available
                row["model_abg_s"] = collective_time_s(network, *shape, algorithm=algorithm,
                                                       gamma_s_per_element=abg_gamma, host_cores=available,
                                                       exact_k=True)
                row["model_abg_idle_host_s"] = collective_time_s(network, *shape, algorithm=algorithm,
                                                                 gamma_s_per_element=abg_gamma, host_cores=cores,
                                                                 exact_k=True)
                row["model_abg_core_per_rank_s"] = collective_time_s(network, *shape, algorithm=algorithm,
                                                                     gamma_s_per_element=abg_gamma,
                                                                     exact_k=True)
                row["host_cores"] = cores
                _add_off_wire_term(row, p, available)
                _add_wakeup_term(row, rows[0]["wakeup_delays_s"])  # every rank holds the same
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
        row["measured_vs_abgc"] = (row["median_s"] / row["model_abgc_s"]
                                   if row.get("model_abgc_s") else None)
        row["measured_vs_abgw"] = (row["median_s"] / row["model_abgw_s"]
                                   if row.get("model_abgw_s") else None)
        row["measured_vs_abgcw"] = (row["median_s"] / row["model_abgcw_s"]
                                    if row.get("model_abgcw_s") else None)
    return out
