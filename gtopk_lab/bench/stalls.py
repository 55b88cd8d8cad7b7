"""Does this host stall short gloo exchanges? (2 ranks on 127.0.0.1, worker side: torch only)

Two gloo ranks start every call at an instant both agreed on
(:func:`~gtopk_lab.bench.timing.common_start_s`), optionally spin ``busy_ms`` of CPU
first (as a rank does when it merges before its next round), then exchange one message
each way, in up to four ways:

- ``all_gather``: ``dist.all_gather`` into a list (what ``topk_allgather`` does);
- ``isend/irecv``: both ranks post a send, then a receive (a gTop-k round);
- ``irecv/isend``: the receive first, so the buffer is posted before the peer's data;
- ``send then recv``: rank 0 sends first, rank 1 receives first (half-duplex order).

A call's time is the slower rank's. On a host where each rank has a core, a 200 kB
exchange takes 0.4-1 ms and none takes over 3 ms. On the 2-vCPU development VMs,
7-37% of calls take about 4 ms more whatever the size (2 kB as often as 200 kB):
a scheduling delay, not bytes (``benchmarks/RESULTS.md``, "Network";
``benchmarks/exchange_threads.py`` shows gloo's I/O thread running through the stall while
the main thread waits for a CPU). The network model
does not include such stalls, so ``gtopk-lab bench collectives`` runs
:func:`probe_exchange_stalls` first and prints its result beside the model-fidelity table.

Cost: ``calls + 2`` calls per (size, busy, mode), each after a ~30 ms common-start wait,
plus spawning the 2 ranks (a few seconds).

Example::

    probe_exchange_stalls()  # {'stall_share': 0.0, 'median_s': 0.00055, ...}
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from gtopk_lab.bench.timing import common_start_s
from gtopk_lab.comm.launch import run_gloo

__all__ = ["EXCHANGES", "start_after_spin", "exchange", "exchange_times_rank", "summarise_exchanges",
           "probe_exchange_stalls"]

EXCHANGES: tuple[str, ...] = ("all_gather", "isend/irecv", "irecv/isend", "send then recv")
_WARMUP_CALLS = 2  # connections and buffers warm up in the first calls


def start_after_spin(busy_ms: float) -> None:
    """Wait for the common start of the next call, then spin ``busy_ms`` of CPU (a merge's
    worth of work before the round), as every rank of the probe does before an exchange."""
    common_start_s()
    end = time.perf_counter() + busy_ms / 1e3
    while time.perf_counter() < end:
        pass


def exchange(mode: str, buf: Any, rank: int, world_size: int) -> None:
    """One exchange of ``buf`` with the other rank of a 2-rank group, as ``mode`` says."""
    import torch
    import torch.distributed as dist

    peer = 1 - rank
    if mode == "all_gather":
        dist.all_gather([torch.empty_like(buf) for _ in range(world_size)], buf)
        return
    got = torch.empty_like(buf)
    if mode == "isend/irecv":
        for req in (dist.isend(buf, peer), dist.irecv(got, peer)):
            req.wait()
    elif mode == "irecv/isend":
        for req in (dist.irecv(got, peer), dist.isend(buf, peer)):
            req.wait()
    elif rank == 0:
        dist.send(buf, peer)
        dist.recv(got, peer)
    else:
        dist.recv(got, peer)
        dist.send(buf, peer)


def exchange_times_rank(rank: int, world_size: int, sizes: Sequence[int], busy_ms: Sequence[float],
                        calls: int, modes: Sequence[str] = EXCHANGES) -> dict[str, list[float]]:
    """``run_gloo`` target (2 ranks): this rank's times per ``"bytes|busy_ms|mode"``.

    Modes run call by call in turn, so machine noise hits all alike."""
    import torch

    if world_size != 2:
        raise ValueError(f"world_size={world_size} is invalid: the exchange probe needs 2 ranks")
    unknown = [m for m in modes if m not in EXCHANGES]
    if unknown:
        raise ValueError(f"modes={list(modes)!r} is invalid: expected some of {', '.join(EXCHANGES)}")
    out: dict[str, list[float]] = {}
    for nbytes in sizes:
        buf = torch.randint(0, 255, (int(nbytes),), dtype=torch.uint8)
        for busy in busy_ms:
            for call in range(calls + _WARMUP_CALLS):
                for mode in modes:
                    start_after_spin(busy)
                    t0 = time.perf_counter()
                    exchange(mode, buf, rank, world_size)
                    if call >= _WARMUP_CALLS:
                        out.setdefault(f"{int(nbytes)}|{busy:g}|{mode}", []).append(time.perf_counter() - t0)
    return out


def summarise_exchanges(per_rank: Sequence[dict[str, list[float]]], stall_s: float) -> list[dict[str, Any]]:
    """One row per case: bytes, busy_ms, mode, median_s, p10_s, p90_s (slower rank per call)
    and ``stall_share``, the share of calls over ``stall_s``. Needs >= 2 calls per case."""
    rows = []
    for key in per_rank[0]:
        nbytes, busy, mode = key.split("|")
        slow = [max(times) for times in zip(*(r[key] for r in per_rank))]
        deciles = statistics.quantiles(slow, n=10)
        rows.append({"bytes": int(nbytes), "busy_ms": float(busy), "mode": mode, "calls": len(slow),
                     "median_s": statistics.median(slow), "p10_s": deciles[0], "p90_s": deciles[-1],
                     "stall_share": sum(t > stall_s for t in slow) / len(slow)})
    return rows


def probe_exchange_stalls(nbytes: int = 200_000, busy_ms: float = 2.0, calls: int = 20,
                          stall_s: float = 3e-3, timeout_s: float = 120.0) -> dict[str, Any]:
    """The gTop-k round of a 2-rank group (``isend/irecv`` of ``nbytes`` after ``busy_ms``
    of CPU), ``calls`` times: the :func:`summarise_exchanges` row, plus ``stall_s``."""
    if calls < 2:
        raise ValueError(f"calls={calls!r} is invalid: expected an integer >= 2")
    per_rank = run_gloo(exchange_times_rank, 2, [nbytes], [busy_ms], calls, ("isend/irecv",),
                        timeout_s=timeout_s)
    row = summarise_exchanges(per_rank, stall_s)[0]
    row["stall_s"] = stall_s
    return row
