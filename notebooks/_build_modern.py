"""Cells of notebooks/05_modern_methods.ipynb (imported by _build.py, which writes it).

Kept apart from _build.py so that each file stays readable; the helpers (md, code, params)
and the shared SETUP cell come from _build.py as arguments.
"""

from __future__ import annotations

from collections.abc import Callable

import nbformat

Cell = Callable[[str], nbformat.NotebookNode]


def modern_methods_cells(md: Cell, code: Cell, params: Cell, setup: str) -> list[nbformat.NotebookNode]:
    """The cells of 05_modern_methods.ipynb, in order."""
    return [
        md("""
# Beyond gTop-k: the methods that came after it, on one clock

**Run All** at the defaults takes about 4 minutes on 2 cores (3 min 53 s with papermill,
`OMP_NUM_THREADS=1`, on a quiet AMD EPYC VM, 2026-12-06; `benchmarks/RESULTS.md`): MNIST-1D at
P = 4 (real ranks) and 16 (simulated), the GPT at P = 4, 150 iterations each. That budget is
short: most compressed methods do not reach dense's target loss within it (NaN in the tables),
the figures show how far each got. A GPT rank is compute-bound (a simulated one costs its whole
forward/backward; batching does not help it), and the local-steps methods simulate rank by rank,
so the comparison this notebook was first written for, `workers = [4, 16, 64]`,
`gpt_workers = [4, 16, 64]`, `gpt_iterations = mnist_iterations = 300`, `gpt_batch_size = 16`,
`mnist_batch_size = 32`, takes over 30 minutes on 2 cores (a Run All was stopped after 35 min
with 23 of 64 runs done). CI runs it with smaller parameters still.

Dense S-SGD, Top-k and gTop-k side by side with the methods of the years after the paper
(docs/modern_methods.md): ScaleCom's **CLT-k**, **EF21** and EF21-SGDM, **PowerSGD**,
**DiLoCo**, **SparseLoCo** and SparseLoCo with its pseudo-gradients merged by gTop-k, on two
workloads: a small byte-level GPT on the offline stdlib text corpus and MNIST-1D. P up to the
cluster's workers run as real gloo ranks, larger P (16 here) in the simulator as tasks on
the Dask workers. Every run is recorded once on one network; because virtual time depends
only on the recorded compute and on each collective's rounds and bytes, the same run is
**priced again on every network** below (`gtopk_lab.analysis.reprice`), without training
again. Reported per method and P: **time to a target training loss** on the virtual clock,
bytes per rank per iteration, final validation loss and scaling efficiency.

All methods train with AdamW at the same learning rate (DiLoCo and SparseLoCo use it as
their inner optimiser), so the comparison is at one recipe, not at each paper's tuned one.
"""),
        params("""
scheduler = None            # a running `dask scheduler` address, None for an embedded LocalCluster
n_workers = 4               # embedded cluster size (P up to this many run as real ranks)
real_max_workers = None     # None: as many as the cluster has workers
workers = [4, 16]           # MNIST-1D's P (dense baselines at one worker join), beyond the cluster size simulated
gpt_workers = [4]           # the GPT's P: a simulated GPT rank costs its whole forward/backward
methods = ["dense", "topk", "gtopk", "clt-k", "ef21", "ef21-sgdm", "powersgd", "diloco",
           "sparseloco", "sparseloco-gtopk"]
density = 0.01              # k / d of the sparse methods (SparseLoCo's chunk-wise top-k too)
recorded_bandwidth = "1GbE" # the network the runs are recorded on
networks = ["1GbE", "10GbE"]  # every recorded run is priced on each of these
seeds = 1
lr = 3e-3                   # AdamW for every method (inner optimiser of DiLoCo / SparseLoCo)
sync_every = 8              # H of DiLoCo / SparseLoCo
gpt_model = "gpt_tiny"      # 72k parameters; "gpt" is ~1.85M
gpt_iterations = 150
gpt_batch_size = 8          # sequences per rank
gpt_val_sequences = 512
mnist_model = "cnn"
mnist_iterations = 150
mnist_batch_size = 16
mnist_train_samples = 4000
data_split = "iid"          # or "dirichlet" for non-IID label skew on MNIST-1D (dirichlet_alpha 0.5)
target_loss_gpt = None      # None: 5% above the worst final loss of dense at P > 1
target_loss_mnist = None
out = None                # results folder; None: the results home ($GTOPK_LAB_RESULTS, else the project's results/)
"""),
        code(setup + """
from gtopk_lab.analysis.reprice import (auto_target_loss, comparison_pivot, method_comparison,
                                        reprice_metrics, reprice_summaries)
from gtopk_lab.analysis.outcomes import run_outcomes
from gtopk_lab.plotting.figures import loss_vs_time_figure, pareto_figure, time_to_target_figure
from gtopk_lab.plotting.live_study import live_convergence_study, live_scaling, scaling_study_figure
"""),
        md("""
## 1. Two studies, launched at once
One study per workload (methods x P x seeds, dense P = 1 baselines added); both return at
once and share the cluster's queue.
"""),
        code("""
if isinstance(globals().get("lab"), Lab):  # Run All again: stop the previous cluster first
    lab.close()
lab = Lab(scheduler=scheduler, n_workers=n_workers, out=out)
extra = {"optimizer": "adamw", "sync_every": sync_every}  # methods without local steps ignore H
workloads = {
    "GPT (stdlib text)": dict(model=gpt_model, dataset="text", max_iterations=gpt_iterations,
                              batch_size=gpt_batch_size, train_samples=10**9, test_samples=gpt_val_sequences,
                              epochs=10**4, target=target_loss_gpt, workers=gpt_workers),
    "MNIST-1D": dict(model=mnist_model, dataset="mnist1d", max_iterations=mnist_iterations,
                     batch_size=mnist_batch_size, train_samples=mnist_train_samples, test_samples=1000,
                     epochs=10**4, data_split=data_split, target=target_loss_mnist, workers=workers),
}
studies = {}
for name, spec in workloads.items():
    base = {k: v for k, v in spec.items() if k not in ("target", "workers")}
    base.update(lr=lr, momentum=0.0, weight_decay=0.0, sink_every=5, extra=extra)
    studies[name] = lab.study(methods=methods, workers=spec["workers"], density=density,
                              bandwidth=recorded_bandwidth, seeds=seeds, real_max_workers=real_max_workers,
                              base=base)
    print(name, studies[name])
"""),
        md("""
## 2. Live: scaling efficiency and convergence
Per workload, the scaling efficiency on the recorded network (solid: real ranks, dotted:
simulated) and the training loss of every run, one panel per method. Headless (papermill,
CI) the figures are drawn once the studies are done.
"""),
        code("""
views = {name: (live_scaling(study), live_convergence_study(study)) for name, study in studies.items()}
"""),
        code("""
for name, (scaling, convergence) in views.items():
    scaling.finish()
    convergence.finish()
    status = studies[name].status()
    print(f"{name}: {status.status.str.startswith('completed').sum()} of {len(status)} points completed")
"""),
        md("""
## 3. The comparison, priced on every network
`time_to_target_s`: virtual time at which the training loss (mean over ranks, trailing mean
over 5 iterations) first reaches the target (NaN: not within the budget);
`bytes_per_rank_per_iter`: what a rank sends per iteration (a local-steps method's
synchronisation divided by H); `final_loss`: the last validation loss (nats per byte for
the GPT); `efficiency`: the project's one rule, dense P = 1 of the same seed and source = 100%.
With two or more seeds the time to target carries its 95% Student-t confidence interval
(`time_to_target_ci_low` / `_high`, error bars in the figure); with one seed there is none.
"""),
        code("""
tables, repriced = {}, {}
for name, study in studies.items():
    summaries, metrics = study.summaries(), study.metrics()
    target = workloads[name]["target"]
    if target is None:
        target = auto_target_loss(metrics, summaries)
    tables[name] = (target, method_comparison(summaries, metrics, networks, target))
    repriced[name] = (summaries, metrics)
    print(f"{name}: target training loss {target:.4f}")
    table = tables[name][1]
    display(comparison_pivot(table, "time_to_target_s").round(4))  # NaN: not reached
"""),
        code("""
for name, (target, table) in tables.items():
    show(time_to_target_figure(table, target_loss=target, title=f"{name}: time to training loss {target:.3g}"))
    summaries, metrics = repriced[name]
    largest = int(table["workers"].max())
    show(loss_vs_time_figure(reprice_metrics(metrics, networks[-1]), workers=largest, target_loss=target,
                             title=f"{name}: training loss on the virtual clock, P = {largest}, {networks[-1]}"))
"""),
        md("""
Accuracy against cost, one point per run of the recorded network: final validation loss
against the bytes one rank sent over the run, and against its virtual time. The dashed
staircase is the Pareto frontier: the runs no other run beats on both axes at once.
"""),
        code("""
for name, (summaries, metrics) in repriced.items():
    outcomes = run_outcomes(summaries)
    for x in ("bytes_sent_per_rank", "virtual_time_s"):
        show(pareto_figure(outcomes, x=x, y="final_loss", title=f"{name}: final loss vs {x.replace('_', ' ')}"))
"""),
        md("""
Scaling efficiency on the other networks from the same runs (the one efficiency rule on the
repriced throughputs; the live figures above are the recorded network's):
"""),
        code("""
for name, (summaries, metrics) in repriced.items():
    done = summaries[summaries.status == "completed"].assign(final=True)
    for net in [n for n in networks if n != recorded_bandwidth]:
        fig = scaling_study_figure(reprice_summaries(done, metrics, net))
        fig.update_layout(title=f"{name}: scaling efficiency on {net} (virtual clock, repriced)")
        show(fig)
"""),
        md("The whole table (every network, method and P):"),
        code("""
with pd.option_context("display.max_rows", None):  # every row: past 60 pandas shows 10
    display(pd.concat([t.assign(workload=name) for name, (_, t) in tables.items()], ignore_index=True)[
        ["workload", "network", "method", "workers", "source", "time_to_target_s", "bytes_per_rank_per_iter",
         "final_loss", "efficiency", "n"]])
"""),
        md("""
How to read this, and where it disagrees with the papers: the runs here are short and
small (CI: a few iterations of a 72k-parameter GPT, so its numbers there say nothing),
while DiLoCo and SparseLoCo were tuned for LLM pre-training with H = 500 over thousands of
outer steps, and PowerSGD's and CLT-k's papers train CNNs with SGD + momentum for hundreds of
epochs. At one shared AdamW recipe and a few hundred iterations most compressed methods
trail dense in loss per iteration and win time to target only where communication dominates
(1 GbE, large P): in `benchmarks/modern_methods.py` (figures in `benchmarks/RESULTS.md`)
DiLoCo reaches MNIST-1D's target first at P = 16 on both networks, EF21 the GPT's on 1 GbE,
and SparseLoCo over gTop-k sends log2 P instead of P - 1 messages per synchronisation but ends
0.08-0.26 nats above SparseLoCo at the same budget and seeds.
"""),
        code("lab.close()"),
    ]
