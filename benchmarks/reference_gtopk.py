#!/usr/bin/env python3
"""gtopk-lab's gTop-k against a port of the reference's, side by side on the same inputs.

The reference is hclhkbu/gtopkssgd (``allreducer.gtopk_sparse_allreduce``, mpi4py + numpy).
This file ports what one of its calls does, from reading that code (no code copied):

1. pack: one numpy buffer ``[indices | values]`` of 2k entries, the concatenation of the
   int64 indices and the fp32 values, hence float64 (16 bytes a pair on the wire; every
   index below 2**53 is exact in a float64);
2. tree reduce to rank 0 in log2(P) rounds: in round r the ranks ``0, 2**r, 2*2**r, ...``
   pair up; the upper one ``comm.Send``s its buffer (as ``MPI.FLOAT``, i.e. its raw bytes),
   the lower one ``comm.Recv``s it into a preallocated buffer and merges: shared indices by
   ``np.intersect1d(..., return_indices=True)``, their values added into its own, zeroed
   in the received copy, then top-k by magnitude of the 2k concatenated values (a full
   ``argsort`` of |v|, last k) and re-pack; a ``comm.Barrier()`` ends every round;
3. ``comm.Bcast`` of rank 0's 2k buffer; every rank unpacks indices and values;
4. ``np.intersect1d`` of the rank's own indices with the result (the reference returns
   which of its entries were included, for its residuals).

Its result is not canonical (rank 0's merge order); the check sorts it by index. It
equals ours (``gtopk_allreduce``, tree and butterfly, real gloo ranks) bitwise at P = 2, 4
up to the tie rule: we keep the lower index among equal fp32 magnitudes, the reference
orders by |v| in float64 (round-2 sums are not yet rounded to fp32) and then by
``argsort``'s unspecified order; a difference confined to such ties is reported as such.

Inputs, per (seed, rank, numel): x ~ N(0, 1) fp32 from ``numpy.random.default_rng([seed,
rank])``, its top-k by magnitude in descending order (ties: lower index), as
``torch.topk`` hands it to training. Both sides generate them from (seed, rank); the MPI
ranks report a digest that the driver checks against its own.

Transports (``--transports gloo,shm``): ours runs once per transport, the same ranks' inputs,
``GTOPK_LAB_SHM=0`` for gloo's TCP loopback, ``=1`` for the shared-memory rings of
:mod:`gtopk_lab.comm.links_transport` (the row says which one the ranks really used); ``cpu``
is the process CPU time per call of the median rank (a transport that spins shows it there).

Timing, two protocols, the same for both sides (ours with ``exact_k=True`` as training runs it):

- **back to back** (the headline, as the reference is used: its training loop calls it once
  an iteration straight after the selection, and its own ``benchmark_gtopk_sparse_allreduce``
  times 10 calls in a row after one warm call): after ``--warmup`` calls, one common start,
  then ``--repeats`` calls in a row; per rank (end - start) / repeats, the slowest rank's.
  200 calls after 20 warm ones by default: at 1M a call is 0.1-0.5 ms, and 20 calls (the
  earlier default) were a 2-4 ms window in which one preemption on the 2-core VM moved the
  reference's P = 2 figure from 0.25 to 0.45-0.53 ms (benchmarks/RESULTS.md, 2026-12-07);
- **from a common start** (the earlier figures): every call starts at an instant all ranks
  agreed on (a MAX allreduce of ``monotonic() + 30 ms``, a sleep, then a 0.5 ms spin), per
  call the slowest rank's time, median over ``--repeats`` calls after ``--warmup``; each
  call thus begins on a core that has just slept (ours: ``gtopk_lab.bench.timing``).

The reference's calls exclude making their fresh input copies (its caller does that: the
merge adds into the values array in place): they are made before the timed stretch.

Needs mpi4py and an ``mpiexec`` (the project's venv has neither): make a separate venv::

    python3 -m venv /tmp/mpivenv && /tmp/mpivenv/bin/pip install numpy mpi4py mpich
    .venv/bin/python benchmarks/reference_gtopk.py --mpi-python /tmp/mpivenv/bin/python

Without them it prints why and exits 0 (skipped). This module imports only numpy at the
top: the MPI ranks run it in that venv, which has no torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MPI_VENV_HINT = ("python3 -m venv /tmp/mpivenv && /tmp/mpivenv/bin/pip install numpy mpi4py mpich; "
                 "then pass --mpi-python /tmp/mpivenv/bin/python")
START_MARGIN_S = 0.03


# --------------------------------------------------------------------------------------------
# inputs (both sides)
def rank_inputs(seed: int, rank: int, numel: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s local top-k of x ~ N(0,1) fp32: (values fp32 [k], indices int64 [k]),
    descending |x|, ties to the lower index. Cost: one normal draw, one argpartition, a sort of k."""
    x = np.random.default_rng([seed, rank]).standard_normal(numel, dtype=np.float32)
    mag = np.abs(x)
    threshold = np.partition(mag, numel - k)[numel - k]
    above = np.flatnonzero(mag > threshold)
    tied = np.flatnonzero(mag == threshold)[: k - above.size]  # ascending: lower indices first
    chosen = np.concatenate([above, tied])
    order = chosen[np.lexsort((chosen, -mag[chosen]))]
    return x[order].copy(), order.astype(np.int64)


def digest(values: np.ndarray, indices: np.ndarray) -> str:
    """Short sha256 of the bytes of a sparse pair (the cross-venv input check)."""
    return hashlib.sha256(values.tobytes() + indices.tobytes()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# the reference's algorithm (MPI ranks)
def _ref_topk(a: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest |a|: the reference's full argsort, last k."""
    return np.abs(a).argsort()[-k:]


def reference_gtopk(comm: Any, values: np.ndarray, indexes: np.ndarray,
                    storage: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One call of the reference gTop-k (module docstring, steps 1-4) on this MPI rank.

    ``values`` is modified in place (as in the reference). Returns (values, indices,
    included positions). Cost: log2(P) rounds of 16 k bytes, each merge an intersect1d and an
    argsort of 2k (O(k log k)), a barrier per round, a Bcast of 16 k bytes.
    """
    from mpi4py import MPI

    size, rank, k = comm.size, comm.rank, len(indexes)
    original = indexes
    send = np.concatenate((indexes, values))  # int64 + fp32 -> float64
    send[:k], send[k:] = indexes.astype(np.uint32), values.astype(np.float32)
    recv = storage.get("recv")
    if recv is None or recv.size < 2 * k:
        recv = storage["recv"] = np.zeros_like(send)
    recv = recv[: 2 * k]
    step = 1
    for _ in range(int(np.log2(size))):
        members = range(0, size, step)
        if rank in members:
            local = members.index(rank)
            if local % 2 == 0:
                comm.Recv([recv, MPI.FLOAT], source=members[local + 1])
                their_idx = recv[:k].astype(np.int64)
                their_val = recv[k:]
                _, c1, c2 = np.intersect1d(indexes, their_idx, assume_unique=False, return_indices=True)
                values[c1] += their_val[c2]
                their_val[c2] = 0.0
                top = _ref_topk(np.concatenate((values, their_val)), k)
                first, second = top[top < k], top[top >= k] - k
                indexes = np.concatenate((indexes[first], their_idx[second]))
                values = np.concatenate((values[first], their_val[second]))
                send = np.concatenate((indexes, values))
                send[:k], send[k:] = indexes.astype(np.uint32), values.astype(np.float32)
            else:
                comm.Send([send, MPI.FLOAT], dest=members[local - 1])
        step *= 2
        comm.Barrier()
    if rank == 0:
        send = np.concatenate((indexes, values))
        indexes, values = indexes.astype(np.uint32), values.astype(np.float32)
        send[:k], send[k:] = indexes, values
    else:
        send = recv[: 2 * k]
    comm.Bcast(send, root=0)
    if rank != 0:
        indexes, values = send[:k].astype(np.uint32), send[k:].astype(np.float32)
    _, included, _ = np.intersect1d(original, indexes, assume_unique=False, return_indices=True)
    return values, indexes, included


def _mpi_common_start(comm: Any) -> float:
    """Wait for an instant every rank agreed on (one MAX allreduce), spinning the last 0.5 ms;
    returns it (``time.monotonic``)."""
    from mpi4py import MPI

    start = comm.allreduce(time.monotonic() + START_MARGIN_S, op=MPI.MAX)
    while time.monotonic() < start - 0.0005:
        time.sleep(0.0002)
    while time.monotonic() < start:
        pass
    return start


def mpi_worker(numels: Sequence[int], density: float, seed: int, repeats: int, warmup: int,
               out_dir: Path) -> None:
    """Every MPI rank: time the reference per numel; rank 0 writes times + canonical results."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    report: dict[str, Any] = {"workers": comm.size, "numpy": np.__version__,
                              "mpi": MPI.Get_library_version().splitlines()[0].strip(), "cases": []}
    for numel in numels:
        k = max(1, int(density * numel))
        values, indices = rank_inputs(seed, comm.rank, numel, k)
        digests = comm.gather(digest(values, indices), root=0)
        storage: dict[str, np.ndarray] = {}
        times = []
        result = None
        for rep in range(warmup + repeats):
            fresh = values.copy()  # the caller's fresh selection (the merge adds into it)
            _mpi_common_start(comm)
            t0 = time.perf_counter()
            result = reference_gtopk(comm, fresh, indices, storage)
            if rep >= warmup:
                times.append(time.perf_counter() - t0)
        fresh_copies = [values.copy() for _ in range(repeats)]
        start = _mpi_common_start(comm)
        for fresh in fresh_copies:
            result = reference_gtopk(comm, fresh, indices, storage)
        b2b = comm.gather((time.monotonic() - start) / repeats, root=0)
        all_times = comm.gather(times, root=0)
        assert result is not None
        if comm.rank == 0:
            slowest = [max(ts) for ts in zip(*all_times)]
            order = np.argsort(result[1], kind="stable")
            np.savez(out_dir / f"ref_P{comm.size}_n{numel}.npz", values=result[0][order],
                     indices=result[1][order].astype(np.int64))
            report["cases"].append({"numel": numel, "k": k, "median_s": statistics.median(slowest),
                                    "b2b_s": max(b2b), "times_s": slowest, "digests": digests})
    if comm.rank == 0:
        (out_dir / f"ref_P{comm.size}.json").write_text(json.dumps(report))


# --------------------------------------------------------------------------------------------
# ours (gloo ranks of the project's venv)
def _ours_rank(rank: int, world_size: int, numels: Sequence[int], density: float, seed: int,
               repeats: int, warmup: int) -> list[dict[str, Any]]:
    """``run_gloo`` target: per numel and algorithm, this rank's call times (wall, process CPU),
    the transport it used and its result."""
    import torch

    from gtopk_lab.bench.timing import common_start_s
    from gtopk_lab.comm.torch_dist import gtopk_allreduce
    from gtopk_lab.comm.transport_choice import transport_kind

    kind = transport_kind()

    rows = []
    for numel in numels:
        k = max(1, int(density * numel))
        v_np, i_np = rank_inputs(seed, rank, numel, k)
        values, indices = torch.from_numpy(v_np), torch.from_numpy(i_np)
        for algorithm in ("tree", "butterfly"):
            times, cpus = [], []
            result = None
            for rep in range(warmup + repeats):
                common_start_s()
                t0, c0 = time.perf_counter(), time.process_time()
                result = gtopk_allreduce(values, indices, numel, k, algorithm=algorithm, exact_k=True)
                if rep >= warmup:
                    times.append(time.perf_counter() - t0)
                    cpus.append(time.process_time() - c0)
            start, _late = common_start_s()
            for _ in range(repeats):
                result = gtopk_allreduce(values, indices, numel, k, algorithm=algorithm, exact_k=True)
            b2b = (time.monotonic() - start) / repeats
            assert result is not None
            rows.append({"numel": numel, "k": k, "algorithm": algorithm, "times_s": times, "b2b_s": b2b,
                         "cpu_s": statistics.median(cpus), "transport": kind,
                         "digest": digest(v_np, i_np), "values": result.values.numpy().copy(),
                         "indices": result.indices.numpy().astype(np.int64)})
    return rows


def run_ours(workers: int, numels: Sequence[int], density: float, seed: int, repeats: int,
             warmup: int, transport: str = "gloo") -> list[dict[str, Any]]:
    """One gloo group of ``workers`` ranks (``transport``: "gloo" or "shm", the shared-memory
    rings where the ranks can use them); per (numel, algorithm): median of the slowest rank,
    the median rank's CPU per call, the digests of the inputs, rank 0's result, and whether
    every rank holds it bitwise."""
    sys.path.insert(0, str(REPO))
    from gtopk_lab.comm.launch import run_gloo

    before = os.environ.get("GTOPK_LAB_SHM")
    os.environ["GTOPK_LAB_SHM"] = "1" if transport == "shm" else "0"  # the ranks adopt this environment
    try:
        per_rank = run_gloo(_ours_rank, workers, list(numels), density, seed, repeats, warmup, timeout_s=600)
    finally:
        if before is None:
            os.environ.pop("GTOPK_LAB_SHM", None)
        else:
            os.environ["GTOPK_LAB_SHM"] = before
    out = []
    for j, row0 in enumerate(per_rank[0]):
        rows = [r[j] for r in per_rank]
        slowest = [max(ts) for ts in zip(*(r["times_s"] for r in rows))]
        same = all(np.array_equal(r["values"].view(np.uint32), row0["values"].view(np.uint32))
                   and np.array_equal(r["indices"], row0["indices"]) for r in rows)
        out.append({**{key: row0[key] for key in ("numel", "k", "algorithm", "values", "indices")},
                    "median_s": statistics.median(slowest), "b2b_s": max(r["b2b_s"] for r in rows),
                    "digests": [r["digest"] for r in rows],
                    "ranks_agree": same, "cpu_s": statistics.median(r["cpu_s"] for r in rows),
                    "transport": "/".join(sorted({r["transport"] for r in rows}))})
    return out


def compare(ref_v: np.ndarray, ref_i: np.ndarray, our_v: np.ndarray, our_i: np.ndarray) -> str:
    """"equal" (same indices, bitwise same fp32 values, both by ascending index), "ties" (the
    sets differ only among entries whose |value| equals the k-th largest), else "DIFFERENT"."""
    if np.array_equal(ref_i, our_i) and np.array_equal(ref_v.view(np.uint32), our_v.view(np.uint32)):
        return "equal"
    if ref_i.size != our_i.size:
        return "DIFFERENT"
    common, a, b = np.intersect1d(ref_i, our_i, return_indices=True)
    if not np.array_equal(ref_v[a].view(np.uint32), our_v[b].view(np.uint32)):
        return "DIFFERENT"
    kth = np.sort(np.abs(our_v))[0]
    only = np.concatenate([np.delete(ref_v, a), np.delete(our_v, b)])
    return "ties" if np.all(np.abs(only) == kth) else "DIFFERENT"


def run_reference(mpiexec: str, mpi_python: str, workers: int, args: argparse.Namespace,
                  out_dir: Path) -> dict[str, Any]:
    """``mpiexec -n P <mpi_python> this_file --mpi-worker ...``; returns rank 0's report."""
    cmd = [mpiexec, "-n", str(workers), mpi_python, str(Path(__file__).resolve()), "--mpi-worker",
           "--numel", args.numel, "--density", str(args.density), "--seed", str(args.seed),
           "--repeats", str(args.repeats), "--warmup", str(args.warmup), "--out-dir", str(out_dir)]
    subprocess.run(cmd, check=True, timeout=args.timeout, env={**os.environ, "OMP_NUM_THREADS": "1",
                                                               "OPENBLAS_NUM_THREADS": "1"})
    return json.loads((out_dir / f"ref_P{workers}.json").read_text())


def find_mpi(mpi_python: str) -> tuple[str | None, str]:
    """(mpiexec path, "") when ``mpi_python`` imports mpi4py and an mpiexec exists (beside that
    interpreter first, then on PATH); else (None, why)."""
    probe = subprocess.run([mpi_python, "-c", "import mpi4py, numpy"], capture_output=True, text=True)
    if probe.returncode != 0:
        return None, f"{mpi_python} cannot import mpi4py and numpy"
    beside = Path(mpi_python).parent / "mpiexec"
    mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec")
    if mpiexec is None:
        return None, "no mpiexec beside that interpreter or on PATH"
    return mpiexec, ""


def parse_counts(text: str, flag: str) -> list[int]:
    """"1M,25M" -> [1000000, 25000000] (decimal K/M/G); ValueError naming ``flag``."""
    out = []
    for part in text.split(","):
        part = part.strip().upper()
        mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(part[-1:], 1)
        digits = part[:-1] if mult > 1 else part
        if not digits.isdigit() or int(digits) * mult < 1:
            raise ValueError(f"{flag}={text!r} is invalid: expected positive counts such as 1M,25M")
        out.append(int(digits) * mult)
    return out


def _label(n: int) -> str:
    return f"{n // 10**6}M" if n % 10**6 == 0 else str(n)


#: the two timing protocols (module docstring), as the table names them, and their keys
PROTOCOLS = (("b2b", "b2b_s"), ("start", "median_s"))
RoundKey = tuple[int, int, str, str]


def _report(p: int, ref: dict[str, Any], ours: list[dict[str, Any]], tmp: Path,
            per_round: dict[RoundKey, list[tuple[float, float, float]]]) -> bool:
    """Print two rows per numel of one run of ours beside the reference (back to back, then
    from a common start); True if a check failed."""
    failed = False
    for case in ref["cases"]:
        n = case["numel"]
        saved = np.load(tmp / f"ref_P{p}_n{n}.npz")
        by_alg = {r["algorithm"]: r for r in ours if r["numel"] == n}
        checks = {}
        for alg, r in by_alg.items():
            if r["digests"] != case["digests"]:
                raise RuntimeError(f"P={p} numel={n}: the two venvs generated different inputs "
                                   f"({case['digests']} vs {r['digests']})")
            checks[alg] = compare(saved["values"], saved["indices"], r["values"], r["indices"])
            if not r["ranks_agree"]:
                checks[alg] += "/ranks differ"
            failed |= checks[alg] not in ("equal", "ties")
        tree, bfly = by_alg["tree"], by_alg["butterfly"]
        for protocol, key in PROTOCOLS:
            t_ref, t_tree, t_bfly = case[key], tree[key], bfly[key]
            cpu = (f"{tree['cpu_s'] * 1e3:>9.2f} {bfly['cpu_s'] * 1e3:>9.2f}" if protocol == "start"
                   else f"{'-':>9} {'-':>9}")
            print(f"{p:>3} {_label(n):>6} {case['k']:>6} {tree['transport']:>5} {protocol:>6} {t_ref * 1e3:>10.2f} "
                  f"{t_tree * 1e3:>8.2f} {t_bfly * 1e3:>10.2f} {t_ref / t_tree:>8.2f}x {t_ref / t_bfly:>8.2f}x "
                  f"{cpu} {checks['tree']:>11} {checks['butterfly']:>11}", flush=True)
            per_round.setdefault((p, n, tree["transport"], protocol), []).append((t_ref, t_tree, t_bfly))
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4", help="world sizes, powers of two (default 2,4)")
    parser.add_argument("--numel", default="1M,25M", help="buffer sizes (default 1M,25M)")
    parser.add_argument("--density", type=float, default=0.001, help="k = density * numel (default 0.001)")
    parser.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per case (default 200)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed calls first (default 20)")
    parser.add_argument("--mpi-python", default=sys.executable,
                        help="interpreter with mpi4py + numpy for the reference ranks (default: this one)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="alternate the reference and ours this many times per P and print the "
                             "median of the per-round ratios too (default 1): on a shared box the "
                             "state drifts between the two jobs of one round")
    parser.add_argument("--transports", default="gloo,shm",
                        help="ours over these transports, one run each: gloo (TCP loopback), shm "
                             "(shared-memory rings) (default gloo,shm)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mpiexec run (default 600)")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        numels = parse_counts(args.numel, "--numel")
        workers = parse_counts(args.workers, "--workers")
        if any(p < 2 or p & (p - 1) for p in workers):
            raise ValueError(f"--workers={args.workers!r} is invalid: expected powers of two >= 2 "
                             "(the reference runs log2(P) rounds)")
        if not 0.0 < args.density <= 1.0:
            raise ValueError(f"--density={args.density!r} is invalid: expected a number in (0, 1]")
        if args.rounds < 1:
            raise ValueError(f"--rounds={args.rounds!r} is invalid: expected an integer >= 1")
        transports = [t.strip() for t in args.transports.split(",") if t.strip()]
        if not transports or any(t not in ("gloo", "shm") for t in transports):
            raise ValueError(f"--transports={args.transports!r} is invalid: expected gloo, shm or both")
        if args.repeats < 1 or args.warmup < 0:
            raise ValueError(f"--repeats={args.repeats!r}/--warmup={args.warmup!r} is invalid: "
                             "expected repeats >= 1 and warmup >= 0")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.mpi_worker:
        mpi_worker(numels, args.density, args.seed, args.repeats, args.warmup, Path(args.out_dir))
        return 0
    mpiexec, why = find_mpi(args.mpi_python)
    if mpiexec is None:
        print(f"skipped: the reference needs mpi4py and mpiexec ({why}). Make a separate venv: "
              f"{MPI_VENV_HINT}")
        return 0
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"# reference gTop-k (port of hclhkbu/gtopkssgd, mpi4py, {args.mpi_python}) vs gtopk_allreduce "
          f"(exact-k; transports {', '.join(transports)}) on 127.0.0.1; density {args.density}, seed {args.seed}; ms per call = "
          f"after {args.warmup} warm-up calls: b2b = {args.repeats} calls back to back, slowest rank's mean; "
          f"start = median of {args.repeats} calls each from a common start, slowest rank per call")
    print(f"# host: {cores} cores, load average {' '.join(load)} at start"
          + (f"; up to {max(workers)} ranks share them" if max(workers) > (cores or 1) else ""))
    print(f"{'P':>3} {'numel':>6} {'k':>6} {'via':>5} {'timing':>6} {'reference':>10} {'tree':>8} {'butterfly':>10} "
          f"{'ref/tree':>9} {'ref/bfly':>9} {'cpu tree':>9} {'cpu bfly':>9} {'check tree':>11} {'check bfly':>11}")
    failed = False
    per_round: dict[RoundKey, list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ref-gtopk-") as tmp:
        for p in (p for p in workers for _ in range(args.rounds)):
            ref = run_reference(mpiexec, args.mpi_python, p, args, Path(tmp))
            for transport in transports:
                ours = run_ours(p, numels, args.density, args.seed, args.repeats, args.warmup, transport)
                failed |= _report(p, ref, ours, Path(tmp), per_round)
    if args.rounds > 1:
        print(f"# median over {args.rounds} rounds (times: medians; ratios: the median of the "
              "rounds' ratios; min-max of the ratios)")
        for (p, n, via, protocol), rows in per_round.items():
            ref_t, tree_t, bfly_t = (statistics.median(col) for col in zip(*rows))
            r_tree = sorted(r / t for r, t, _ in rows)
            r_bfly = sorted(r / b for r, _, b in rows)
            print(f"{p:>3} {_label(n):>6} {max(1, int(args.density * n)):>6} {via:>5} {protocol:>6} {ref_t * 1e3:>10.2f} "
                  f"{tree_t * 1e3:>8.2f} {bfly_t * 1e3:>10.2f} {statistics.median(r_tree):>8.2f}x "
                  f"{statistics.median(r_bfly):>8.2f}x   tree {r_tree[0]:.2f}-{r_tree[-1]:.2f}x, "
                  f"butterfly {r_bfly[0]:.2f}-{r_bfly[-1]:.2f}x")
    print(f"# reference ranks: numpy {ref['numpy']}, {ref['mpi']}; load average "
          f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])} at end")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
