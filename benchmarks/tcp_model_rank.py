"""One rank of ``benchmarks/tcp_model.py``: times collectives over real TCP between testbed hosts.

Run inside a testbed host (``Testbed.popen``) as
``python benchmarks/tcp_model_rank.py SPEC.json RANK``; the spec names the world size, the
store address (host 0), this rank's address and the cases. Per case:

1. agree on a start instant with every rank (``common_start_s``: one monotonic clock, since the
   namespaces share one kernel), then time the call from it to this rank's return (wall) and
   this thread's CPU over the call (``time.thread_time``: the off-wire CPU, as gloo's own I/O
   threads are not counted);
2. the first call is a warm-up (connections, allocations); ``repeats`` timed calls follow;
3. ``available_cores()``: the cores these ranks get right now (other jobs load the box).

Writes ``OUT/rank<r>.json``: per case the times, the CPU per call and the rounds of the last
call (``CommStats.steps``). Cases: ``dense``, ``topk`` (allgather), ``gtopk_butterfly``,
``gtopk_tree``, ``oktopk`` (the faithful Ok-Topk with its state; thresholds reused between
re-evaluations) and ``incast`` (every other rank sends its k pairs to rank 0 at once).
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from gtopk_lab.bench.timing import available_cores, common_start_s
from gtopk_lab.comm.launch import bind_to_interface, set_single_thread
from gtopk_lab.comm.oktopk import OkTopkFaithfulState, oktopk_faithful_allreduce
from gtopk_lab.comm.torch_dist import dense_allreduce, gtopk_allreduce, topk_allgather
from gtopk_lab.compression.selection import get_selector
from gtopk_lab.config import k_for
from gtopk_lab.network.calibrate import pingpong_medians
from gtopk_lab.network.pacing import wait_until


class _Stats:
    """The rounds of the incast case, shaped like ``CommStats`` (steps only)."""

    def __init__(self, steps: list[tuple[int, int]]) -> None:
        self.steps = steps


class _Result:
    def __init__(self, steps: list[tuple[int, int]]) -> None:
        self.stats = _Stats(steps)


def _incast(rank: int, world: int, payload: torch.Tensor) -> _Result:
    """Every rank > 0 sends ``payload`` to rank 0 in one round; rank 0 receives them all at once."""
    n = payload.numel()
    if rank == 0:
        bufs = [torch.empty_like(payload) for _ in range(world - 1)]
        reqs = [dist.irecv(b, src) for b, src in zip(bufs, range(1, world))]
        for r in reqs:
            r.wait()
        return _Result([(0, n * (world - 1))])
    dist.isend(payload, 0).wait()
    return _Result([(n, 0)])


def _call(case: dict[str, Any], rank: int, world: int, data: dict[tuple[int, float], Any]
          ) -> Callable[[], Any]:
    """The call one case times, on this rank's data (selection done beforehand, as in training)."""
    numel, density, name = int(case["numel"]), float(case.get("density", 0.001)), case["collective"]
    key = (numel, density)
    if key not in data:
        k = k_for(numel, density)
        x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        values, indices = get_selector("topk")(x, k)
        data.clear()  # one size in memory at a time (8 ranks x 25M on a small box)
        data[key] = (x, values, indices, k)
    x, values, indices, k = data[key]
    if name == "dense":
        buf = x.clone()
        return lambda: dense_allreduce(buf)
    if name == "topk":
        return lambda: topk_allgather(values, indices, numel, exact_count=k)
    if name in ("gtopk_butterfly", "gtopk_tree"):
        algorithm = name.split("_")[1]
        return lambda: gtopk_allreduce(values, indices, numel, k, algorithm=algorithm, exact_k=True)
    if name == "oktopk":
        state = OkTopkFaithfulState()
        return lambda: oktopk_faithful_allreduce(x, k, state=state)[0]
    if name == "incast":
        payload = torch.zeros(k * 8, dtype=torch.uint8)  # k (fp32 value, int32 index) pairs
        return lambda: _incast(rank, world, payload)
    raise ValueError(f"collective={name!r} is invalid: expected dense, topk, gtopk_butterfly, gtopk_tree, "
                     "oktopk or incast")


def run_case(case: dict[str, Any], rank: int, world: int, data: dict) -> dict[str, Any]:
    """Steps 1-3 of the module docstring for one case."""
    call = _call(case, rank, world, data)
    cores = available_cores()
    times, cpus, procs, result = [], [], [], None
    for rep in range(int(case["repeats"]) + 1):
        start, _late = common_start_s()
        cpu0, proc0 = time.thread_time(), time.process_time()
        result = call()
        elapsed = time.monotonic() - start
        if rep > 0:
            times.append(elapsed)
            cpus.append(time.thread_time() - cpu0)
            procs.append(time.process_time() - proc0)  # with gloo's own threads, for the log
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the call ends when its slowest rank returns
    return {**case, "workers": world, "times_s": times, "slowest_s": slowest.tolist(),
            "median_s": statistics.median(slowest.tolist()), "cpu_s": statistics.median(cpus),
            "process_cpu_s": statistics.median(procs),
            "available_cores": cores, "steps": [list(s) for s in result.stats.steps]}


def main(spec_path: str, rank: int) -> None:
    spec = json.loads(Path(spec_path).read_text())
    world = int(spec["world"])
    own = spec["addresses"][rank]
    bind_to_interface(own)
    set_single_thread()
    timeout = datetime.timedelta(seconds=float(spec.get("timeout_s", 300)))
    store = dist.TCPStore(spec["addresses"][0], int(spec["port"]), world, rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    out: dict[str, Any] = {"rank": rank, "world": world, "cases": []}
    if spec.get("pingpong_sizes"):
        out["pingpong_s"] = pingpong_medians(rank, world, spec["pingpong_sizes"], int(spec["pingpong_repeats"]), 2)
    data: dict = {}
    for j, case in enumerate(spec["cases"]):
        if spec.get("slot_s"):  # two jobs at once: case j of both starts at the same instant
            dist.barrier()
            wait_until(float(spec["base_monotonic_s"]) + j * float(spec["slot_s"]), clock=time.monotonic)
        out["cases"].append(run_case(case, rank, world, data))
    dist.barrier()
    dist.destroy_process_group()
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
