"""Rank functions for tests/test_faults.py: ``train_rank``'s signature, real gloo
collectives, epoch checkpoints, and faults on demand (``config.custom``).

`dask worker` subprocesses import this module by name (tests/ is on their PYTHONPATH), so
it imports nothing from pytest or the tests.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from gtopk_lab.config import RunConfig
from gtopk_lab.training import checkpoint as ckpt

#: Headroom above the current address space that RLIMIT_AS leaves, and the allocation
#: that then fails (a model-sized buffer): the host's memory is never touched.
RLIMIT_HEADROOM = 256 * 2**20
OOM_REQUEST = 2**30


def _address_space() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def allocate_under_rlimit() -> None:
    """Allocate a 1 GiB tensor under an RLIMIT_AS of the current size + 256 MiB: torch's
    allocator fails with ENOMEM as it would on a full machine. The limit is restored."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + RLIMIT_HEADROOM, hard))
    try:
        torch.empty(OOM_REQUEST, dtype=torch.uint8).fill_(1)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def total_iterations(config: RunConfig) -> int:
    return config.max_iterations or config.epochs * int(config.custom.get("iters_per_epoch", 4))


def step(w: torch.Tensor, g: torch.Tensor, world: int) -> None:
    """The "training step" of :func:`toy_train` (the test replays it for the expected weights)."""
    w += 0.001 * g / world


def expected_weights(config: RunConfig) -> torch.Tensor:
    """The weights an uninterrupted :func:`toy_train` run ends with."""
    w = torch.zeros(4, dtype=torch.float64)
    world = config.workers
    for it in range(total_iterations(config)):
        step(w, torch.full((4,), float(sum(r + it + 1 for r in range(world))), dtype=torch.float64),
             world)
    return w


def _row(config: RunConfig, rank: int, it: int, world: int, loss: float) -> dict[str, Any]:
    return {"kind": "iter", "rank": rank, "iteration": it, "epoch": it / 100.0,
            "method": config.method, "workers": world, "density": config.density, "k": 1,
            "train_loss": loss, "lr": config.lr, "compute_s": 0.0, "selection_s": 0.0,
            "comm_s": 0.0, "update_s": 0.0, "comm_model_s": 0.0, "bytes_sent": 32,
            "bytes_recv": 32, "wall_time_s": 0.0, "virtual_time_s": 0.0}


def toy_train(config: RunConfig, sink=None, device=None, checkpoint_dir: str | None = None,
              resume_from: str | None = None) -> SimpleNamespace:
    """A deterministic all-reduce "training" loop with epoch checkpoints.

    ``config.custom``: ``iters_per_epoch`` (4), ``sleep_s`` per iteration (0.01),
    ``oom_rank``/``oom_at`` (that rank allocates under RLIMIT_AS at that iteration),
    ``marker_dir`` (each rank writes ``began-rank<R>.json`` when it starts training and
    ``rank<R>-from<I>.json`` when it ends: how, when, from which iteration, and ``began``:
    when the rank started training). The summary's ``final_train_loss`` is the weights' sum.
    """
    began = time.time()
    extra = config.custom
    rank, world = dist.get_rank(), dist.get_world_size()
    if extra.get("marker_dir"):
        Path(extra["marker_dir"], f"began-rank{rank}.json").write_text(json.dumps({"rank": rank, "at": began}))
    per_epoch = int(extra.get("iters_per_epoch", 4))
    w = torch.zeros(4, dtype=torch.float64)
    start = 0
    latest = ckpt.resume_point(resume_from, world) if resume_from else None
    if latest is not None:
        w = ckpt.load_rank_state(resume_from, latest["epoch"], rank)["w"]
        start = latest["iteration"]
    rows: list[dict[str, Any]] = []
    buffer: list[dict[str, Any]] = []
    ended, detail = "returned", ""
    try:
        for it in range(start, total_iterations(config)):
            if rank == extra.get("oom_rank") and it == extra.get("oom_at"):
                allocate_under_rlimit()
            g = torch.full((4,), float(rank + it + 1), dtype=torch.float64)
            dist.all_reduce(g)
            step(w, g, world)
            row = _row(config, rank, it, world, float(w.sum()))
            rows.append(row)
            buffer.append(row)
            if len(buffer) >= config.sink_every and sink is not None:
                sink(buffer)
                buffer = []
            if checkpoint_dir and (it + 1) % per_epoch == 0:
                epoch = (it + 1) // per_epoch
                ckpt.save_rank_state(checkpoint_dir, epoch, rank, {"w": w.clone()})
                dist.barrier()
                if rank == 0:
                    ckpt.write_latest(checkpoint_dir, epoch, it + 1, world)
            time.sleep(float(extra.get("sleep_s", 0.01)))
        if buffer and sink is not None:
            sink(buffer)
    except BaseException as exc:
        ended, detail = type(exc).__name__, str(exc)[:500]
        raise
    finally:
        if extra.get("marker_dir"):  # written aside, then renamed: a test may be polling
            marker = Path(extra["marker_dir"], f"rank{rank}-from{start}.json")
            aside = marker.with_name(f".{marker.name}.tmp")
            aside.write_text(json.dumps({"rank": rank, "ended": ended, "detail": detail, "at": time.time(),
                                         "start": start, "began": began}))
            os.replace(aside, marker)
    return SimpleNamespace(rows=rows, summary={"iterations": len(rows),
                                               "final_train_loss": float(w.sum())})
