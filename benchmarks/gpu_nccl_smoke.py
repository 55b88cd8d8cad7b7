#!/usr/bin/env python
"""Smoke test of the collectives with CUDA tensors: NCCL P=1, gloo P=2/4 on cuda:0, NCCL P=2.

Every case compares what the real collectives return with a CPU reference computed by the
in-process simulator (:mod:`gtopk_lab.comm.inprocess`: the same per-rank programs, bitwise
equal to gloo on CPU). The collectives: ``dense_allreduce``, ``topk_allgather``,
``gtopk_allreduce`` (butterfly and tree) and ``oktopk_allreduce``. Inputs: rank r's vector
of ``--numel`` distinct magnitudes (multiples of 1/8, random signs; sums exact in any order)
and its top-k by |x|, selected on the device and checked against the CPU's top-k.

1. ``sim-cuda``: the simulator itself on CUDA tensors (every merge on the GPU) for
   P = 2, 4, 8 must equal the simulator on CPU tensors bit for bit.
2. ``nccl-p1``: a one-rank NCCL group (``init_method=tcp://127.0.0.1:<free port>``) in this
   process: a raw NCCL all_reduce, then every collective on cuda:0 tensors; results must
   stay on the GPU and equal the CPU reference.
3. ``gloo-p2-cuda-inputs``, ``gloo-p4-cuda-inputs``: P = 2 and 4 gloo ranks
   (``gtopk_lab.comm.launch.run_gloo``) whose inputs live on cuda:0; gloo carries them
   through host memory. Results must be on cuda, identical on every rank and equal to the
   CPU reference.
4. ``nccl-p2-one-gpu``: two NCCL ranks sharing the one GPU. NCCL usually refuses this
   ("Duplicate GPU detected"); the outcome is REPORTed and never fails the script. When it
   works, the collectives are checked as in 3.

Without CUDA every case is SKIPped (exit code 0). ``--device cpu`` runs the same harness on
CPU tensors with gloo in place of NCCL: a dry run that checks this script, not the GPU.
Exit code 1 when a required case (1-3) fails. ``--json PATH`` also writes the cases as JSON.

Usage::

    python benchmarks/gpu_nccl_smoke.py [--numel 200000] [--density 0.01] [--json out.json]
    python benchmarks/gpu_nccl_smoke.py --device cpu        # dry run of the harness
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import queue as queue_mod
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

#: (collective, algorithm) of every checked call; keys of the result dicts are "name/algo".
CASES: tuple[tuple[str, str], ...] = (
    ("dense_allreduce", "ring"), ("topk_allgather", "ring"),
    ("gtopk_allreduce", "butterfly"), ("gtopk_allreduce", "tree"), ("oktopk_allreduce", "ok"),
)
#: Largest --numel: distinct multiples of 1/8 up to numel/8 stay exact in fp32 (and their sums).
MAX_NUMEL = 2**20

Result = dict[str, Any]  # "name/algo" -> (values, indices or None) on CPU, or an error string


def make_inputs(rank: int, numel: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s dense vector and its top-k (values, int32 indices), on CPU.

    x = random sign * (a random permutation of 1..numel) / 8: every |x| differs (so CPU and
    GPU top-k pick the same set) and every sum of a few ranks' entries is exact in fp32,
    whatever the summation order of the backend.
    """
    from gtopk_lab.compression.selection import get_selector

    gen = torch.Generator().manual_seed(100 + rank)
    magnitude = (torch.randperm(numel, generator=gen) + 1).to(torch.float32) / 8
    sign = torch.randint(0, 2, (numel,), generator=gen).to(torch.float32) * 2 - 1
    x = magnitude * sign
    values, indices = get_selector("topk")(x, k)
    return x, values, indices


def reference(world: int, numel: int, k: int) -> Result:
    """CPU results of every case for ``world`` ranks, from the in-process simulator."""
    from gtopk_lab.comm.inprocess import (
        sim_dense_allreduce, sim_gtopk_allreduce, sim_oktopk_allreduce, sim_topk_allgather,
    )

    inputs = [make_inputs(r, numel, k) for r in range(world)]
    xs, vs, ids = [i[0].clone() for i in inputs], [i[1] for i in inputs], [i[2] for i in inputs]
    out: Result = {"dense_allreduce/ring": (sim_dense_allreduce(xs)[0].values, None)}
    res = sim_topk_allgather(vs, ids, numel)[0]
    out["topk_allgather/ring"] = (res.values, res.indices)
    for algo in ("butterfly", "tree"):
        res = sim_gtopk_allreduce(vs, ids, numel, k, algo)[0]
        out[f"gtopk_allreduce/{algo}"] = (res.values, res.indices)
    res = sim_oktopk_allreduce(vs, ids, numel, k)[0]
    out["oktopk_allreduce/ok"] = (res.values, res.indices)
    return out


def run_collectives(rank: int, numel: int, k: int, device: torch.device) -> Result:
    """Every case on this rank's inputs moved to ``device`` (default process group).

    Results come back on the CPU; a case that raises, or whose result is not on ``device``,
    is an error string instead, so one broken collective does not hide the others.
    """
    from gtopk_lab import collectives as C
    from gtopk_lab.compression.selection import get_selector

    x, values, indices = make_inputs(rank, numel, k)
    x = x.to(device)
    gv, gi = get_selector("topk")(x, k)  # select on the device too: same set as the CPU's
    order_g, order_c = torch.argsort(gi.long()).cpu(), torch.argsort(indices.long())
    if not (torch.equal(gi.cpu()[order_g], indices[order_c]) and torch.equal(gv.cpu()[order_g], values[order_c])):
        raise AssertionError(f"rank {rank}: top-k on {device} differs from the CPU top-k")
    values, indices = gv, gi
    out: Result = {}
    for name, algo in CASES:
        key = f"{name}/{algo}"
        try:
            if name == "dense_allreduce":
                res = C.dense_allreduce(x.clone())
            elif name == "topk_allgather":
                res = C.topk_allgather(values, indices, numel)
            elif name == "gtopk_allreduce":
                res = C.gtopk_allreduce(values, indices, numel, k, algorithm=algo)
            else:
                res = C.oktopk_allreduce(values, indices, numel, k)
            where = {t.device for t in (res.values, res.indices) if t is not None}
            if where != {device}:
                out[key] = f"result on {sorted(map(str, where))}, expected {device}"
                continue
            out[key] = (res.values.cpu(), None if res.indices is None else res.indices.cpu())
        except Exception as exc:  # noqa: BLE001 - reported per collective
            out[key] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:500]}"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out


def compare(got: Result, ref: Result) -> list[str]:
    """'name/algo' of every case that errored or differs from ``ref`` (bitwise), with the reason."""
    bad = []
    for key, expected in ref.items():
        value = got.get(key, "missing")
        if isinstance(value, str):
            bad.append(f"{key} ({value})")
            continue
        if isinstance(expected, str):
            bad.append(f"{key} (reference errored: {expected})")
            continue
        (gv, gi), (rv, ri) = value, expected
        same = torch.equal(gv, rv) and ((gi is None and ri is None) or
                                        (gi is not None and ri is not None and torch.equal(gi, ri)))
        if not same:
            bad.append(f"{key} (differs)")
    return bad


# ------------------------------------------------------------------------------------------
# rank entry points (module level: spawned processes import them by reference)
def gloo_rank(rank: int, world: int, numel: int, k: int, device: str) -> Result:
    """run_gloo entry: the collectives on inputs that live on ``device``, over gloo."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return run_collectives(rank, numel, k, dev)


def shared_gpu_rank(rank: int, world: int, port: int, numel: int, k: int, results: Any,
                    timeout_s: float, device: str, backend: str) -> None:
    """One of ``world`` ranks that all use ``device``; puts (rank, stage, ok, pickled payload)."""
    stage = "init_process_group"
    dev = torch.device(device)
    try:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout_s))
        stage = "raw all_reduce"
        t = torch.full((4,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        expected = float(world * (world + 1) // 2)
        if not torch.equal(t.cpu(), torch.full((4,), expected)):
            raise AssertionError(f"raw {backend} all_reduce gave {t.tolist()}, expected {expected}")
        stage = "collectives"
        results.put((rank, stage, True, pickle.dumps(run_collectives(rank, numel, k, dev))))
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent
        results.put((rank, stage, False,
                     pickle.dumps(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")))
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


# ------------------------------------------------------------------------------------------
# cases: each returns (ok, one-line detail)
def case_sim(numel: int, k: int, device: torch.device) -> tuple[bool, str]:
    from gtopk_lab.comm.inprocess import sim_gtopk_allreduce, sim_topk_allgather

    for world in (2, 4, 8):
        inputs = [make_inputs(r, numel, k) for r in range(world)]
        vs, ids = [i[1] for i in inputs], [i[2] for i in inputs]
        dvs, dids = [v.to(device) for v in vs], [i.to(device) for i in ids]
        for algo in ("butterfly", "tree"):
            cpu = sim_gtopk_allreduce(vs, ids, numel, k, algo)
            dev = sim_gtopk_allreduce(dvs, dids, numel, k, algo)
            for r, (a, b) in enumerate(zip(cpu, dev)):
                if not (b.values.device == device and torch.equal(a.values, b.values.cpu())
                        and torch.equal(a.indices, b.indices.cpu())):
                    return False, f"P={world} gtopk {algo}: rank {r}'s {device} result differs from CPU"
        cpu = sim_topk_allgather(vs, ids, numel)[0]
        dev = sim_topk_allgather(dvs, dids, numel)[0]
        if not (torch.equal(cpu.values, dev.values.cpu()) and torch.equal(cpu.indices, dev.indices.cpu())):
            return False, f"P={world} topk_allgather: {device} result differs from CPU"
    return True, f"simulated gtopk butterfly/tree + topk_allgather on {device} == cpu, P=2,4,8"


def case_p1(numel: int, k: int, device: torch.device, backend: str, timeout_s: float) -> tuple[bool, str]:
    from gtopk_lab.comm.launch import free_port

    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=timeout_s))
    try:
        t = torch.arange(8, dtype=torch.float32, device=device)
        dist.all_reduce(t)
        if not torch.equal(t.cpu(), torch.arange(8, dtype=torch.float32)):
            return False, f"raw {backend} all_reduce (P=1) changed the tensor: {t.tolist()}"
        got = run_collectives(0, numel, k, device)
    finally:
        dist.destroy_process_group()
    bad = compare(got, reference(1, numel, k))
    if bad:
        return False, "vs CPU reference: " + "; ".join(bad)
    return True, f"backend {backend}, {len(got)} collectives on {device} == CPU reference"


def case_gloo(world: int, numel: int, k: int, device: torch.device, timeout_s: float) -> tuple[bool, str]:
    from gtopk_lab.comm.launch import run_gloo

    per_rank = run_gloo(gloo_rank, world, numel, k, str(device), timeout_s=timeout_s)
    for r in range(1, world):
        bad = compare(per_rank[r], per_rank[0])
        if bad:
            return False, f"rank {r} vs rank 0: " + "; ".join(bad)
    bad = compare(per_rank[0], reference(world, numel, k))
    if bad:
        return False, "vs CPU reference: " + "; ".join(bad)
    return True, f"{world} gloo ranks, inputs and results on {device}, identical, == CPU reference"


def case_shared_device(world: int, numel: int, k: int, device: torch.device, backend: str,
                       timeout_s: float) -> tuple[bool, str]:
    """``world`` ranks of ``backend`` on the one ``device``; ok=False when refused or broken."""
    import torch.multiprocessing as mp

    from gtopk_lab.comm.launch import free_port

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=shared_gpu_rank, name=f"shared-rank-{r}", daemon=True,
                         args=(r, world, port, numel, k, results, timeout_s, str(device), backend))
             for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, tuple[str, bool, Any]] = {}
    limit = timeout_s + 45.0  # start-up (imports, CUDA context) + the group's own timeout
    deadline = time.monotonic() + limit
    try:
        while len(got) < world and time.monotonic() < deadline:
            try:
                rank, stage, ok, payload = results.get(timeout=0.5)
                got[rank] = (stage, ok, pickle.loads(payload))
            except queue_mod.Empty:
                if all(not p.is_alive() for p in procs) and results.empty():
                    break
    finally:
        for p in procs:
            p.join(2.0 if len(got) == world else 0.1)
            if p.is_alive():
                p.kill()
                p.join(2.0)
    if len(got) < world:
        missing = sorted(set(range(world)) - set(got))
        stages = {r: v[0] for r, v in got.items()}
        first_error = next((v[2].strip().splitlines()[0] for v in got.values() if not v[1]), "")
        return False, (f"ranks {missing} did not report within {limit:.0f} s (others: {stages}; exit codes "
                       f"{[p.exitcode for p in procs]}) {first_error}").strip()
    failed = {r: v for r, v in got.items() if not v[1]}
    if failed:
        r, (stage, _, msg) = sorted(failed.items())[0]
        return False, f"rank {r} failed at {stage}: {msg.strip().splitlines()[0]}"
    for r in range(1, world):
        bad = compare(got[r][2], got[0][2])
        if bad:
            return False, f"{backend} ran but rank {r} vs rank 0: " + "; ".join(bad)
    bad = compare(got[0][2], reference(world, numel, k))
    if bad:
        return False, f"{backend} ran but vs CPU reference: " + "; ".join(bad)
    return True, f"{backend} accepted {world} ranks on one {device.type} device; identical, == CPU reference"


def _nccl_version() -> str:
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # noqa: BLE001
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (default); cpu = dry run of this harness with gloo instead of NCCL")
    parser.add_argument("--numel", type=int, default=200_000, help=f"elements per rank (default 200000, "
                                                                   f"at most {MAX_NUMEL})")
    parser.add_argument("--density", type=float, default=0.01, help="k = density * numel (default 0.01)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per process group (default 60)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON")
    args = parser.parse_args(argv)
    from gtopk_lab.config import k_for

    if not 1 <= args.numel <= MAX_NUMEL:
        parser.error(f"--numel={args.numel} is invalid: expected 1 <= numel <= {MAX_NUMEL}")
    k = k_for(args.numel, args.density)
    cuda = torch.cuda.is_available()
    if args.device == "cuda":
        device, backend, runnable = torch.device("cuda", 0), "nccl", cuda
        what = (f"{torch.cuda.get_device_name(0)}, NCCL {_nccl_version()}" if cuda
                else "no CUDA device: every case is skipped")
    else:
        device, backend, runnable = torch.device("cpu"), "gloo", True
        what = "DRY RUN on CPU tensors with gloo in place of NCCL (checks this script, not a GPU)"
    print(f"# gpu_nccl_smoke: torch {torch.__version__} (CUDA {torch.version.cuda}); {what}; "
          f"numel={args.numel}, k={k}", flush=True)
    plan: list[tuple[str, bool, Any]] = [
        ("sim-cuda", True, lambda: case_sim(args.numel, k, device)),
        ("nccl-p1", True, lambda: case_p1(args.numel, k, device, backend, args.timeout)),
        ("gloo-p2-cuda-inputs", True, lambda: case_gloo(2, args.numel, k, device, args.timeout)),
        ("gloo-p4-cuda-inputs", True, lambda: case_gloo(4, args.numel, k, device, args.timeout)),
        # reported only; NCCL may hang rather than refuse, so it gets at most 30 s + start-up
        ("nccl-p2-one-gpu", False,
         lambda: case_shared_device(2, args.numel, k, device, backend, min(args.timeout, 30.0))),
    ]
    rows, failed = [], []
    for name, required, fn in plan:
        t0 = time.perf_counter()
        if not runnable:
            status, msg = "SKIP", "no CUDA device (torch.cuda.is_available() is False)"
        else:
            try:
                ok, msg = fn()
            except Exception as exc:  # noqa: BLE001 - one broken case must not hide the others
                ok, msg = False, f"{type(exc).__name__}: {' | '.join(str(exc).strip().splitlines()[-3:])[:2000]}"
            status = "PASS" if ok else ("FAIL" if required else "REPORT")
            if not ok and required:
                failed.append(name)
        seconds = time.perf_counter() - t0
        rows.append({"case": name, "status": status, "required": required, "seconds": seconds, "detail": msg})
        print(f"{status:<6} {name:<20} {seconds:6.1f}s  {msg}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"torch": torch.__version__, "device": args.device, "cuda": cuda, "backend": backend,
                       "numel": args.numel, "k": k, "cases": rows}, f, indent=1)
    passed = sum(r["status"] == "PASS" for r in rows)
    print(f"# {passed} passed, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else "")
          + ("" if runnable else f", {len(rows)} skipped (no CUDA)"))
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    sys.exit(main())
