#!/usr/bin/env python
"""Selection and merge on one device (a GPU by default): torch.topk(|x|) versus every selector.

For every ``--numel`` (default 25M and 100M) an N(0,1) fp32 vector is made on ``--device``
and, with k = max(1, floor(density * numel)), the script times:

* ``torch.topk(|x|)``: the bare baseline, ``torch.topk(x.abs(), k, sorted=False)``;
* every selector registered in :mod:`gtopk_lab.compression.selection` (``topk``,
  ``gaussiank``, ``gaussiank-paper``, ``randomk``, ``exactk-threshold``, ...), called as the
  training loop calls it;
* ``merge_sparse`` (:mod:`gtopk_lab.compression.merge`) of two k-sparse vectors (the
  top-k of two independent N(0,1) vectors): the gamma (merge cost) of the device in the
  alpha-beta-gamma model of gTop-k. With ``--device cuda`` the same merge is also timed on
  the CPU (all its threads), so the GPU/CPU ratio is read side by side.

Each case runs ``--warmup`` times untimed, then ``--repeats`` times timed; the table shows the
median in ms, the count selected, the speed-up versus torch.topk and, for the exact
selectors, whether the index set equals torch.topk's. On CUDA a call is timed with CUDA
events recorded around it (the selectors synchronise on their own small host reads;
the events measure the device's span of the call) and the wall time with
``torch.cuda.synchronize()`` on both sides is kept in the JSON output. On CPU it is
``time.perf_counter`` with torch's default thread count (printed in the header).

Absolute milliseconds depend on the machine, its clocks and what else runs on it: the
ratios measured side by side in one run are what matters.

Example::

    python benchmarks/gpu_selection.py                              # cuda, 25M and 100M
    python benchmarks/gpu_selection.py --numel 25M --repeats 10 --json
    python benchmarks/gpu_selection.py --device cpu --numel 1M --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from gtopk_lab.bench.collectives import parse_count_list
from gtopk_lab.compression.merge import merge_sparse
from gtopk_lab.compression.selection import available_selectors, get_selector
from gtopk_lab.config import k_for

BASELINE = "torch.topk(|x|)"
#: Selectors whose index set must equal torch.topk's (up to ties; N(0,1) has none in practice).
EXACT = ("topk", "exactk-threshold")


def _fmt_count(n: int) -> str:
    for suffix, mult in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if n % mult == 0:
            return f"{n // mult}{suffix}"
    return str(n)


def device_name(device: torch.device) -> str:
    """'NVIDIA H200' for CUDA devices, the CPU's model name (or 'cpu') otherwise."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def time_call(fn: Callable[[], Any], device: torch.device, warmup: int,
              repeats: int) -> tuple[list[float], list[float], Any]:
    """(device ms per call, wall ms per call, last result) of ``repeats`` timed calls.

    CUDA: events recorded on the current stream around the call give the device ms; the
    wall ms is perf_counter between two ``torch.cuda.synchronize()``. CPU: both are the
    perf_counter ms.
    """
    out = None
    for _ in range(warmup):
        out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dev_ms, wall_ms = [], []
    for _ in range(repeats):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            torch.cuda.synchronize(device)
            wall_ms.append((time.perf_counter() - t0) * 1e3)
            dev_ms.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            out = fn()
            ms = (time.perf_counter() - t0) * 1e3
            wall_ms.append(ms)
            dev_ms.append(ms)
    return dev_ms, wall_ms, out


def _same_set(idx: torch.Tensor, ref: torch.Tensor) -> bool:
    if idx.numel() != ref.numel():
        return False
    return bool(torch.equal(torch.sort(idx.long()).values, torch.sort(ref.long()).values))


def bench_numel(numel: int, density: float, device: torch.device, warmup: int,
                repeats: int, cpu_merge: bool) -> list[dict[str, Any]]:
    """One row per case (baseline, each selector, merge_sparse) for one vector size."""
    k = k_for(numel, density)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(numel, generator=gen, device=device)
    rows: list[dict[str, Any]] = []

    def add(case: str, kind: str, dev_ms: list[float], wall_ms: list[float], count: int,
            same: bool | None, on: str) -> None:
        rows.append({"case": case, "kind": kind, "device": on, "numel": numel, "k": k, "count": count,
                     "median_ms": statistics.median(dev_ms), "median_wall_ms": statistics.median(wall_ms),
                     "min_ms": min(dev_ms), "times_ms": dev_ms, "same_set_as_topk": same})

    dev_ms, wall_ms, ref = time_call(lambda: torch.topk(x.abs(), k, sorted=False).indices,
                                     device, warmup, repeats)
    add(BASELINE, "baseline", dev_ms, wall_ms, ref.numel(), True, device.type)
    for name in available_selectors():
        sel = get_selector(name)
        if name == "randomk":  # same draws every run, whatever ran before
            torch.manual_seed(0)
        dev_ms, wall_ms, (values, idx) = time_call(lambda: sel(x, k), device, warmup, repeats)
        if values.device != x.device or idx.device != x.device:
            raise RuntimeError(f"selector {name!r} returned tensors on {values.device}/{idx.device}, "
                               f"expected {x.device}")
        add(name, "selector", dev_ms, wall_ms, idx.numel(), _same_set(idx, ref) if name in EXACT else None,
            device.type)
    del x

    # gamma: merge two k-sparse vectors (top-k of two independent N(0,1) vectors)
    pairs = []
    for seed in (1, 2):
        g = torch.Generator(device=device).manual_seed(seed)
        y = torch.randn(numel, generator=g, device=device)
        pairs.append(get_selector("topk")(y, k))
        del y
    (v_a, i_a), (v_b, i_b) = pairs
    merge_on = [(device, (v_a, i_a, v_b, i_b))]
    if cpu_merge and device.type != "cpu":
        merge_on.append((torch.device("cpu"), tuple(t.cpu() for t in (v_a, i_a, v_b, i_b))))
    results = []
    for dev, (va, ia, vb, ib) in merge_on:
        dev_ms, wall_ms, out = time_call(lambda: merge_sparse(va, ia, vb, ib, k), dev, warmup, repeats)
        results.append(out)
        add("merge_sparse(2 x k)", "merge", dev_ms, wall_ms, out[1].numel(), None, dev.type)
    if len(results) == 2:  # the device's merge must equal the CPU's bit for bit
        same = all(torch.equal(a.cpu(), b) for a, b in zip(results[0][:2], results[1][:2]))
        for r in rows[-2:]:
            r["same_as_cpu"] = same

    base = rows[0]["median_ms"]
    for r in rows:
        r["speedup_vs_torch_topk"] = base / r["median_ms"] if r["kind"] != "merge" else None
        if r["kind"] == "merge":
            r["ns_per_input_entry"] = r["median_ms"] * 1e6 / (2 * k)
    merges = [r for r in rows if r["kind"] == "merge"]
    if len(merges) == 2:
        merges[0]["speedup_vs_cpu"] = merges[1]["median_ms"] / merges[0]["median_ms"]
    return rows


def run(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    numels = parse_count_list(args.numel, "--numel")
    if not 0.0 < args.density <= 1.0:
        raise ValueError(f"--density={args.density!r} is invalid: expected a number in (0, 1]")
    if args.repeats < 1:
        raise ValueError(f"--repeats={args.repeats!r} is invalid: expected an integer >= 1")
    if args.warmup < 0:
        raise ValueError(f"--warmup={args.warmup!r} is invalid: expected an integer >= 0")
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device={args.device!r} is invalid: torch {torch.__version__} sees no CUDA "
                             "device here (use --device cpu)")
        if device.index is not None:  # "cuda" alone means the current device
            torch.cuda.set_device(device)
        device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise ValueError(f"--device={args.device!r} is invalid: expected cuda, cuda:N or cpu")
    meta = {"device": str(device), "device_name": device_name(device), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cpu_threads": torch.get_num_threads(),
            "density": args.density, "warmup": args.warmup, "repeats": args.repeats,
            "timer": "cuda events" if device.type == "cuda" else "perf_counter"}
    rows: list[dict[str, Any]] = []
    for numel in numels:
        rows += bench_numel(numel, args.density, device, args.warmup, args.repeats, not args.no_cpu_merge)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return meta, rows


def print_table(meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    print(f"# {meta['device_name']} ({meta['device']}), torch {meta['torch']}"
          f"{', CUDA ' + meta['cuda'] if meta['cuda'] and meta['device'] != 'cpu' else ''}; "
          f"{meta['cpu_threads']} CPU threads; timer: {meta['timer']}; median of {meta['repeats']} "
          f"after {meta['warmup']} warm-up(s)")
    print("# absolute ms depend on this machine and moment: the ratios measured side by side "
          "in this run are what matters")
    print(f"{'case':<22} {'on':<4} {'numel':>6} {'k':>7} {'count':>7} {'median ms':>10} "
          f"{'min ms':>9} {'vs topk':>8} {'exact':>6}")
    for r in rows:
        speed = f"{r['speedup_vs_torch_topk']:>7.2f}x" if r["speedup_vs_torch_topk"] is not None else f"{'':>8}"
        exact = {True: "yes", False: "NO", None: ""}[r["same_set_as_topk"]]
        line = (f"{r['case']:<22} {r['device']:<4} {_fmt_count(r['numel']):>6} {r['k']:>7} {r['count']:>7} "
                f"{r['median_ms']:>10.3f} {r['min_ms']:>9.3f} {speed} {exact:>6}")
        if r["kind"] == "merge":
            line += f"  {r['ns_per_input_entry']:.2f} ns/entry"
            if "speedup_vs_cpu" in r:
                line += f", {r['speedup_vs_cpu']:.1f}x the CPU"
            if "same_as_cpu" in r:
                line += ", bitwise = CPU" if r["same_as_cpu"] else ", DIFFERS from CPU"
        print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--numel", default="25M,100M", help="vector sizes, e.g. 25M,100M (default)")
    parser.add_argument("--density", type=float, default=0.001, help="k = density * numel (default 0.001)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per case (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per case first (default 1)")
    parser.add_argument("--no-cpu-merge", action="store_true",
                        help="with a GPU, do not also time merge_sparse on the CPU")
    parser.add_argument("--json", action="store_true", help="print JSON ({meta, rows}) instead of the table")
    args = parser.parse_args(argv)
    try:
        meta, rows = run(args)
    except ValueError as exc:
        print(f"gpu_selection: error: {exc}", file=sys.stderr)
        return 2
    bad = [r["case"] for r in rows if r["same_set_as_topk"] is False or r.get("same_as_cpu") is False]
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=1))
    else:
        print_table(meta, rows)
        if bad:
            print(f"# MISMATCH: {', '.join(sorted(set(bad)))} (exact selection or merge differs)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
