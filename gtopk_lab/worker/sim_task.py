"""The function Dask runs for a *simulated* run: P virtual ranks as one task on one worker.

A study's points with more ranks than the cluster hosts run in the simulator
(:func:`~gtopk_lab.training.simulator.simulate`), but on the cluster, never in the client:
the :class:`~gtopk_lab.orchestration.lab.Lab` reserves one free worker for the task, as it
reserves P workers for a real run, so a simulated run never shares a worker with a real
rank (the simulator's measured compute would otherwise include the rank's). Per task:

1. torch is limited to one thread (the worker's core is the task's; virtual time charges
   one rank's compute, so more threads would only make the measurement depend on the host)
2. ``simulate(config, sink)`` with the same :class:`~gtopk_lab.worker.rank_task.EventSink`
   real ranks use: rows reach the client live on the run's topic, and a cancel from the
   client stops the simulation at its next sink call
3. the result travels back like rank 0's (``{"rank": 0, "rows", "summary", ...}``), so
   the Lab stores a simulated run exactly as a real one, with ``simulated: True``

Cost: the simulator's (P forward/backward passes per iteration on one core).
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from gtopk_lab.worker.rank_task import EventSink, RankFailed, to_plain

__all__ = ["run_simulated"]


def run_simulated(config_dict: dict[str, Any], cancel_key: str, *,
                  checkpoint_dir: str | None = None, resume_from: str | None = None,
                  threads: int = 1) -> dict[str, Any]:
    """Simulate the run ``config_dict`` on this Dask worker (steps 1-3 above).

    Returns ``{"rank": 0, "worker", "rows", "summary", "backend": "simulated", "device"}``;
    an exception reaches the client as :class:`~gtopk_lab.worker.rank_task.RankFailed`
    of rank 0 with its traceback.
    """
    import torch
    from distributed import get_worker

    from gtopk_lab.comm.allocator import tune_for_collectives
    from gtopk_lab.config import RunConfig
    from gtopk_lab.training.simulator import simulate

    tune_for_collectives()  # its ranks' messages, as on real ranks (comm.allocator)
    config = RunConfig.from_dict(config_dict)
    if not config.run_id:
        raise ValueError("run_id=None is invalid: the client assigns a run id before submitting")
    worker = get_worker()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    try:
        sink = EventSink(worker, config.run_id, 0, cancel_key=cancel_key)
        result = simulate(config, sink=sink, checkpoint_dir=checkpoint_dir, resume_from=resume_from)
        return {"rank": 0, "worker": str(worker.address), "rows": to_plain(list(result.rows)),
                "summary": to_plain(dict(result.summary)), "backend": "simulated",
                "device": str(result.summary.get("device", "cpu"))}
    except BaseException as exc:
        raise RankFailed(0, str(worker.address), f"{type(exc).__name__}: {exc}",
                         traceback.format_exc(), time.time()) from None
    finally:
        torch.set_num_threads(previous_threads)
