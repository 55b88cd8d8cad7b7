"""Per-round delays of paced gTop-k calls against the wake-up probe (issue 27 item 5).

For each algorithm (butterfly, tree), P real gloo ranks make ``--calls`` paced gTop-k calls
of ``--numel`` at ``--density`` on ``--bandwidth`` and record, per round, how long after
the round's paced deadline the rank returns from its wait
(:mod:`gtopk_lab.bench.round_delays`); the wake-up probe
(:func:`gtopk_lab.comm.timing.wakeup_delay_s`) runs before and after. With ``--busy N``
N busy loops (other jobs) run beside the ranks, and are stopped at the end.

Printed per algorithm: the probe's delay (median and mean of its rounds), the mean excess
per round position (slowest rank per call), and the mean and median over rounds; the claim
checked is that the butterfly's excess per round is of the order of the probe's delay (the
tree's per-position figures mix ranks on different rounds, see
:func:`gtopk_lab.bench.round_delays.summarise_round_delays`).

    PYTHONPATH=. .venv/bin/python benchmarks/wakeup_rounds.py --workers 4 --busy 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--bandwidth", default="1Gbps")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside the ranks (default 0)")
    args = parser.parse_args(argv)
    if args.workers < 2 or args.calls < 1 or args.busy < 0:
        print("error: expected --workers >= 2, --calls >= 1, --busy >= 0", file=sys.stderr)
        return 2
    from gtopk_lab.bench.round_delays import round_delays_rank, summarise_round_delays
    from gtopk_lab.comm.launch import run_gloo

    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        print(f"# P = {args.workers}, numel {args.numel}, density {args.density}, {args.bandwidth}, "
              f"{args.calls} calls, {args.busy} busy loops, load {os.getloadavg()[0]:.1f}, "
              f"{os.cpu_count()} cores")
        for algorithm in ("butterfly", "tree"):
            per_rank = run_gloo(round_delays_rank, args.workers, args.numel, args.density, args.bandwidth,
                                args.calls, algorithm, timeout_s=300)
            s = summarise_round_delays(per_rank)
            rounds = " ".join(f"{x * 1e3:.2f}" for x in s["per_round_excess_s"])
            print(f"{algorithm:<9} window {s['window_s'] * 1e3:.2f} ms: probe median {s['probe_median_s'] * 1e3:.2f}, "
                  f"mean {s['probe_mean_s'] * 1e3:.2f} ms/round; "
                  f"excess per round (slowest rank, mean of {s['calls']} calls) {rounds} ms; mean "
                  f"{s['mean_excess_s'] * 1e3:.2f}, median {s['median_excess_s'] * 1e3:.2f} ms")
    finally:
        for p in loops:
            p.kill()
            p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
