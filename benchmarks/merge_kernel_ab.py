#!/usr/bin/env python3
"""The compiled merge and wire sort of this checkout against those of an earlier commit.

``gtopk_lab/compression/fast_merge.py`` at ``--rev`` is loaded from git as a module of its
own (numba compiles it once, without a disk cache), and both kernels are timed call by
call in turn on the same canonical operands, so that the machine's noise hits both alike:

- ``merge``: :func:`numba_merge` of two ranks' top-k selections in the wire format (k
  pairs each, ascending indices) down to k, the step every gTop-k round makes;
- ``wire sort``: :func:`numba_wire_sort` of one ``torch.topk`` selection (magnitude order),
  which a gTop-k call makes once before its first round.

``--sleep-ms`` (default 0 and 30) sleeps before every call: a rank between two
collectives has waited for its peers, and its caches and TLB are cold. Results are
checked bitwise equal. Example (one thread)::

    PYTHONPATH=. .venv/bin/python benchmarks/merge_kernel_ab.py --rev f6835e2 --numel 1M,25M
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gtopk_lab.bench.collectives import parse_count_list  # noqa: E402
from gtopk_lab.compression import fast_merge  # noqa: E402

KERNEL_PATH = "gtopk_lab/compression/fast_merge.py"


def load_revision(rev: str, workdir: Path) -> ModuleType:
    """fast_merge.py as it was at ``rev``, imported as module ``fast_merge_<rev>``."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{KERNEL_PATH}"], check=True,
                            capture_output=True, text=True).stdout
    # the disk cache is keyed by file path and time: a temporary file would litter it
    source = source.replace("numba.njit(cache=True, nogil=True)", "numba.njit(cache=False, nogil=True)")
    path = workdir / f"fast_merge_{rev}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.warm_up()
    return module


def operands(numel: int, k: int, seed: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, torch.Tensor]]:
    """(the first round's two operands: two ranks' top-k of independent N(0, 1) gradients in
    the wire format, ascending int32 indices; the first rank's raw selection, magnitude order).
    Top-k values crowd a narrow band of magnitudes (about 3.3-5 at density 0.001), which is
    what the merge's selection sees in a real run, unlike N(0, 1) draws."""
    gen = torch.Generator().manual_seed(seed)
    ops: list[torch.Tensor] = []
    raw: tuple[torch.Tensor, torch.Tensor] | None = None
    for _ in range(2):
        x = torch.randn(numel, generator=gen)
        selected = torch.topk(x.abs(), k).indices
        raw = raw or (x[selected].contiguous(), selected)
        idx = selected.sort().values
        ops += [x[idx].contiguous(), idx.to(torch.int32)]
    assert raw is not None
    return tuple(ops), raw


def _same(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return all(x.dtype == y.dtype and torch.equal(x.view(torch.int32) if x.dtype == torch.float32 else x,
                                                  y.view(torch.int32) if y.dtype == torch.float32 else y)
               for x, y in zip(a, b))


def time_in_turn(calls: dict[str, Callable[[], object]], repeats: int, sleep_s: float) -> dict[str, float]:
    """Median ms per call of each, the calls made in turn."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            if sleep_s:
                time.sleep(sleep_s)
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/merge_kernel_ab.py", description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the earlier commit")
    parser.add_argument("--numel", default="1M,25M")
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--sleep-ms", default="0,30")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    fast_merge.warm_up()
    with tempfile.TemporaryDirectory() as tmp:
        old = load_revision(args.rev, Path(tmp))
        print(f"# fast_merge at {args.rev} vs this checkout; one thread, median of {args.repeats} "
              f"calls made in turn; ms per call")
        print(f"{'numel':>6} {'k':>7} {'sleep':>6} {'kernel':>10} {args.rev:>10} {'now':>8} {'ratio':>7}  same")
        for numel in parse_count_list(args.numel, "--numel"):
            k = max(1, int(numel * args.density))
            ops, raw = operands(numel, k, seed=numel)
            same_merge = _same(old.numba_merge(*ops, k), fast_merge.numba_merge(*ops, k))
            same_sort = _same(old.numba_wire_sort(*raw)[2:], fast_merge.numba_wire_sort(*raw)[2:])
            for sleep_ms in (float(s) for s in args.sleep_ms.split(",")):
                merge = time_in_turn({"old": lambda: old.numba_merge(*ops, k),
                                      "now": lambda: fast_merge.numba_merge(*ops, k)},
                                     args.repeats, sleep_ms / 1e3)
                sort = time_in_turn({"old": lambda: old.numba_wire_sort(*raw),
                                     "now": lambda: fast_merge.numba_wire_sort(*raw)},
                                    args.repeats, sleep_ms / 1e3)
                for name, t, same in (("merge", merge, same_merge), ("wire sort", sort, same_sort)):
                    print(f"{numel:>6} {k:>7} {sleep_ms:>4g}ms {name:>10} {t['old']:>10.3f} {t['now']:>8.3f} "
                          f"{t['old'] / t['now']:>6.2f}x  {'equal' if same else 'DIFFERENT'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
