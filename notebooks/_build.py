"""Generate the gtopk-lab notebooks from this one reviewable file.

    .venv/bin/python notebooks/_build.py          # rewrites notebooks/0*.ipynb

Every notebook is stored without outputs and has one cell tagged ``parameters``
(papermill): all sizes come from there, and CI (tests/test_notebooks.py) passes small
ones. Edit the cells here, not in the .ipynb files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _build_modern import modern_methods_cells  # noqa: E402 - a sibling file, not a package

HERE = Path(__file__).resolve().parent


def md(text: str) -> nbformat.NotebookNode:
    return new_markdown_cell(text.strip("\n"))


def code(text: str, tags: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    cell = new_code_cell(text.strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def params(text: str) -> nbformat.NotebookNode:
    return code(text, ("parameters",))


SETUP = """
import os
import numpy as np
import pandas as pd
from IPython.display import display

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration.lab import Lab
from gtopk_lab.plotting import figures
from gtopk_lab.plotting.live import live_convergence, live_frontend_present, show

pd.set_option("display.precision", 4)
print("live widgets:", live_frontend_present())
"""

NOTEBOOKS: dict[str, list[nbformat.NotebookNode]] = {}

# --------------------------------------------------------------------------------------------
NOTEBOOKS["00_quickstart.ipynb"] = [
    md("""
# gtopk-lab quick start

Start (or connect to) a Dask cluster, launch one gTop-k S-SGD run on MNIST-1D and
watch its loss and accuracy live, then a small study (methods x P) whose scaling
efficiency fills in while the cluster runs, then a control panel to launch more. In
JupyterLab the figures are plotly `FigureWidget`s that grow while the ranks train;
executed headless (papermill, CI) the same cells show static figures once the runs end
(`gtopk_lab.plotting.live`).

**Run All** at the defaults (the MNIST-1D `cnn` with its recipe, rho = 0.01, P = 2 real
ranks, 40 epochs) takes about 37 s on 2 cores (papermill, a fresh results folder; measured at
load 1.7-1.9). Expect section 2 to end at about 93% test accuracy for gTop-k and 95% for dense
(measured: 93.3% and 95.0%; `make demo`'s same setting, P = 2 simulated, gives dense 95.0 / Top-k 95.1 / gTop-k
93.3%): the paper's claim that gTop-k converges like dense. The study of section 4 measures
throughput only (30 iterations per point), so its accuracy stays low by design.
"""),
    params("""
# Parameters (papermill overrides these)
scheduler = None          # address of a running `dask scheduler` (tcp or tls), None for an embedded LocalCluster
n_workers = 2             # embedded cluster size
method = "gtopk"
compare_with = "dense"    # a second run beside it in section 2 (None: only `method`)
workers = 2               # P ranks
density = 0.01            # rho, the fraction of the d gradient entries each worker selects
model = "cnn"             # trained with its recipe (RunConfig.recipe auto: lr schedule, density warm-up)
dataset = "mnist1d"
epochs = 40
train_samples = 4000
max_iterations = None
bandwidth = "1GbE"        # the modelled network of the virtual clock, "none" for unthrottled
latency = None            # per-message latency like "0.5ms", None for the preset's
throttle = False          # True sleeps so that each collective lasts its modelled time
sink_every = 2            # metric rows stream to the notebook every this many iterations
study_methods = ["dense", "gtopk"]
study_workers = [1, 2, 4, 8]   # P beyond the cluster's workers runs in the simulator, on the workers
study_max_iterations = 30
close_at_end = False      # True: the last cell closes the cluster (the panel above then stops working)
out = None                # results folder; None: the results home ($GTOPK_LAB_RESULTS, else the project's results/)
"""),
    code(SETUP),
    md("""
## 1. A live figure, then a cluster
The figure comes first and stays empty until section 2 adds a run to it: the browser takes
seconds to load plotly's widget, and shown here that overlaps the cluster's start-up
instead of the run. `Lab(scheduler=None)` starts a `LocalCluster` on 127.0.0.1 (one
process per worker).
"""),
    code("""
view = live_convergence(x="iteration", min_interval_s=0.3)
"""),
    code("""
if isinstance(globals().get("lab"), Lab):  # Run All again: stop the previous cluster first
    lab.close()
lab = Lab(scheduler=scheduler, n_workers=n_workers, out=out)
print(lab)
print("dashboard:", lab.dashboard_link)
"""),
    md("## 2. A gTop-k run and its dense baseline, watched live in the figure above"),
    code("""
def run_config(name):
    return RunConfig(method=name, workers=workers, density=density, model=model, dataset=dataset,
                     epochs=epochs, train_samples=train_samples, max_iterations=max_iterations,
                     bandwidth=bandwidth, latency=latency, throttle=throttle, sink_every=sink_every)

config = run_config(method)
handle = lab.submit(config)
view.add(handle)
baseline = lab.submit(run_config(compare_with)) if compare_with else None
if baseline is not None:  # the comparison the paper makes: does gTop-k converge like dense?
    view.add(baseline)
"""),
    code("""
metrics, summary = handle.result()
base_summary = baseline.result()[1] if baseline is not None else None
view.finish()
if summary["status"] != "completed":
    raise RuntimeError(f"run {summary['run_id']} {summary['status']}: {summary['error']}")
print(f"{summary['iterations']} iterations, final test accuracy {summary['final_test_accuracy']:.1%}, "
      f"{summary['samples_per_s_virtual']:.0f} samples/s on the modelled {bandwidth} network")
if base_summary is not None:
    print(f"{compare_with}: final test accuracy {base_summary['final_test_accuracy']:.1%} "
          f"({100 * (summary['final_test_accuracy'] - base_summary['final_test_accuracy']):+.1f} points for {method})")
"""),
    md("## 3. Where the time goes\nMean seconds per iteration by phase, and the rows behind the figure."),
    code("""
show(figures.time_breakdown_figure(pd.DataFrame([summary])))
metrics[metrics.kind == "epoch"][["epoch", "train_loss", "test_loss", "test_accuracy", "virtual_time_s"]]
"""),
    md("""
## Before a study: what the model predicts (what-if explorer)
Move the sliders: density ρ (log scale), the P marked on the curves (1 ... 1024), the link
(a preset or a free rate) and its latency, and the methods (the registry's). Every change
redraws, from the alpha-beta(-gamma) model only (no run is submitted), the predicted
scaling efficiency vs P and, below it, each method's time per iteration at that P. The line
under the title says where the compute and selection times come from (here the run of
section 2, stored under `out`; a calibration once a study has made one). **Run as study**
runs the setting on the cluster, and its measured points join the same axes as diamonds.
"""),
    code("""
from gtopk_lab.plotting.explorer import Explorer

explorer = Explorer(lab, out=out, methods=study_methods, density=density, link=bandwidth, latency=latency,
                    workers=1 << (max(study_workers).bit_length() - 1),  # the largest power of two in the list
                    base={"model": model, "dataset": dataset, "epochs": epochs, "train_samples": train_samples,
                          "max_iterations": study_max_iterations, "throttle": throttle, "sink_every": sink_every})
explorer
"""),
    md("""
## 4. A study: scaling efficiency while it runs
`lab.study(...)` launches a grid (here methods x P) and returns at once; P beyond the
cluster's workers runs in the simulator as Dask tasks on the workers. The figure is the
paper's scaling efficiency (dense at P = 1 is 100%) on the virtual clock, the dashed lines
the alpha-beta prediction; a point appears when its run's throughput is known (hollow
while provisional).
"""),
    code("""
from gtopk_lab.plotting.live_study import live_scaling

study = lab.study(methods=study_methods, workers=study_workers, density=density, bandwidth=bandwidth,
                  latency=latency, base={"model": model, "dataset": dataset, "epochs": epochs,
                                         "train_samples": train_samples, "max_iterations": study_max_iterations,
                                         "throttle": throttle, "sink_every": sink_every})
scaling = live_scaling(study)
"""),
    code("""
study.wait()
scaling.finish()
print("\\n".join(study.check_lines()))
study.efficiency()[["method", "workers", "source", "efficiency_mean", "n", "provisional"]]
"""),
    md("""
## 5. More studies from a control panel
Pick methods, type lists of P, densities, bandwidths and latencies, press **Launch**: the
*efficiency* and *convergence* tabs follow the study live, one status line per run below
the form, and the *runs* tab lists every run (sort, filter, select rows, **Compare
selected**). The panel keeps the cluster running until the kernel shuts down. (Needs a
widget front end; in an executed notebook this cell shows no panel.)
"""),
    code("""
from gtopk_lab.plotting.controls import ControlPanel

ControlPanel(lab, defaults={"methods": study_methods, "workers": study_workers, "density": density,
                            "bandwidth": bandwidth, "latency": latency or "", "model": model,
                            "dataset": dataset, "epochs": epochs},
             extra={"train_samples": train_samples, "max_iterations": study_max_iterations,
                    "throttle": throttle, "sink_every": sink_every})
"""),
    md("""
The panel above needs the cluster, so *Run All* leaves it running; it stops when the kernel
shuts down. To stop it now, run `lab.close()` (or set `close_at_end = True`).
"""),
    code("""
if close_at_end:
    lab.close()
"""),
]

# --------------------------------------------------------------------------------------------
NOTEBOOKS["01_convergence.ipynb"] = [
    md("""
# Convergence: dense vs Top-k vs gTop-k vs GaussianK

**Run All** at the defaults takes about 46 s on 2 cores (papermill, a fresh results folder;
measured at load 1.0-2.1).

Shi et al. (ICDCS'19) claim that gTop-k S-SGD converges "nearly consistently" with dense
S-SGD at density rho = 0.001. Here every method trains the same model on MNIST-1D with
the same seed(s) and recipe, on P real ranks, at several densities, and the claim is checked
with numbers: final test accuracy and loss against the dense run. The runs are one study
(`lab.study`: methods x densities x seeds, launched at once on the cluster); the figure
follows them live in JupyterLab.
"""),
    params("""
n_workers = 4
workers = 4
methods = ["dense", "topk", "gtopk", "gaussiank"]
densities = [0.01, 0.001]
seeds = 1                 # runs per (method, density): seeds 0 .. seeds-1; 2 or more: 95% confidence intervals
model = "cnn"
dataset = "mnist1d"
epochs = 10
train_samples = 4000
test_samples = 1000
max_iterations = None
bandwidth = "1GbE"
tolerance_pp = 2.0        # "nearly consistent" means within this many accuracy points of dense
target_accuracy = 0.90    # time to accuracy: the first evaluation at or above this
out = None                # results folder; None: the results home ($GTOPK_LAB_RESULTS, else the project's results/)
"""),
    code(SETUP + """
from gtopk_lab.analysis.intervals import add_intervals, interval_note
from gtopk_lab.analysis.outcomes import run_outcomes, time_to_accuracy_table
from gtopk_lab.plotting.export import save_figure
"""),
    md("""
## 1. The study
A dense run has nothing to select, so the study runs it once (not once per density).
"""),
    code("""
lab = Lab(n_workers=n_workers, out=out)
study = lab.study(methods=methods, workers=workers, density=densities, seeds=seeds, bandwidth=bandwidth,
                  base=dict(model=model, dataset=dataset, epochs=epochs, train_samples=train_samples,
                            test_samples=test_samples, max_iterations=max_iterations, sink_every=5))
view = live_convergence(list(study.handles.values()), x="epoch", min_interval_s=1.0)
"""),
    code("""
study.wait()
view.finish()
summaries, metrics = study.summaries(), study.metrics()
summaries["density"] = summaries["density"].where(summaries["method"] != "dense")  # dense selects nothing
summaries[["run_id", "method", "density", "seed", "k", "numel", "status", "final_train_loss",
           "final_test_accuracy"]]
"""),
    code("""
show(figures.convergence_figure(metrics, x="virtual_time_s"))
"""),
    md("## 2. Is convergence \"nearly consistent\"?"),
    code("""
# the study adds a dense P = 1 run (the baseline of its efficiency table): compare at P = workers
done = summaries[(summaries.status == "completed") & (summaries.workers == workers)]
table = (done.groupby(["method", "density"], dropna=False)
             .agg(final_train_loss=("final_train_loss", "mean"), final_test_accuracy=("final_test_accuracy", "mean"),
                  accuracy_std=("final_test_accuracy", "std"), n=("seed", "count"))
             .reset_index())
dense = table[table.method == "dense"]
if len(dense):
    ref = dense.iloc[0]
    table["accuracy_gap_pp"] = 100 * (table.final_test_accuracy - ref.final_test_accuracy)
    table["loss_ratio"] = table.final_train_loss / ref.final_train_loss
    table["nearly_consistent"] = table.accuracy_gap_pp.abs() <= tolerance_pp
# the 95% Student-t confidence interval of the mean final accuracy over seeds (NaN with one seed)
ci = add_intervals(done.assign(density=done.density.fillna(-1)), ["method", "density"], "final_test_accuracy",
                   prefix="accuracy")
table = table.merge(ci[["method", "density", "accuracy_ci_low", "accuracy_ci_high"]].assign(
    density=lambda f: f.density.where(f.density >= 0)), on=["method", "density"], how="left")
display(table.sort_values(["method", "density"]))
print(interval_note(int(table.n.max())))
if len(dense):
    for rho, rows in table[table.method != "dense"].groupby("density"):
        worst = rows.loc[rows.accuracy_gap_pp.abs().idxmax()]
        print(f"rho={rho:g}: largest gap to dense {worst.accuracy_gap_pp:+.2f} accuracy points "
              f"({worst.method}, mean of {worst.n} seed(s)); within {tolerance_pp} pp: "
              f"{bool(rows.nearly_consistent.all())}")
"""),
    md("""
## 3. Time to accuracy
The same budget is not the same progress: when did each method first reach `target_accuracy`
on the test set, in iterations and in virtual seconds on the modelled network? (NaN: not
within this budget.) The figure shows the mean over the seeds that got there, with error bars
of its 95% Student-t confidence interval when two or more did.
"""),
    code("""
evals = metrics[(metrics.kind == "epoch") & metrics.test_accuracy.notna()]
reached = (evals[evals.test_accuracy >= target_accuracy].sort_values("iteration")
           .groupby("run_id").first()[["epoch", "iteration", "virtual_time_s"]])
tta = done.set_index("run_id")[["method", "density", "seed"]].join(reached)
display(tta.groupby(["method", "density"], dropna=False)
           .agg(epoch=("epoch", "mean"), iterations=("iteration", "mean"), virtual_s=("virtual_time_s", "mean"),
                reached=("iteration", "count"), n=("seed", "count")).reset_index())
show(figures.time_to_accuracy_figure(time_to_accuracy_table(done, metrics, target_accuracy)))
"""),
    md("""
## 4. Accuracy against cost (Pareto)
One point per run: its final test accuracy against the bytes one rank sent over the whole run,
and against the run's virtual time. The dashed staircase is the Pareto frontier: the runs that
no other run beats on both axes at once (`gtopk_lab.analysis.pareto`). `save_figure` writes
any figure as PNG, SVG or PDF (kaleido and a Chromium; the `export` extra).
"""),
    code("""
outcomes = run_outcomes(done)
pareto_bytes = figures.pareto_figure(outcomes, x="bytes_sent_per_rank")
show(pareto_bytes)
show(figures.pareto_figure(outcomes, x="virtual_time_s"))
try:
    print("saved", save_figure(pareto_bytes, os.path.join(lab.out, "pareto_bytes.png"), width=900, height=450))
except RuntimeError as exc:  # no kaleido or no Chromium here: the figure above is all there is
    print(exc)
"""),
    md("""
`benchmarks/time_to_accuracy.py` asks why gTop-k needs more epochs than dense here (MNIST-1D
`cnn`, P = 2, rho = 0.01, 40 epochs; figures in `benchmarks/RESULTS.md`, "Time to accuracy"):
the seed paper's density warm-up of 0.004 is *below* rho = 0.01 and slows the start,
momentum on the sparse G/P is needed (without it 69%), and a denser start (rho = 0.05 for the
first 10 epochs, now the `cnn-mnist1d` recipe's default) or the paper's residual rule closes
the final-accuracy gap to dense at 40 epochs (two seeds), though gTop-k still needs about
twice dense's iterations to reach 90%.

How to read section 2: `accuracy_gap_pp` is the final test accuracy minus dense's, in points (means
over the seeds, `accuracy_std` their spread; with one seed a gap below a point or two is noise);
`loss_ratio` the final training loss over dense's. The paper's setting is rho = 0.001
after 141 CIFAR-10 epochs with a density warm-up (`RunConfig.density_warmup=(0.004, 1)`);
short runs at small rho favour dense, because the error-feedback residuals need iterations
to deliver the gradient mass they hold back. Mind the absolute k = rho * d as well (columns
`k`, `numel` above): the MNIST-1D CNN has about 5k parameters, so rho = 0.001 selects about 5
entries per iteration, where the paper's models select thousands; set `model = "cnn_wide"`
(232k parameters, k = 232 at rho = 0.001) to be in the papers' regime. gTop-k applies only k
entries of the summed gradient per iteration (Top-k up to P * k), so it needs more epochs:
`benchmarks/convergence.py` (numbers in `benchmarks/RESULTS.md`) finds gTop-k within 1.5 points
of dense at rho = 0.01 after 120 epochs on `cnn`, and at rho = 0.001 on `cnn_wide`. CI runs this
notebook with one epoch on a tiny model, so its numbers there say nothing about the claim.
"""),
    code("lab.close()"),
]

# --------------------------------------------------------------------------------------------
NOTEBOOKS["02_scaling_efficiency.ipynb"] = [
    md("""
# Scaling efficiency: measured live, modelled, and the paper's 32 workers on 1 GbE

**Run All** at the defaults takes about 38 s on 2 cores (papermill, a fresh results folder;
measured at load 2.1-2.4).

Scaling efficiency = throughput(P) / (P * throughput(1)), with throughput(1) the dense S-SGD
run on one worker of the same network, seed and source, the paper's definition. Compute is
measured; communication time comes from the virtual clock, i.e. the alpha-beta model of each
run's network applied to the bytes each collective really moved.

One `lab.study(...)` launches the whole grid (methods x P x networks x seeds) at once and
returns immediately: P up to the cluster's workers run as real gloo ranks, larger P as
simulator tasks **on the Dask workers** (several at a time, never in this kernel), with the
same rows and results folder. `live_scaling(study)` draws each point as soon as its run's
throughput is steady and moves it while the run goes on (hollow markers: provisional);
headless (papermill, CI) the figures appear when the study is done. The alpha-beta model then
extrapolates to 1024 workers.
"""),
    params("""
n_workers = 4
workers = [1, 2, 4, 8, 16, 32]  # P: up to real_max_workers on real ranks, beyond in the simulator (on the cluster)
real_max_workers = None         # None: as many as the cluster has workers
both_ways = [4]                 # P run real *and* simulated: the simulator's fidelity, side by side
methods = ["dense", "topk", "gtopk", "oktopk"]
bandwidths = ["1GbE", "10GbE"]
density = 0.001
seeds = 1                       # n > 1: mean and 95% Student-t interval over seeds 0 .. n-1 (error bars, table)
model = "cnn"
dataset = "mnist1d"
max_iterations = 30
train_samples = 4000
extrapolate_to = 1024
out = None                # results folder; None: the results home ($GTOPK_LAB_RESULTS, else the project's results/)
"""),
    code(SETUP + """
from gtopk_lab.analysis.predict import predict_scaling
from gtopk_lab.analysis.scaling import baseline_note
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.plotting.live_study import live_convergence_study, live_scaling
from gtopk_lab.plotting.report_figures import efficiency_figure
from gtopk_lab.plotting.report_tables import check_lines, efficiency_pivot, with_links
from gtopk_lab.analysis.intervals import interval_note
from gtopk_lab.analysis.outcomes import run_outcomes
from gtopk_lab.plotting.export import save_figure
"""),
    md("## 1. Launch the study (returns at once)"),
    code("""
lab = Lab(n_workers=n_workers, out=out)
base = dict(model=model, dataset=dataset, epochs=100, max_iterations=max_iterations,
            train_samples=train_samples, sink_every=5)
study = lab.study(methods=methods, workers=workers, bandwidth=bandwidths, density=density, seeds=seeds,
                  real_max_workers=real_max_workers, both_ways=both_ways, base=base)
print(study)
study.status().groupby(["source", "workers"]).size().rename("runs").to_frame().T
"""),
    md("""
## 2. Scaling efficiency and convergence, filling in while the cluster runs
Solid: real ranks; dotted: simulated P; thin dashed: the alpha-beta(-gamma) prediction from
this study's own measured compute. Convergence: one panel per method, one line per P.
"""),
    code("""
scaling = live_scaling(study)
convergence = live_convergence_study(study)
"""),
    md("Wait for the study (the figures above keep moving meanwhile); headless, the final figures are drawn here."),
    code("""
scaling.finish()
convergence.finish()
status = study.status()
print(f"{status.status.str.startswith('completed').sum()} of {len(status)} points completed "
      f"({(status.status == 'completed (stored)').sum()} of them stored by an earlier run of this study)")
"""),
    md("""
## 3. The table, and which points to trust
Per method and P (percent; `mean [low, high] (n)` when there are several seeds: the 95% Student-t
confidence interval of the mean, columns `efficiency_ci_low` / `efficiency_ci_high`; one seed has
none). Each point is checked
against the alpha-beta prediction; a point more than 10 points away (or above 100% beyond
noise) grew compute with P (contention, stragglers) or has a formula that does not hold.
"""),
    code("""
points = study.points()
efficiency = with_links(study.efficiency(), points)
table = efficiency_pivot(efficiency)
display(table.set_index([c for c in table.columns if not c.startswith("P=")]))
print(baseline_note(["dense P=1"]), "Seeds and sources (real / simulated) have their own baseline.")
print(interval_note(int(efficiency.n.max())))
display(efficiency[["link", "method", "workers", "source", "efficiency_mean", "efficiency_ci_low",
                    "efficiency_ci_high", "n"]].round(4))
checked = with_links(study.check(), points)
for line in check_lines(checked):
    print("check:", line)
checked[["link", "method", "workers", "source", "efficiency_mean", "predicted", "error", "trusted"]].round(3)
"""),
    md("""
The same points as the HTML report draws them (`gtopk-lab report`): one panel per network, error
bars over seeds, and the paper's 32-worker values as open markers on 1 GbE, where they apply.
"""),
    code("""
scaling_fig = efficiency_figure(efficiency, with_links(study.predicted(), points))
show(scaling_fig)
try:  # PNG / SVG / PDF through kaleido and the system's Chromium (the `export` extra)
    print("saved", save_figure(scaling_fig, os.path.join(lab.out, "efficiency.svg")))
except RuntimeError as exc:
    print(exc)
"""),
    md("## 4. Where the time goes, and the bytes"),
    code("""
runs = study.summaries()
runs = runs[runs.status == "completed"]
show(figures.time_breakdown_figure(runs[runs.network.astype(str).str.startswith(bandwidths[0])],
                                   title=f"Time per iteration by phase, {bandwidths[0]}"))
show(figures.comm_volume_figure(runs))
"""),
    md("""
What each run achieved against what it cost, one point per run: final loss (test, else train)
against the bytes one rank sent, and against the virtual time; the dashed staircase is the
Pareto frontier (no other run is better on both).
"""),
    code("""
outcomes = run_outcomes(runs.assign(link=runs.network.astype(str)))
y = "final_test_accuracy" if outcomes.final_test_accuracy.notna().any() else "final_loss"
show(figures.pareto_figure(outcomes, x="bytes_sent_per_rank", y=y))
show(figures.pareto_figure(outcomes, x="virtual_time_s", y=y))
"""),
    md("""
## The paper's 32-worker 1 GbE table, side by side with the model

For each model of the paper, the alpha-beta model with the paper's fitted 1 GbE constants
(alpha = 0.436 ms, beta = 9e-6 ms/B) and the paper's own per-iteration compute and selection
times (background section 3) predicts the 32-worker efficiency; rho = 0.001.
"""),
    code("""
paper_models = {  # parameters d, compute s/iter, selection s/iter (Shi et al. breakdown at P=32)
    "VGG-16 / CIFAR-10": (14_728_266, 0.140, 0.091),
    "ResNet-20 / CIFAR-10": (269_722, 0.146, 0.0016),
    "AlexNet / ImageNet": (61_100_840, 0.257, 0.384),
    "ResNet-50 / ImageNet": (25_557_032, 4.88, 0.154),
}
net = NetworkModel.from_strings("1GbE")
rows = []
for name, (d, compute_s, selection_s) in paper_models.items():
    pred = predict_scaling(d, 0.001, compute_s, net, [32], selection_s=selection_s,
                           methods=[("dense", "dense", None), ("topk", "topk", None), ("gtopk", "gtopk", "tree")])
    for r in pred:
        rows.append({"model": name, "method": r["method"], "modelled": r["scaling_efficiency"],
                     "paper": figures.PAPER_SCALING_EFFICIENCY_32_1GBE[name][r["method"]]})
side = pd.DataFrame(rows).pivot(index="model", columns="method", values=["paper", "modelled"])
(100 * side).round(2)
"""),
    md("""
Where the modelled efficiency exceeds the paper's, the difference is time that the
alpha-beta model of the collectives does not contain (everything in the reference
implementation's iteration besides compute, selection and the modelled messages).
"""),
    md("## Extrapolation to many workers"),
    code("""
grid = [2 ** i for i in range(0, int(np.log2(extrapolate_to)) + 1)]
singles = runs[(runs.workers == 1) & (runs.method == "dense")]
base_run = singles[singles.source == "real"].iloc[0] if (singles.source == "real").any() else singles.iloc[0]
compute_s = base_run.time_breakdown_s["compute"] + base_run.time_breakdown_s["update"]
sparse = runs[(runs.method == "gtopk") & (runs.workers > 1)]
selection_s = float(np.mean([tb["selection"] for tb in sparse.time_breakdown_s])) if len(sparse) else 0.0
frames = []
for bw in bandwidths:
    pred = pd.DataFrame(predict_scaling(int(base_run.numel), density, compute_s, NetworkModel.from_strings(bw), grid,
                                        selection_s=selection_s))
    frames.append(pred.assign(bandwidth=bw))
extrap = pd.concat(frames)
extrap = extrap[extrap.method.isin(["dense", "topk", "gtopk-butterfly", "gtopk-tree", "lower-bound"])]
show(figures.scaling_efficiency_figure(extrap[["method", "workers", "scaling_efficiency", "bandwidth"]].iloc[:0],
                                       extrap[["method", "workers", "scaling_efficiency", "bandwidth"]],
                                       paper_models=[], title=f"Modelled scaling efficiency up to {extrapolate_to} workers"))
extrap[extrap.workers == extrapolate_to][["bandwidth", "method", "iteration_s", "scaling_efficiency"]]
"""),
    md("Shut the cluster down when done (the results stay in `out`; `gtopk-lab report` makes an HTML report of them):"),
    code("lab.close()"),
]

# --------------------------------------------------------------------------------------------
NOTEBOOKS["03_topk_operator.ipynb"] = [
    md("""
# The Top-k operator (Shi et al., "Understanding Top-k Sparsification", arXiv:1911.08772)

**Run All** at the defaults takes about 7 s on 2 cores (papermill, measured at load 1.0).

1. The paper observes that accumulated gradients u = g + residual are bell-shaped, so that
   the Top-k error ||u - topk(u)||^2 / ||u||^2 lies far below the Random-k bound (1 - k/d),
   near or below (1 - k/d)^2. The tables below check this on our own training run.
2. GaussianK picks a threshold from a Gaussian fit instead of sorting: O(d), about k
   entries. How fast is it here, and how many entries does it pick?

We train one worker with Top-k + error feedback and take u at a few iterations.
"""),
    params("""
model = "mlp"
dataset = "mnist1d"
density = 0.01
iterations = 200
snapshots = [10, 100, 199]      # iterations at which u is kept
lr = 0.05
batch_size = 32
speed_numel = 4_000_000         # vector size of the selection speed test
speed_repeats = 5
densities = [0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.3]
"""),
    code(SETUP + """
import time
import torch
from gtopk_lab.compression.selection import available_selectors, get_selector
from gtopk_lab.config import k_for
from gtopk_lab.training.data import load_dataset
from gtopk_lab.training.models import build_model
"""),
    code("""
torch.manual_seed(0)
data = load_dataset(dataset, model=model, train_samples=4000, test_samples=1000)
net = build_model(model)
params = [p for p in net.parameters() if p.requires_grad]
d = sum(p.numel() for p in params)
k = k_for(d, density)
topk = get_selector("topk")
residual = torch.zeros(d)
kept = {}
for it in range(iterations):
    idx = torch.randint(0, len(data.x_train), (batch_size,))
    net.zero_grad()
    torch.nn.functional.cross_entropy(net(data.x_train[idx]), data.y_train[idx]).backward()
    u = torch.cat([p.grad.reshape(-1) for p in params]) + residual        # acc = g + residual
    values, indices = topk(u, k)
    residual = u.clone(); residual[indices.long()] = 0                     # error feedback
    update = torch.zeros(d); update[indices.long()] = values
    with torch.no_grad():
        offset = 0
        for p in params:
            p -= lr * update[offset:offset + p.numel()].view_as(p); offset += p.numel()
    if it in snapshots:
        kept[it] = u.clone()
print(f"model {model}: d = {d}, k = {k} at density {density}")
"""),
    code("""
last = max(kept)
show(figures.gradient_histogram_figure(kept[last], density=density,
                                       title=f"Accumulated gradient u at iteration {last}"))
"""),
    code("""
table = pd.concat([figures.topk_error_table(u, densities, label=f"iteration {it}") for it, u in kept.items()])
show(figures.topk_error_figure(table))
summary = table.groupby("k_over_d")[["relative_error", "bound_randomk", "bound_gaussian"]].max()
summary["below_(1-k/d)^2"] = summary.relative_error <= summary.bound_gaussian
summary
"""),
    md("## GaussianK vs exact top-k: selected count and speed"),
    code("""
gaussiank = get_selector("gaussiank")
rows = []
for it, u in kept.items():
    for rho in densities:
        kk = k_for(d, rho)
        rows.append({"label": f"iteration {it}", "k": kk, "selected": int(gaussiank(u, kk)[1].numel())})
counts = pd.DataFrame(rows)
show(figures.gaussiank_count_figure(counts))
counts.assign(ratio=counts.selected / counts.k).pivot(index="k", columns="label", values="ratio")
"""),
    code("""
torch.manual_seed(1)
x = torch.randn(speed_numel)
timing = []
for rho in (0.001, 0.01):
    kk = k_for(speed_numel, rho)
    for name in [n for n in ("topk", "gaussiank", "gaussiank-paper", "exactk-threshold")
                 if n in available_selectors()]:
        select = get_selector(name)
        select(x, kk)                                   # warm-up
        t0 = time.perf_counter()
        for _ in range(speed_repeats):
            _, chosen = select(x, kk)
        per_call_ms = 1e3 * (time.perf_counter() - t0) / speed_repeats
        exact = set(torch.topk(x.abs(), kk).indices.tolist())
        overlap = len(exact & set(chosen.tolist())) / kk
        timing.append({"density": rho, "selector": name, "ms_per_call": per_call_ms,
                       "selected": chosen.numel(), "k": kk, "recall_of_exact_topk": overlap})
pd.DataFrame(timing)
"""),
]

# --------------------------------------------------------------------------------------------
NOTEBOOKS["04_cluster.ipynb"] = [
    md("""
# Running on a real Dask cluster

**Run All** at the defaults (an embedded `LocalCluster`) takes about 9 s on 2 cores
(papermill, measured at load 0.9).

A deployment is one `dask scheduler` and any number of `dask worker` processes (one per
GPU, or one per machine for CPU training):

```bash
dask scheduler --port 8786 --dashboard-address :8787                      # head node
dask worker tcp://HEAD:8786 --nthreads 1 --resources GPU=1                # one per GPU
dask worker tcp://HEAD:8786 --nthreads 1                                  # CPU-only worker
```

`cluster/` has a Dockerfile, a docker-compose file, a TLS certificate script and SLURM /
Kubernetes examples. With TLS, start both with `--tls-ca-file/--tls-cert/--tls-key` and
use `tls://` below. Note that Dask's TLS covers Dask's traffic, not torch.distributed's
own TCP/NCCL connections between ranks.

The parameters default to an embedded `LocalCluster` so that CI can run this notebook.
"""),
    params("""
scheduler_address = None     # a tcp or tls scheduler address, None for an embedded cluster
tls_ca_file = None           # for tls addresses
tls_cert = None
tls_key = None
n_workers = 2                # embedded cluster only
workers = 2                  # ranks of the test run
method = "gtopk"
density = 0.01
model = "mlp"
dataset = "mnist1d"
device = "auto"              # "cuda" places ranks on GPU workers (resource GPU 1)
max_iterations = 20
bandwidth = "none"
out = None                # results folder; None: the results home ($GTOPK_LAB_RESULTS, else the project's results/)
"""),
    code(SETUP),
    code("""
lab = Lab(scheduler=scheduler_address, n_workers=n_workers, out=out,
          tls_ca_file=tls_ca_file, tls_cert=tls_cert, tls_key=tls_key)
print(lab)
address = lab.client.scheduler.address
print("scheduler:", address, "| TLS:", address.startswith("tls://"))
print("dashboard:", lab.dashboard_link)
"""),
    md("## Workers: addresses, threads, memory, GPUs"),
    code("""
info = pd.DataFrame.from_dict(lab.worker_info(), orient="index")
cols = [c for c in ("host", "nthreads", "memory_limit", "resources", "status") if c in info.columns]
print(f"{len(info)} workers, GPU workers: {sum('GPU' in (r or {}) for r in info.get('resources', []))}")
info[cols]
"""),
    md("## A test run: are the ranks talking?"),
    code("""
handle = lab.submit(RunConfig(method=method, workers=workers, density=density, model=model, dataset=dataset,
                              device=device, max_iterations=max_iterations, bandwidth=bandwidth, sink_every=2))
view = live_convergence(handle)
"""),
    code("""
metrics, summary = handle.result()
view.finish()
print(f"{summary['status']} on {summary.get('backend')}/{summary.get('device')}: workers {summary.get('dask_workers')}")
it = metrics[(metrics.kind == "iter")]
show(figures.time_breakdown_figure(pd.DataFrame([summary])))
it.groupby("rank")[["compute_s", "comm_s", "bytes_sent"]].mean()
"""),
    code("lab.close()"),
]

# --------------------------------------------------------------------------------------------
NOTEBOOKS["05_modern_methods.ipynb"] = modern_methods_cells(md, code, params, SETUP)


def build(target: Path = HERE) -> list[Path]:
    """Write every notebook (no outputs, python3 kernel) and return their paths."""
    written = []
    for name, cells in NOTEBOOKS.items():
        nb = new_notebook(cells=cells, metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
            "language_info": {"name": "python"},
        })
        for i, cell in enumerate(nb.cells):
            cell["id"] = f"{name[:2]}-{i:02d}"
        nbformat.validate(nb)
        path = target / name
        nbformat.write(nb, path)
        written.append(path)
    return written


if __name__ == "__main__":
    for p in build(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(p)
