"""Timed collective calls over real TCP, one rank's side: what the TCP terms are fitted on.

``benchmarks/tcp_model.py`` (ranks in testbed hosts) and ``gtopk-lab calibrate --scheduler
... --tcp-terms fit`` (two Dask workers, :mod:`gtopk_lab.worker.link_task`) both call
:func:`time_cases` on an initialised gloo group. Per case:

1. this rank's data: ``numel`` random values (seeded by rank) and their exact top-k at
   ``density`` (the selection is outside the timed call, as in training);
2. ``available_cores()``: the cores these ranks get right now (other jobs load the box);
3. one warm-up call (connections, allocations), then ``repeats`` calls, each timed from an
   instant all ranks agreed on (``common_start_s``: one monotonic clock, which namespaces
   on one kernel share) to this rank's return (wall), with this thread's CPU over the call
   (``time.thread_time``) less the part spent in the project's TCP links' I/O
   (:func:`~gtopk_lab.comm.tcp_links.io_cpu_s`: socket calls and the network stack they run,
   which the calibrated link already prices): the off-wire CPU, as gloo's own I/O threads are
   not counted either (both parts are kept: ``thread_cpu_s``, ``io_cpu_s``);
4. one MAX all-reduce of the times: a call ends when its slowest rank returns.

Cases (``collective``): ``ring_allreduce`` (dense), ``topk_allgather`` (exact count),
``gtopk_butterfly`` / ``gtopk_tree`` (exact k), ``oktopk_allreduce`` (Ok-Topk as published, its state
kept between calls) and ``incast`` (every other rank sends its k pairs to rank 0 at once).
Cost: the calls themselves plus 0.1 s of core probe per case. Worker side.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from gtopk_lab.comm.oktopk import OkTopkFaithfulState, oktopk_faithful_allreduce
from gtopk_lab.comm.tcp_links import io_cpu_s
from gtopk_lab.comm.timing import available_cores, common_start_s
from gtopk_lab.comm.torch_dist import dense_allreduce, gtopk_allreduce, topk_allgather
from gtopk_lab.compression.selection import get_selector
from gtopk_lab.config import k_for

__all__ = ["CASE_COLLECTIVES", "time_case", "time_cases"]



class _Steps:
    """The rounds of the incast case, shaped like a ``CollectiveResult`` (``stats.steps`` and
    ``stats.peers``; rank 0's one round has P - 1 sources, which a (to, from) pair cannot
    name, so its peers are left unknown)."""

    def __init__(self, steps: list[tuple[int, int]], peers: list[tuple[int | None, int | None]]) -> None:
        self.stats = self
        self.steps, self.peers = steps, peers


def _incast(rank: int, world: int, payload: torch.Tensor) -> _Steps:
    """Every rank > 0 sends ``payload`` to rank 0 in one round; rank 0 receives them all at once."""
    n = payload.numel()
    if rank == 0:
        bufs = [torch.empty_like(payload) for _ in range(world - 1)]
        for req in [dist.irecv(b, src) for b, src in zip(bufs, range(1, world))]:
            req.wait()
        return _Steps([(0, n * (world - 1))], [])
    dist.isend(payload, 0).wait()
    return _Steps([(n, 0)], [(0, None)])


def _call(case: dict[str, Any], rank: int, world: int, data: dict[tuple[int, float], Any]) -> Callable[[], Any]:
    """Step 1: the call a case times, on this rank's data (one size kept in ``data``)."""
    name, numel, density = case["collective"], int(case["numel"]), float(case.get("density", 0.001))
    if name not in CASE_COLLECTIVES:
        raise ValueError(f"collective={name!r} is invalid: expected one of {', '.join(CASE_COLLECTIVES)}")
    if not (0 < density <= 1) or numel < 1:
        raise ValueError(f"numel={numel!r}, density={density!r} are invalid: expected numel >= 1, 0 < density <= 1")
    if (numel, density) not in data:
        k = k_for(numel, density)
        x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        values, indices = get_selector("topk")(x, k)
        data.clear()  # one size in memory at a time (8 ranks x 25M on a small box)
        data[(numel, density)] = (x, values, indices, k)
    x, values, indices, k = data[(numel, density)]
    return _BUILDERS[name](x, values, indices, numel, k, rank, world)


def _dense(x, values, indices, numel, k, rank, world):  # type: ignore[no-untyped-def]
    buf = x.clone()  # reduced in place, call after call
    return lambda: dense_allreduce(buf)


def _gtopk(algorithm: str):  # type: ignore[no-untyped-def]
    def build(x, values, indices, numel, k, rank, world):  # type: ignore[no-untyped-def]
        return lambda: gtopk_allreduce(values, indices, numel, k, algorithm=algorithm, exact_k=True)
    return build


def _oktopk(x, values, indices, numel, k, rank, world):  # type: ignore[no-untyped-def]
    state = OkTopkFaithfulState()  # thresholds kept between calls, as in training
    return lambda: oktopk_faithful_allreduce(x, k, state=state)[0]


def _incast_call(x, values, indices, numel, k, rank, world):  # type: ignore[no-untyped-def]
    payload = torch.zeros(k * 8, dtype=torch.uint8)  # k (fp32 value, int32 index) pairs
    return lambda: _incast(rank, world, payload)


#: case name -> builder of its call (x, values, indices, numel, k, rank, world) -> call()
_BUILDERS: dict[str, Callable[..., Callable[[], Any]]] = {
    "ring_allreduce": _dense,
    "topk_allgather": lambda x, values, indices, numel, k, rank, world: (
        lambda: topk_allgather(values, indices, numel, exact_count=k)),
    "gtopk_butterfly": _gtopk("butterfly"),
    "gtopk_tree": _gtopk("tree"),
    "oktopk_allreduce": _oktopk,
    "incast": _incast_call,
}
CASE_COLLECTIVES = tuple(_BUILDERS)


def time_case(case: dict[str, Any], rank: int, world: int, data: dict) -> dict[str, Any]:
    """Steps 1-4 for one case; ``case`` needs ``collective``, ``numel``, ``density``, ``repeats``."""
    repeats = int(case["repeats"])
    if repeats < 1:
        raise ValueError(f"repeats={repeats!r} is invalid: expected an integer >= 1")
    call = _call(case, rank, world, data)
    cores = available_cores()
    times, cpus, ios, procs, result = [], [], [], [], None
    for rep in range(repeats + 1):
        start, _late = common_start_s()
        cpu0, io0, proc0 = time.thread_time(), io_cpu_s(), time.process_time()
        result = call()
        elapsed = time.monotonic() - start
        if rep > 0:
            times.append(elapsed)
            cpus.append(time.thread_time() - cpu0)
            ios.append(io_cpu_s() - io0)
            procs.append(time.process_time() - proc0)  # with gloo's own threads, for the log
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {**case, "workers": world, "times_s": times, "slowest_s": slowest.tolist(),
            "median_s": statistics.median(slowest.tolist()),
            "cpu_s": statistics.median(max(0.0, c - io) for c, io in zip(cpus, ios)),
            "thread_cpu_s": statistics.median(cpus), "io_cpu_s": statistics.median(ios),
            "process_cpu_s": statistics.median(procs), "available_cores": cores,
            "steps": [[int(a), int(b)] for a, b in result.stats.steps],
            "peers": [list(p) for p in result.stats.peers]}


def time_cases(cases: Sequence[dict[str, Any]], rank: int, world: int,
               before_case: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """:func:`time_case` of every case in order (``before_case(j)``: e.g. wait for a time slot)."""
    data: dict = {}
    out = []
    for j, case in enumerate(cases):
        if before_case is not None:
            before_case(j)
        out.append(time_case(case, rank, world, data))
    return out
