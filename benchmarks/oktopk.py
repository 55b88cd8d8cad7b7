#!/usr/bin/env python
"""Ok-Topk vs gTop-k vs Top-k AllGather, and wait-free backprop accuracy/hiding.

    python benchmarks/oktopk.py scaling  --numel 1M --density 0.01 --workers 8,16,32,64,128,256
    python benchmarks/oktopk.py real     --workers 8 --numel 1M --density 0.01
    python benchmarks/oktopk.py overlap  --workers 4 --epochs 8 --density 0.01

``scaling``: P virtual ranks in one process (gtopk_lab.comm.oktopk.sim_oktopk_allreduce and the
project's sim_gtopk_allreduce / sim_topk_allgather: the real per-rank message programs),
per-iteration communication time modelled from each rank's CommStats.steps on the network
(max over ranks of sum(alpha + beta * max(sent, recv)); the VirtualClock's rule). Inputs:
per-rank gradients g_r = shared + noise (heavy-tailed), top-k selected. Ok-Topk re-balances
every 16 calls: the table shows the steady-state call and the amortised mean.
``real``: the same collectives on P real gloo processes on 127.0.0.1, each call wrapped in a
VirtualClock on the emulated link (modelled time), plus the loopback wall time.
``overlap``: MNIST-1D, P gloo ranks, per-layer gTop-k overlapped with backward
(gtopk_lab.integrations.overlap) vs whole-model gTop-k vs dense; test accuracy and hidden communication.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from gtopk_lab.analysis.predict import collective_time_s
from gtopk_lab.comm.inprocess import sim_gtopk_allreduce, sim_topk_allgather
from gtopk_lab.compression.selection import get_selector
from gtopk_lab.config import k_for
from gtopk_lab.counts import parse_count
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.comm.oktopk import OkTopkState, sim_oktopk_allreduce
from gtopk_lab.methods.formulas import oktopk_model_time_s

REBALANCE_EVERY = 16


def make_selections(world: int, numel: int, k: int, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-rank top-k of g_r = shared + noise (Student-t like tails): overlapping supports."""
    gen = torch.Generator().manual_seed(seed)
    shared = torch.randn(numel, generator=gen) * torch.rand(numel, generator=gen) ** 4
    vs, is_ = [], []
    select = get_selector("topk")
    for _ in range(world):
        g = shared + 0.5 * torch.randn(numel, generator=gen) * torch.rand(numel, generator=gen) ** 4
        v, i = select(g, k)
        vs.append(v)
        is_.append(i)
    return vs, is_


def modelled_s(results: list, net: NetworkModel) -> float:
    return max(net.steps_time_s(r.stats.steps) for r in results)


def cmd_scaling(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    numel = parse_count(args.numel, "--numel")
    k = k_for(numel, args.density)
    nets = [NetworkModel.from_strings(b, lat) for b, lat in
            (("1Gbps", None), ("1Gbps", "50us"), ("1GbE", None))]
    print(f"numel={numel} k={k} pair=8 B; modelled per-iteration communication (ms), max over ranks\n")
    rows = []
    for p in [int(x) for x in args.workers.split(",")]:
        t0 = time.perf_counter()
        state = OkTopkState(rebalance_every=REBALANCE_EVERY)
        v0, i0 = make_selections(p, numel, k, seed=1)
        first = sim_oktopk_allreduce(v0, i0, numel, k, state=state)  # re-balancing call
        v1, i1 = make_selections(p, numel, k, seed=2)                 # next iteration: new data
        steady = sim_oktopk_allreduce(v1, i1, numel, k, state=state)
        gtopk = sim_gtopk_allreduce(v1, i1, numel, k, algorithm="butterfly")
        topk = sim_topk_allgather(v1, i1, numel)
        row = {"P": p, "ok_bytes": max(r.stats.bytes_sent for r in steady),
               "ok_bytes_first": max(r.stats.bytes_sent for r in first),
               "gtopk_bytes": max(r.stats.bytes_sent for r in gtopk),
               "paper_bound_bytes": 6 * k * (p - 1) / p * 8, "lb_bytes": 2 * k * (p - 1) / p * 8,
               "sim_s": time.perf_counter() - t0}
        for net in nets:
            ok_steady = modelled_s(steady, net)
            ok_first = modelled_s(first, net)
            row[net.name] = {
                "oktopk": ok_steady,
                "oktopk_amortised": ok_first / REBALANCE_EVERY + ok_steady * (REBALANCE_EVERY - 1) / REBALANCE_EVERY,
                "gtopk": modelled_s(gtopk, net), "topk": modelled_s(topk, net),
                "formula": collective_time_s(net, "oktopk_paper_bound", numel, k, p),
                "impl_formula": oktopk_model_time_s(net, numel, k, p, rebalance_every=REBALANCE_EVERY),
                "lb": collective_time_s(net, "lower_bound", numel, k, p),
            }
        rows.append(row)
        print(f"  P={p}: simulated in {row['sim_s']:.1f} s", file=sys.stderr)
    print("| P | Ok-Topk bytes/rank (steady) | with re-balance | 6k(P-1)/P pairs | 2k(P-1)/P pairs (LB) "
          "| gTop-k bytes/rank |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['P']} | {r['ok_bytes']:,} | {r['ok_bytes_first']:,} | {r['paper_bound_bytes']:,.0f} | "
              f"{r['lb_bytes']:,.0f} | {r['gtopk_bytes']:,} |")
    for net in nets:
        print(f"\n{net} (alpha={net.alpha_s * 1e3:.3g} ms):\n")
        print("| P | Ok-Topk steady | Ok-Topk amortised | formula as implemented | gTop-k butterfly | "
              "Top-k AllGather | background.md bound | lower bound | Ok-Topk / LB | gTop-k / Ok-Topk |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            m = r[net.name]
            print(f"| {r['P']} | {m['oktopk'] * 1e3:.2f} | {m['oktopk_amortised'] * 1e3:.2f} | "
                  f"{m['impl_formula'] * 1e3:.2f} | "
                  f"{m['gtopk'] * 1e3:.2f} | {m['topk'] * 1e3:.2f} | {m['formula'] * 1e3:.2f} | "
                  f"{m['lb'] * 1e3:.2f} | {m['oktopk_amortised'] / m['lb']:.2f} | "
                  f"{m['gtopk'] / m['oktopk_amortised']:.2f} |")
    return 0


# ----------------------------------------------------------------------------- real gloo
def _real_job(rank: int, world: int, numel: int, k: int, bandwidth: str, repeats: int) -> dict:
    from gtopk_lab.collectives import gtopk_allreduce, topk_allgather
    from gtopk_lab.network.clock import VirtualClock
    from gtopk_lab.comm.oktopk import oktopk_allreduce

    net = NetworkModel.from_strings(bandwidth)
    out: dict = {}
    state = OkTopkState(rebalance_every=REBALANCE_EVERY)
    calls = {
        "oktopk": lambda v, i: oktopk_allreduce(v, i, numel, k, state=state),
        "gtopk": lambda v, i: gtopk_allreduce(v, i, numel, k, algorithm="butterfly"),
        "topk": lambda v, i: topk_allgather(v, i, numel),
    }
    for name, fn in calls.items():
        clock = VirtualClock(net)
        walls, models = [], []
        for rep in range(repeats + 1):
            vs, is_ = make_selections(world, numel, k, seed=10 + rep)
            clock.mark()
            t0 = time.perf_counter()
            clock.collective(fn, vs[rank], is_[rank])
            if rep > 0:  # the first oktopk call re-balances: report steady state
                walls.append(time.perf_counter() - t0)
                models.append(clock.last_comm_model_s)
        out[name] = (statistics.median(walls), statistics.median(models))
    return out


def cmd_real(args: argparse.Namespace) -> int:
    from gtopk_lab.comm.launch import run_gloo

    numel = parse_count(args.numel, "--numel")
    k = k_for(numel, args.density)
    net = NetworkModel.from_strings(args.bandwidth)
    res = run_gloo(_real_job, args.workers, numel, k, args.bandwidth, args.repeats, timeout_s=600)[0]
    print(f"P={args.workers} gloo processes, numel={numel}, k={k}, {net}; median of {args.repeats}\n")
    print("| collective | modelled comm (VirtualClock) ms | loopback wall ms |")
    print("|---|---|---|")
    for name, (wall, model) in res.items():
        print(f"| {name} | {model * 1e3:.2f} | {wall * 1e3:.1f} |")
    lb = collective_time_s(net, "lower_bound", numel, k, args.workers)
    print(f"| lower bound 2k(P-1)/P*8 beta | {lb * 1e3:.2f} | - |")
    return 0


# ----------------------------------------------------------------------------- overlap
def _overlap_job(rank: int, world: int, mode: str, density: float, epochs: int, bandwidth: str,
                 seed: int = 0) -> dict:
    from torch import nn

    from gtopk_lab.integrations.overlap import WaitFreeBackprop
    from gtopk_lab.training.data import Shard, eval_batches, load_dataset
    from gtopk_lab.training.models import build_model

    data = load_dataset("mnist1d", model="mlp", train_samples=4000, test_samples=1000)
    shard = Shard(data, rank, world, 32, seed=seed)
    torch.manual_seed(seed)  # initial weights and data order vary with the repeat
    model = build_model("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    method = "dense" if mode == "dense" else "gtopk"
    scope = "model" if mode in ("model", "dense") else "layer"
    wfbp = WaitFreeBackprop(model, density=density, method=method, scope=scope, overlap=(mode == "layer"),
                            network=NetworkModel.from_strings(bandwidth))
    hidden, comm, hidden_m, comm_m = 0.0, 0.0, 0.0, 0.0
    for epoch in range(epochs):
        for x, y in shard.epoch(epoch):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            rep = wfbp.finish()
            opt.step()
            hidden, comm = hidden + rep.hidden_s, comm + rep.comm_s
            hidden_m, comm_m = hidden_m + rep.hidden_model_s, comm_m + rep.comm_model_s
    wfbp.close()
    correct = 0
    with torch.no_grad():
        for x, y in eval_batches(data):
            correct += int((model(x).argmax(-1) == y).sum())
    return {"acc": correct / data.test_samples, "hidden": hidden / comm if comm else 0.0,
            "hidden_model": hidden_m / comm_m if comm_m else 0.0, "groups": len(wfbp.groups)}


def cmd_overlap(args: argparse.Namespace) -> int:
    from gtopk_lab.comm.launch import run_gloo

    print(f"MNIST-1D, mlp, P={args.workers} gloo ranks, batch 32/rank, lr 0.05 momentum 0.9, "
          f"{args.epochs} epochs, gTop-k density {args.density}, modelled link {args.bandwidth}\n")
    print(f"| selection | groups | test accuracy (mean of {args.repeats} seeds) | hidden comm (measured, "
          "loopback; last seed) | hidden comm (modelled; last seed) |")
    print("|---|---|---|---|---|")
    for mode, label in (("dense", "dense S-SGD"), ("model", "whole-model gTop-k (after backward)"),
                        ("layer", "per-layer gTop-k, overlapped")):
        accs, r0 = [], None
        for seed in range(args.repeats):
            r0 = run_gloo(_overlap_job, args.workers, mode, args.density, args.epochs, args.bandwidth,
                          seed, timeout_s=900)[0]
            accs.append(r0["acc"])
        assert r0 is not None
        spread = f" (min {min(accs):.3f}, max {max(accs):.3f})" if len(accs) > 1 else ""
        print(f"| {label} | {r0['groups']} | {statistics.mean(accs):.3f}{spread} | {r0['hidden']:.0%} | "
              f"{r0['hidden_model']:.0%} |")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scaling")
    s.add_argument("--numel", default="1M")
    s.add_argument("--density", type=float, default=0.01)
    s.add_argument("--workers", default="8,16,32,64,128,256")
    r = sub.add_parser("real")
    r.add_argument("--workers", type=int, default=8)
    r.add_argument("--numel", default="1M")
    r.add_argument("--density", type=float, default=0.01)
    r.add_argument("--bandwidth", default="1Gbps")
    r.add_argument("--repeats", type=int, default=3)
    o = sub.add_parser("overlap")
    o.add_argument("--workers", type=int, default=4)
    o.add_argument("--epochs", type=int, default=8)
    o.add_argument("--density", type=float, default=0.01)
    o.add_argument("--bandwidth", default="10Mbps")
    o.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    return {"scaling": cmd_scaling, "real": cmd_real, "overlap": cmd_overlap}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
