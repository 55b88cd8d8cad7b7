#!/usr/bin/env python
"""Ok-Topk vs gTop-k vs Top-k AllGather, and wait-free backprop accuracy/hiding.

    python benchmarks/oktopk.py scaling  --density 0.01 --workers 8,16,32,64,128,256
    python benchmarks/oktopk.py real     --workers 8 --density 0.01 --repeats 3
    python benchmarks/oktopk.py scaling  --gradients synthetic --numel 1M --density 0.01
    python benchmarks/oktopk.py overlap  --workers 4 --epochs 8 --density 0.01

Gradients (``--gradients``, scaling and real): ``real`` (default) is a model's backward pass,
one mini-batch per rank (:class:`ModelGradients`; ``--model cnn_wide`` on MNIST-1D, 232 k
entries), so the large entries cluster by layer as in training; ``synthetic`` is the earlier
input, g_r = shared + heavy-tailed noise of ``--numel`` entries, with no layer structure.
Collectives: Ok-Topk as the reference runs it (``oktopk``: thresholds re-evaluated every 32
calls, quantile regions every 64; ``oktopk-balanced``: the paper's balanced allgather;
both select inside the collective), ``oktopk-exact`` (exact global top-k, histogram regions
re-balanced every 16 calls), the gTop-k butterfly and Top-k AllGather on each rank's top-k.

``scaling``: P virtual ranks in one process (the real per-rank message programs), two calls:
call 0 re-evaluates / re-balances, call 1 on new mini-batches is the steady state. Prints the
bytes each rank sends and the busiest rank receives, and the communication time modelled from
each rank's CommStats.steps (max over ranks of sum(alpha + beta * max(sent, recv)); the
VirtualClock's rule), steady and amortised over the collective's period, beside the
registered methods' alpha-beta formulas (``Method.predicted_time_s``, amortised).
``real``: the same collectives on P real gloo processes on 127.0.0.1, each call wrapped in a
VirtualClock on the emulated link (modelled time), plus bytes and the loopback wall time.
``overlap``: MNIST-1D, P gloo ranks, per-layer gTop-k overlapped with backward
(gtopk_lab.integrations.overlap) vs whole-model gTop-k vs dense; test accuracy and hidden communication.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from gtopk_lab.analysis.predict import collective_time_s
from gtopk_lab.comm.inprocess import sim_gtopk_allreduce, sim_topk_allgather
from gtopk_lab.compression.selection import get_selector
from gtopk_lab.config import k_for
from gtopk_lab.counts import parse_count
from gtopk_lab.methods import get_method
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.comm.oktopk import OkTopkFaithfulState, OkTopkState, sim_oktopk_allreduce, sim_oktopk_faithful_allreduce

REBALANCE_EVERY = 16  # oktopk-exact's histogram re-balance period
#: the collectives compared; Ok-Topk (oktopk, oktopk-balanced) selects by its thresholds
#: inside the collective, the others run on each rank's exact top-k
COLLECTIVES = ("oktopk", "oktopk-balanced", "oktopk-exact", "gtopk", "topk")
LABELS = {"oktopk": "Ok-Topk", "oktopk-balanced": "oktopk-balanced", "oktopk-exact": "oktopk-exact",
          "gtopk": "gTop-k butterfly", "topk": "Top-k AllGather"}


# ----------------------------------------------------------------------------- gradients
def synthetic_buffers(world: int, numel: int, call: int, ranks: list[int] | None = None) -> list[torch.Tensor]:
    """Per-rank g_r = shared + noise (heavy tails): overlapping supports, no layer structure."""
    gen = torch.Generator().manual_seed(1 + call)
    shared = torch.randn(numel, generator=gen) * torch.rand(numel, generator=gen) ** 4
    out = []
    for r in range(world):
        g = shared + 0.5 * torch.randn(numel, generator=gen) * torch.rand(numel, generator=gen) ** 4
        if ranks is None or r in ranks:
            out.append(g)
    return out


class ModelGradients:
    """Flat gradients of a real model's backward pass, one mini-batch per rank and call.

    1. the model is built once from ``torch.manual_seed(seed)`` (the same weights on every
       rank and in every process), its dataset loaded with the project's loader;
    2. call c of rank r draws ``batch`` training samples without replacement from a
       generator seeded by (seed, c, r): every rank its own mini-batch (at P * batch above
       the training set size, mini-batches of different ranks overlap);
    3. one forward/backward of the cross-entropy loss; the gradient of every parameter,
       flattened in ``parameters()`` order, is the rank's buffer (no residual: the first call
       of a run). The large entries cluster by layer (MNIST-1D CNN: the output layer, 4% of
       the entries, holds about 3/4 of the top 1%).
    Cost: one forward/backward per rank and call (cnn_wide, batch 32: ~20 ms on one core).
    """

    def __init__(self, model: str, batch: int, seed: int = 0) -> None:
        from gtopk_lab.training.data import load_dataset
        from gtopk_lab.training.models import build_model, get_model_spec

        spec = get_model_spec(model)
        self.data = load_dataset(spec.datasets[0], model=model, train_samples=4000, test_samples=100, seed=seed)
        torch.manual_seed(seed)
        self.model = build_model(model)
        self.batch, self.seed, self.name = batch, seed, model
        self.numel = sum(p.numel() for p in self.model.parameters())

    def rank_gradient(self, rank: int, call: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(1_000_003 * self.seed + 1009 * call + rank)
        pick = torch.randperm(self.data.train_samples, generator=gen)[:self.batch]
        x, y = self.data.x_train[pick], self.data.y_train[pick]
        self.model.zero_grad()
        out = self.model(x)
        torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
        return torch.cat([p.grad.reshape(-1) for p in self.model.parameters()]).detach().clone()

    def __call__(self, world: int, numel: int, call: int, ranks: list[int] | None = None) -> list[torch.Tensor]:
        return [self.rank_gradient(r, call) for r in (range(world) if ranks is None else ranks)]


def gradient_source(args: argparse.Namespace) -> tuple[Callable[..., list[torch.Tensor]], int, str]:
    """(buffers(world, numel, call, ranks) -> per-rank buffers, numel, description) of ``--gradients``."""
    if args.gradients == "synthetic":
        numel = parse_count(args.numel, "--numel")
        return synthetic_buffers, numel, "synthetic: per-rank shared + heavy-tailed noise"
    if args.gradients != "real":
        raise ValueError(f"--gradients={args.gradients!r} is invalid: expected real or synthetic")
    source = ModelGradients(args.model, args.batch)
    return source, source.numel, (f"real: {args.model} on {source.data.name}, batch {args.batch} per rank, "
                                  "gradient at initialisation")


def topk_pairs(bufs: list[torch.Tensor], k: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    select = get_selector("topk")
    pairs = [select(b, k) for b in bufs]
    return [v for v, _ in pairs], [i for _, i in pairs]


def _faithful(mode: str) -> Callable[..., list]:
    def call(bufs: list[torch.Tensor], k: int, state: OkTopkFaithfulState | None) -> list:
        return [r for r, _ in sim_oktopk_faithful_allreduce(bufs, k, state=state, allgather=mode)]
    return call


def _on_topk(run: Callable[..., list]) -> Callable[..., list]:
    def call(bufs: list[torch.Tensor], k: int, state: OkTopkState | None) -> list:
        vs, is_ = topk_pairs(bufs, k)
        return run(vs, is_, bufs[0].numel(), k, state)
    return call


#: collective -> (per-rank buffers, k, its state) -> P CollectiveResults, in one process
SIM_CALLS: dict[str, Callable[..., list]] = {
    "oktopk": _faithful("plain"),
    "oktopk-balanced": _faithful("balanced"),
    "oktopk-exact": _on_topk(lambda vs, is_, n, k, st: sim_oktopk_allreduce(vs, is_, n, k, state=st)),
    "gtopk": _on_topk(lambda vs, is_, n, k, st: sim_gtopk_allreduce(vs, is_, n, k, algorithm="butterfly")),
    "topk": _on_topk(lambda vs, is_, n, k, st: sim_topk_allgather(vs, is_, n)),
}


def new_states() -> dict:
    return {"oktopk": OkTopkFaithfulState(), "oktopk-balanced": OkTopkFaithfulState(),
            "oktopk-exact": OkTopkState(rebalance_every=REBALANCE_EVERY)}


def modelled_s(results: list, net: NetworkModel) -> float:
    return max(net.steps_time_s(r.stats.steps) for r in results)


#: calls per period of a stateful collective: Ok-Topk re-evaluates every tau = 32 calls,
#: oktopk-exact re-balances every 16; the others keep no state
PERIODS = {"oktopk": 32, "oktopk-balanced": 32, "oktopk-exact": REBALANCE_EVERY}


def amortised(first: float, steady: float, period: int) -> float:
    """Mean per call over a period of one ``first`` call and period - 1 steady ones (for
    Ok-Topk an upper bound: the measured first call also repartitions, which only every
    second re-evaluation does)."""
    return first / period + steady * (period - 1) / period


def cmd_scaling(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    source, numel, what = gradient_source(args)
    k = k_for(numel, args.density)
    nets = [NetworkModel.from_strings(b, lat) for b, lat in
            (("1Gbps", None), ("1Gbps", "50us"), ("1GbE", None))]
    print(f"gradients {what}; numel={numel} k={k} pair=8 B; call 0 re-evaluates (Ok-Topk) / re-balances "
          "(oktopk-exact), call 1 (new mini-batches) is the steady state\n")
    rows = []
    for p in [int(x) for x in args.workers.split(",")]:
        t0 = time.perf_counter()
        bufs0, bufs1 = source(p, numel, 0), source(p, numel, 1)
        t_grad = time.perf_counter() - t0
        states = new_states()
        row: dict = {"P": p}
        for name in COLLECTIVES:
            first = SIM_CALLS[name](bufs0, k, states.get(name))
            steady = SIM_CALLS[name](bufs1, k, states.get(name))
            row[name] = {"sent": max(r.stats.bytes_sent for r in steady),
                         "recv": max(r.stats.bytes_recv for r in steady),
                         "sent_first": max(r.stats.bytes_sent for r in first),
                         "recv_first": max(r.stats.bytes_recv for r in first)}
            for net in nets:
                s, f = modelled_s(steady, net), modelled_s(first, net)
                row[name][net.name] = (s, amortised(f, s, PERIODS.get(name, 1)))
        row["lb"] = {net.name: collective_time_s(net, "lower_bound", numel, k, p) for net in nets}
        # the registered methods' alpha-beta formulas (amortised over their periods)
        row["formula"] = {net.name: [get_method(n).predicted_time_s(net, numel, k, p) for n in COLLECTIVES[:3]]
                          for net in nets}
        rows.append(row)
        print(f"  P={p}: gradients {t_grad:.1f} s, collectives {time.perf_counter() - t0 - t_grad:.1f} s",
              file=sys.stderr, flush=True)
    lb_pairs = "2k(P-1)/P pairs"
    print("Bytes per rank in the steady call, max over ranks: sent / received (received = the busiest "
          "rank's volume)\n")
    print("| P | " + " | ".join(LABELS[n] for n in COLLECTIVES) + f" | {lb_pairs} (LB) |")
    print("|---|" + "---|" * (len(COLLECTIVES) + 1))
    for r in rows:
        cells = [f"{r[n]['sent']:,} / {r[n]['recv']:,}" for n in COLLECTIVES]
        print(f"| {r['P']} | " + " | ".join(cells) + f" | {2 * k * (r['P'] - 1) / r['P'] * 8:,.0f} |")
    print("\nRe-evaluation / re-balancing call (call 0), max over ranks: sent / received\n")
    print("| P | " + " | ".join(LABELS[n] for n in COLLECTIVES[:3]) + " |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['P']} | " + " | ".join(f"{r[n]['sent_first']:,} / {r[n]['recv_first']:,}"
                                          for n in COLLECTIVES[:3]) + " |")
    for net in nets:
        print(f"\n{net} (alpha={net.alpha_s * 1e3:.3g} ms): modelled ms per call, steady (amortised)\n")
        print("| P | " + " | ".join(LABELS[n] for n in COLLECTIVES) + " | lower bound | Ok-Topk / LB | "
              "gTop-k / Ok-Topk | formulas: Ok-Topk / balanced / exact |")
        print("|---|" + "---|" * (len(COLLECTIVES) + 4))
        for r in rows:
            cells = [f"{r[n][net.name][0] * 1e3:.2f} ({r[n][net.name][1] * 1e3:.2f})" for n in COLLECTIVES]
            ok, lb = r["oktopk"][net.name][1], r["lb"][net.name]
            print(f"| {r['P']} | " + " | ".join(cells) + f" | {lb * 1e3:.2f} | {ok / lb:.2f} | "
                  f"{r['gtopk'][net.name][0] / ok:.2f} | "
                  + " / ".join(f"{t * 1e3:.2f}" for t in r["formula"][net.name]) + " |")
    return 0


# ----------------------------------------------------------------------------- real gloo
def _real_job(rank: int, world: int, args: argparse.Namespace) -> dict:
    from gtopk_lab.collectives import gtopk_allreduce, topk_allgather
    from gtopk_lab.comm.oktopk import oktopk_allreduce, oktopk_faithful_allreduce
    from gtopk_lab.network.clock import VirtualClock

    source, numel, _ = gradient_source(args)
    k = k_for(numel, args.density)
    net = NetworkModel.from_strings(args.bandwidth)
    states = new_states()
    calls = {
        "oktopk": lambda b: oktopk_faithful_allreduce(b, k, state=states["oktopk"])[0],
        "oktopk-balanced": lambda b: oktopk_faithful_allreduce(b, k, state=states["oktopk-balanced"],
                                                               allgather="balanced")[0],
        "oktopk-exact": lambda b: oktopk_allreduce(*get_selector("topk")(b, k), numel, k,
                                                   state=states["oktopk-exact"]),
        "gtopk": lambda b: gtopk_allreduce(*get_selector("topk")(b, k), numel, k, algorithm="butterfly"),
        "topk": lambda b: topk_allgather(*get_selector("topk")(b, k), numel),
    }
    bufs = [source(world, numel, rep, ranks=[rank])[0] for rep in range(args.repeats + 1)]
    out: dict = {"numel": numel, "k": k}
    for name in COLLECTIVES:
        clock = VirtualClock(net)
        walls, models, sent, recv = [], [], [], []
        for rep, buf in enumerate(bufs):
            clock.mark()
            t0 = time.perf_counter()
            res = clock.collective(calls[name], buf)
            if rep > 0:  # call 0 re-evaluates / re-balances: report the steady state
                walls.append(time.perf_counter() - t0)
                models.append(clock.last_comm_model_s)
                sent.append(res.stats.bytes_sent)
                recv.append(res.stats.bytes_recv)
        out[name] = (statistics.median(walls), statistics.median(models), max(sent), max(recv))
    return out


def cmd_real(args: argparse.Namespace) -> int:
    from gtopk_lab.comm.launch import run_gloo

    net = NetworkModel.from_strings(args.bandwidth)
    _, _, what = gradient_source(args)
    per_rank = run_gloo(_real_job, args.workers, args, timeout_s=900)
    numel, k = per_rank[0]["numel"], per_rank[0]["k"]
    print(f"P={args.workers} gloo processes, gradients {what}, numel={numel}, k={k}, {net}; "
          f"median of {args.repeats} steady calls\n")
    print("| collective | modelled comm (VirtualClock) ms | bytes sent, max over ranks | "
          "bytes received, busiest rank | loopback wall ms |")
    print("|---|---|---|---|---|")
    for name in COLLECTIVES:
        wall, model = per_rank[0][name][:2]
        sent = max(r[name][2] for r in per_rank)
        recv = max(r[name][3] for r in per_rank)
        print(f"| {LABELS[name]} | {model * 1e3:.2f} | {sent:,} | {recv:,} | {wall * 1e3:.1f} |")
    lb = collective_time_s(net, "lower_bound", numel, k, args.workers)
    print(f"| lower bound 2k(P-1)/P*8 beta | {lb * 1e3:.2f} | {2 * k * (args.workers - 1) / args.workers * 8:,.0f} "
          "| - | - |")
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


def add_gradient_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gradients", choices=("real", "synthetic"), default="real",
                        help="real: a model's backward pass per rank (layer-clustered); synthetic: shared + noise")
    parser.add_argument("--model", default="cnn_wide", help="--gradients real: a registered classifier")
    parser.add_argument("--batch", type=int, default=32, help="--gradients real: samples per rank and call")
    parser.add_argument("--numel", default="1M", help="--gradients synthetic: buffer size")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scaling")
    add_gradient_options(s)
    s.add_argument("--density", type=float, default=0.01)
    s.add_argument("--workers", default="8,16,32,64,128,256")
    r = sub.add_parser("real")
    r.add_argument("--workers", type=int, default=8)
    add_gradient_options(r)
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
