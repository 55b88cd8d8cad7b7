"""Where does a throttled sparse collective's time go? (device diagnostic)

Produced benchmarks/logs/2026-11-29-h200-diag.log (then benchmarks/device_runs/) on the 16-core H200 host:
1. merge CPU of two top-k selections (2 x 25k pairs), back to back versus after an idle
   1.6 ms (the paced round before a merge), with P ranks merging at once;
2. per-phase medians of gtopk_allreduce (butterfly, tree) at P = 2, 4 under
   VirtualClock(1 Gbit/s, throttle=True): _P2P rounds, pacing sleep and overshoot, merge
   wall/CPU, the clock's MAX all_reduce, total.

It ran from the repository root as ``PYTHONPATH=. python3 benchmarks/device_runs/diag.py``
(that folder is now benchmarks/logs/). Kept beside its log as the record of that run: it
patches ``gtopk_lab.collectives._P2P`` and ``merge_sparse``, which moved to
``gtopk_lab.comm`` later, so it no longer runs as is. Its successor is the profile that
``gtopk-lab bench collectives`` prints (hooks in ``gtopk_lab.comm.profiling``).
"""
import statistics, sys, time
import torch
import torch.distributed as dist
from gtopk_lab.comm.launch import run_gloo


def gamma_rank(rank, world, idle_s):
    from gtopk_lab.compression.merge import merge_sparse
    from gtopk_lab.compression.selection import get_selector
    numel, k = 25_000_000, 25_000
    sel = get_selector("topk")
    a = sel(torch.randn(numel, generator=torch.Generator().manual_seed(rank)), k)
    b = sel(torch.randn(numel, generator=torch.Generator().manual_seed(rank + 100)), k)
    out = []
    for mode in ("b2b", "idle"):
        dist.barrier()
        cpu, wall = [], []
        for _ in range(12):
            if mode == "idle":
                time.sleep(idle_s)
            t0, c0 = time.perf_counter(), time.process_time()
            merge_sparse(a[0], a[1], b[0], b[1], k)
            cpu.append(time.process_time() - c0); wall.append(time.perf_counter() - t0)
        out.append((mode, statistics.median(cpu[2:]) * 1e3, statistics.median(wall[2:]) * 1e3))
    return out


def timeline_rank(rank, world, algo):
    import gtopk_lab.collectives as C
    import gtopk_lab.network.pacing as PC
    from gtopk_lab.compression.selection import get_selector
    from gtopk_lab.network.clock import VirtualClock
    from gtopk_lab.network.model import NetworkModel
    numel, k = 25_000_000, 25_000
    v, i = get_selector("topk")(torch.randn(numel, generator=torch.Generator().manual_seed(rank)), k)
    clock = VirtualClock(NetworkModel.from_strings("1Gbps"), throttle=True)
    T = {}
    def add(name, dt): T.setdefault(name, 0.0); T[name] += dt
    orig_run = C._P2P.run
    def run(self, *a):
        t0 = time.perf_counter(); r = orig_run(self, *a); add("p2p_run", time.perf_counter() - t0); return r
    C._P2P.run = run
    orig_sleep = PC.LinkPacer._sleep_until
    def sl(self, deadline):
        t0 = time.perf_counter(); want = max(0.0, deadline - t0); orig_sleep(self, deadline)
        got = time.perf_counter() - t0; add("pace_sleep", got); add("pace_overshoot", got - want)
    PC.LinkPacer._sleep_until = sl
    orig_merge = C.merge_sparse
    def mg(*a):
        t0, c0 = time.perf_counter(), time.process_time(); r = orig_merge(*a)
        add("merge_wall", time.perf_counter() - t0); add("merge_cpu", time.process_time() - c0); return r
    C.merge_sparse = mg
    orig_max = clock._max_over_ranks
    def mx(*a):
        t0 = time.perf_counter(); r = orig_max(*a); add("clock_sync", time.perf_counter() - t0); return r
    clock._max_over_ranks = mx
    rows = []
    for rep in range(9):
        dist.barrier()
        T.clear()
        t0 = time.perf_counter()
        clock.collective(C.gtopk_allreduce, v, i, numel, k, algorithm=algo)
        T["total"] = time.perf_counter() - t0
        rows.append(dict(T))
    keys = sorted(rows[-1])
    return {kk: round(statistics.median(r.get(kk, 0.0) for r in rows[2:]) * 1e3, 3) for kk in keys}


if __name__ == "__main__":
    print("nproc", __import__("os").cpu_count())
    for p in (2, 4, 8):
        print(f"gamma P={p} (ms per 2x25k merge: mode, cpu, wall):", run_gloo(gamma_rank, p, 0.0016, timeout_s=120))
    for p in (2, 4):
        for algo in ("butterfly", "tree"):
            res = run_gloo(timeline_rank, p, algo, timeout_s=120)
            for r, d in enumerate(res):
                print(f"timeline P={p} {algo} rank {r}:", d)
