"""Per-round timestamps of paced gTop-k calls: how late each round's rank runs again.

The wake-up term of the collectives' model (:mod:`gtopk_lab.network.wakeup`) rests on one
claim: under load, each dependent round of a paced call ends later than its paced
alpha-beta deadline, by about the delay :func:`gtopk_lab.comm.timing.wakeup_delay_s`
measures. This module records it in real calls, so the claim is data, not assumption
(``benchmarks/wakeup_rounds.py`` prints it).

Algorithm, on every rank of a gloo group (:func:`round_delays_rank`):

1. the wake-up probe (:func:`~gtopk_lab.bench.timing.wakeup_delay_s`, window = one sparse
   round's alpha-beta time);
2. ``calls`` gTop-k calls, each from a common start, inside a
   :func:`~gtopk_lab.network.pacing.pacing` block whose pacer's wait is wrapped: for every
   round it records ``excess = (when the rank returns from the paced wait) - (the round's
   paced deadline)``: the round's time beyond alpha-beta, from a peer that posted late
   (its merge ran late), from the exchange outlasting the paced window, and from waiting
   for a core after the wait;
3. the probe again; returns the per-call lists of per-round excess and both probes' rounds.

:func:`summarise_round_delays` takes per call and round the slowest rank's excess and gives
the mean per round position beside the probes' mean. Cost: ``calls`` paced calls + two
probes of 0.1 s.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from gtopk_lab.bench.timing import common_start_s, wakeup_delays_s
from gtopk_lab.comm.torch_dist import gtopk_allreduce
from gtopk_lab.compression.selection import get_selector
from gtopk_lab.config import k_for
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.network.pacing import pacing, wait_until

__all__ = ["round_delays_rank", "summarise_round_delays"]


def round_delays_rank(rank: int, world: int, numel: int, density: float, bandwidth: str, calls: int,
                      algorithm: str) -> dict[str, Any]:
    """``run_gloo`` target: steps 1-3 on this rank."""
    network = NetworkModel.from_strings(bandwidth)
    k = k_for(numel, density)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    values, indices = get_selector("topk")(x, k)
    window_s = network.message_time_s(k * (values.element_size() + indices.element_size()))
    probe_before = wakeup_delays_s(window_s)
    per_call: list[list[float]] = []
    for rep in range(calls + 1):
        excess: list[float] = []
        common_start_s()
        with pacing(network) as pacer:
            def timed_wait(deadline: float, _pacer: Any = pacer, _out: list[float] = excess) -> None:
                _pacer.slept_s += wait_until(deadline)
                _out.append(time.perf_counter() - deadline)
            pacer._sleep_until = timed_wait  # this call's pacer only
            gtopk_allreduce(values, indices, numel, k, algorithm=algorithm, exact_k=True)
        if rep > 0:  # the first call is a warm-up
            per_call.append(excess)
    probe_after = wakeup_delays_s(window_s)
    return {"rank": rank, "window_s": window_s, "calls": per_call,
            "probe_s": probe_before + probe_after}


def summarise_round_delays(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Per call and round the slowest rank's excess (ranks with fewer rounds, the tree's
    leaves, count where they have one); the mean over calls per round position, the mean
    over all rounds, and the probe rounds' mean and median (every rank reads the same probe).

    The tree's ranks run different rounds at one position (a leaf's "broadcast recv" waits
    for the whole reduce), so its per-position maxima are not its critical path; the
    butterfly's ranks all run the same rounds."""
    calls = len(per_rank[0]["calls"])
    positions = max(len(r["calls"][c]) for r in per_rank for c in range(calls))
    by_round: list[list[float]] = [[] for _ in range(positions)]
    for c in range(calls):
        for j in range(positions):
            here = [r["calls"][c][j] for r in per_rank if j < len(r["calls"][c])]
            by_round[j].append(max(here))
    per_round = [statistics.mean(v) for v in by_round]
    return {"window_s": per_rank[0]["window_s"], "calls": calls, "per_round_excess_s": per_round,
            "mean_excess_s": statistics.mean(x for v in by_round for x in v),
            "median_excess_s": statistics.median(x for v in by_round for x in v),
            "probe_mean_s": statistics.mean(per_rank[0]["probe_s"]),
            "probe_median_s": statistics.median(per_rank[0]["probe_s"])}
