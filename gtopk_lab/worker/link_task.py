"""The Dask task of a link calibration: one rank of a ping-pong between two workers.

``gtopk-lab calibrate --scheduler ADDRESS`` (client side:
:func:`gtopk_lab.orchestration.link_calibration.calibrate_cluster`) runs
:func:`calibrate_link_rank` on two workers of a cluster, such as two hosts of
``gtopk-lab testbed``. Each task

1. joins a two-rank gloo group exactly as a training rank does
   (:func:`~gtopk_lab.worker.rank_task.join_process_group`: bound to the interface that
   carries its worker's address, rendezvous through a Dask Variable and rank 0's TCPStore);
2. ping-pongs every size with its partner (:func:`gtopk_lab.network.calibrate.pingpong_medians`)
   over the transport the runs' point-to-point collectives take between these workers
   (:func:`~gtopk_lab.comm.transport_choice.round_trip_over`: the project's own TCP links
   between hosts), so alpha is that transport's per-message time;
3. with ``tcp_cases`` (``--tcp-terms fit``), times those collective calls on the same group
   (:func:`gtopk_lab.worker.tcp_calls.time_cases`), on which the client fits the TCP terms;
4. destroys the group and returns its medians (and timed cases), so the client fits alpha
   and beta of the link the ranks of a run would use.

Cost: ``sum(sizes) * 2 * (repeats + warmup)`` bytes on the link, plus the group's set-up.
Worker side only.
"""

from __future__ import annotations

import datetime
from typing import Any

from gtopk_lab.comm.transport_choice import round_trip_over
from gtopk_lab.network.calibrate import pingpong_medians
from gtopk_lab.worker.rank_task import join_process_group
from gtopk_lab.worker.tcp_calls import time_cases

__all__ = ["calibrate_link_rank"]


def calibrate_link_rank(rank: int, world: int, key: str, sizes: list[int], repeats: int, warmup: int,
                        timeout_s: float, tcp_cases: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Rank ``rank`` of ``world`` of the ping-pong named ``key`` (module docstring).
    Returns ``{"rank", "worker", "interface", "medians_s", "tcp_cases", "transport"}``
    (``tcp_cases``: None without ``tcp_cases``; ``transport``: "tcp", "shm" or "gloo")."""
    import torch
    import torch.distributed as dist
    from distributed import get_client, get_worker

    torch.set_num_threads(1)
    worker = get_worker()
    timeout = datetime.timedelta(seconds=float(timeout_s))
    store, binding = join_process_group(worker, get_client(), key, rank, world, "gloo", timeout)
    try:
        transport, round_trip = round_trip_over()
        medians = pingpong_medians(rank, world, sizes, repeats, warmup, round_trip=round_trip)
        timed = time_cases(tcp_cases, rank, world) if tcp_cases else None
    finally:
        dist.destroy_process_group()
        del store
    return {"rank": rank, "worker": str(worker.address), "interface": binding.interface,
            "medians_s": medians, "tcp_cases": timed, "transport": transport}
