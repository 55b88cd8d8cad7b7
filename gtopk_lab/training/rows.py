"""Metric rows and the run summary (docs/architecture.md schemas), shared by real ranks and
the simulator, and the buffer that hands rows to the sink in batches."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from gtopk_lab.config import RunConfig, k_for
from gtopk_lab.methods import get_method
from gtopk_lab.training.runtime import network_of

Sink = Callable[[list[dict]], None]

__all__ = ["Sink", "iter_row", "epoch_row", "build_summary", "RowBuffer", "warmup_iterations",
           "steady_seconds_per_iteration"]

#: At most this many first iterations of a run are warm-up (lazy initialisation, allocator
#: and cache warm-up), excluded from its steady-state throughput.
MAX_WARMUP_ITERATIONS = 10


def sync_block(config: RunConfig) -> int:
    """Iterations per synchronisation of the run's method (H of local-steps methods, else 1)."""
    method = get_method(config.method)
    return int(method.run_options(config.method_options).get("sync_every", 1)) if method.local_steps else 1


def warmup_iterations(config: RunConfig, iterations: int) -> int:
    """Iterations at the start of this run's rows left out of its steady throughput:
    ``config.output.warmup_iterations`` or ``min(10, max(1, n // 10))`` of ``n`` rows,
    never so many that fewer than two steady iterations remain (then none)."""
    chosen = config.output.warmup_iterations
    if chosen is None:
        chosen = min(MAX_WARMUP_ITERATIONS, max(1, iterations // 10))
    if isinstance(chosen, bool) or not isinstance(chosen, int) or chosen < 0:
        raise ValueError(f"warmup_iterations={chosen!r} is invalid: expected an int >= 0")
    return chosen if iterations - chosen >= 2 else 0


def steady_seconds_per_iteration(it_rows: list[dict], warmup: int, time: str,
                                 iterations_per_epoch: int, block: int = 1) -> float:
    """Steady ``<time>_time_s`` per iteration after ``warmup`` rows (one rank's rows, in order).

    Virtual time: the **median** over consecutive blocks of ``block`` iterations (a method
    that synchronises every H iterations passes H, so each block holds one sync) of the
    block's virtual time, divided by ``block``: a preempted iteration on a shared machine
    moves a mean, not the median. Virtual time stops during evaluation, so blocks may span
    epochs. Wall time is what the machine took: the mean, leaving out the first iteration
    of each epoch (its interval holds the previous epoch's evaluation).
    """
    key = f"{time}_time_s"
    start = max(warmup - 1, 0)
    rows = it_rows[start:]
    if not rows:
        return math.nan
    # the first row's own time counts from 0 only when it is iteration 0 and not warm-up
    origin = [{key: 0.0, "iteration": -1}] if warmup == 0 and rows[0]["iteration"] == 0 else []
    rows = origin + rows
    if time == "virtual":
        block = max(1, int(block))
        spans = [(rows[i + block][key] - rows[i][key]) / block
                 for i in range(0, len(rows) - block, block)]
        return statistics.median(spans) if spans else math.nan
    spans = [b[key] - a[key] for a, b in zip(rows, rows[1:])
             if b["iteration"] % iterations_per_epoch or a["iteration"] < 0]
    return sum(spans) / len(spans) if spans else math.nan


def iter_row(config: RunConfig, rank: int, world: int, iteration: int, epoch: float, density: float,
             k: int, loss: float, lr: float, t: dict[str, float], stats: Any, comm_model_s: float,
             wall_time_s: float, virtual_time_s: float, *, selected: bool = False,
             peak: tuple[int, int] | None = None) -> dict[str, Any]:
    """One ``kind="iter"`` row in the docs/architecture.md schema.

    ``comm_rounds`` and ``comm_wire_bytes`` (sum over this rank's rounds of
    ``max(sent, recv)``) are what the alpha-beta model needs to price the iteration's
    collective on any other network (:mod:`gtopk_lab.analysis.reprice`). ``selected``: this
    rank paid a selection this iteration (every rank of a sparse method, CLT-k's leader
    alone, every rank whose collective compresses: PowerSGD), so ``selection_s`` is a
    selection's time rather than a share of one. ``peak`` (a
    simulation that emits some ranks' rows only): the largest (rounds, wire bytes) pair of
    all ranks (:func:`peak_comm_pair`), as ``comm_peak_rounds`` / ``comm_peak_wire_bytes``,
    so that a rank the rows leave out can still be the iteration's slowest when repriced.
    """
    rounds, wire = comm_pair(stats)
    extra = {} if peak is None else {"comm_peak_rounds": int(peak[0]), "comm_peak_wire_bytes": int(peak[1])}
    return {
        "kind": "iter", "rank": rank, "iteration": iteration, "epoch": epoch,
        "method": config.method, "workers": world, "density": density, "k": k,
        "train_loss": loss, "lr": lr, "compute_s": t["compute"], "selection_s": t["selection"],
        "selected": bool(selected),
        "comm_s": t["comm"], "update_s": t["update"], "clock_s": t.get("clock", 0.0),
        "comm_span_s": t.get("comm_span", t["comm"]),
        "comm_model_s": comm_model_s, "comm_charge_s": t.get("comm_charge", comm_model_s),
        "bytes_sent": int(getattr(stats, "bytes_sent", 0)), "bytes_recv": int(getattr(stats, "bytes_recv", 0)),
        "comm_rounds": rounds, "comm_wire_bytes": wire,
        "wall_time_s": wall_time_s, "virtual_time_s": virtual_time_s, **extra,
    }


def comm_pair(stats: Any) -> tuple[int, int]:
    """(rounds, sum over them of ``max(sent, recv)``) of one rank's collective (0, 0 without)."""
    steps = getattr(stats, "steps", None) or ()
    return len(steps), int(sum(max(sent, recv) for sent, recv in steps))


def peak_comm_pair(stats: Any) -> tuple[int, int]:
    """The largest :func:`comm_pair` of the ranks' ``stats`` (a sequence), by rounds, then wire
    bytes. Repricing with it is exact when that rank has the most wire bytes too (every
    schedule here: a ring or butterfly is symmetric, a tree's or a binomial broadcast's
    root takes the most rounds, each of the same message), else a lower bound."""
    return max((comm_pair(s) for s in stats), default=(0, 0))


def epoch_row(config: RunConfig, rank: int, world: int, iteration: int, epoch: float, density: float,
              k: int, train_loss: float, test: dict[str, float] | None, wall_time_s: float,
              virtual_time_s: float) -> dict[str, Any]:
    """One ``kind="epoch"`` row (test metrics NaN on ranks that do not evaluate)."""
    test = test or {}
    return {
        "kind": "epoch", "rank": rank, "iteration": iteration, "epoch": epoch,
        "method": config.method, "workers": world, "density": density, "k": k,
        "train_loss": train_loss, "test_loss": test.get("test_loss", math.nan),
        "test_accuracy": test.get("test_accuracy", math.nan),
        "test_perplexity": test.get("test_perplexity", math.nan),
        "test_bits_per_token": test.get("test_bits_per_token", math.nan),
        "wall_time_s": wall_time_s, "virtual_time_s": virtual_time_s,
    }


def build_summary(config: RunConfig, rows: list[dict], *, numel: int, world: int, iterations: int,
                  iterations_per_epoch: int, train_wall_s: float, wall_time_s: float,
                  virtual_time_s: float, status: str = "completed", error: str | None = None,
                  extra: dict[str, Any] | None = None,
                  layout: Sequence[Sequence[int]] = ()) -> dict[str, Any]:
    """The run summary (docs/architecture.md) from one rank's rows and its clocks.

    Throughputs count samples of all ranks: ``samples_per_s_<time>`` is the steady state,
    ``batch_size * P / t_iter`` with ``t_iter`` the mean time per iteration after
    :func:`warmup_iterations` (recorded as ``warmup_iterations``); ``samples_per_s_<time>_all``
    is the whole run's ``iterations * batch_size * P / time``, wall time excluding evaluation. ``time_breakdown_s`` holds mean seconds per
    iteration (wall) of compute, selection, communication and update, plus the mean
    modelled communication ``communication_model`` and ``selection_when_selected``: the mean
    selection over the iterations this rank selected, the time an iteration waits for one
    selection (CLT-k's rank 0 leads one iteration in P, so its ``selection`` is a P-th of that).
    ``comm_formula``: the keywords the method's formulas need beyond the model size
    (``Method.formula_kwargs`` of the run's options and the parameter shapes ``layout``:
    PowerSGD's plan; {} for the others), so the tables can price the run at other P.
    """
    network = network_of(config)
    method = get_method(config.method)
    it_rows = [r for r in rows if r["kind"] == "iter"]
    ep_rows = [r for r in rows if r["kind"] == "epoch" and not math.isnan(r["test_accuracy"])]
    n = max(len(it_rows), 1)

    def mean(key: str) -> float:
        return sum(r[key] for r in it_rows) / n if it_rows else 0.0

    selecting = [r["selection_s"] for r in it_rows if r.get("selected")]

    samples = iterations * config.batch_size * world
    last_ep = ep_rows[-1] if ep_rows else {}
    # Throughputs are steady-state: the first iterations pay one-time costs that a long run
    # amortises, and a short run's figure must not depend on them (nor on a fresh worker).
    own_rows = sorted((r for r in it_rows if r["rank"] == it_rows[0]["rank"]),
                      key=lambda r: r["iteration"]) if it_rows else []
    warmup = warmup_iterations(config, len(own_rows))
    per_sample = config.batch_size * world

    def steady(time: str, fallback: float) -> float:
        if not own_rows:
            return fallback
        t_iter = steady_seconds_per_iteration(own_rows, warmup, time, iterations_per_epoch,
                                              block=sync_block(config))
        return per_sample / t_iter if t_iter > 0 else math.nan
    summary = {
        "run_id": config.run_id, "method": config.method, "workers": world,
        "density": config.density, "k": k_for(numel, config.density), "numel": numel,
        "bandwidth_bps": None if network.unthrottled else network.bandwidth_bps,
        "latency_s": network.latency_s, "network": str(network),
        "epochs": iterations / max(iterations_per_epoch, 1), "iterations": iterations,
        "iterations_per_epoch": iterations_per_epoch,
        "final_train_loss": it_rows[-1]["train_loss"] if it_rows else math.nan,
        "final_test_loss": last_ep.get("test_loss", math.nan),
        "final_test_accuracy": last_ep.get("test_accuracy", math.nan),
        "final_test_perplexity": last_ep.get("test_perplexity", math.nan),
        "final_test_bits_per_token": last_ep.get("test_bits_per_token", math.nan),
        "wall_time_s": wall_time_s, "virtual_time_s": virtual_time_s,
        "samples_per_s_wall": steady("wall", samples / train_wall_s if train_wall_s > 0 else math.nan),
        "samples_per_s_virtual": steady("virtual", samples / virtual_time_s if virtual_time_s > 0
                                        else math.nan),
        "samples_per_s_wall_all": samples / train_wall_s if train_wall_s > 0 else math.nan,
        "samples_per_s_virtual_all": samples / virtual_time_s if virtual_time_s > 0 else math.nan,
        "warmup_iterations": warmup,
        "bytes_sent_per_rank_per_iter": mean("bytes_sent"),
        "time_breakdown_s": {"compute": mean("compute_s"), "selection": mean("selection_s"),
                             "communication": mean("comm_s"), "update": mean("update_s"),
                             "communication_model": mean("comm_model_s"),
                             "selection_when_selected": (sum(selecting) / len(selecting) if selecting
                                                         else 0.0)},
        "model": config.model, "dataset": config.dataset,
        # the pattern the run used: none for Top-k's allgather, Ok-Topk's own, not the config's
        "algorithm": method.pattern_for(config.algorithm),
        "comm_formula": method.formula_kwargs(config.method_options, layout),
        "residual_rule": config.residual_rule, "batch_size": config.batch_size,
        "preset": config.preset, "grad_clip": config.grad_clip,
        "grad_clip_mode": config.grad_clip_mode if config.grad_clip is not None else None,
        "sync_every": sync_block(config),
        "status": status, "error": error,
    }
    if extra:
        summary.update(extra)
    return summary


class RowBuffer:
    """Keeps every row and hands them to ``sink`` in batches."""

    def __init__(self, sink: Sink | None, every: int) -> None:
        self.sink, self.every = sink, every
        self.rows: list[dict] = []
        self._pending: list[dict] = []
        self._iters = 0
        self._checkpointed = 0

    def add(self, row: dict, count_iteration: bool = True) -> None:
        self.rows.append(row)
        self._pending.append(row)
        if count_iteration:
            self._iters += 1
            if self._iters % self.every == 0:
                self.flush()

    def since_checkpoint(self) -> list[dict]:
        """What a checkpoint saves beside its state: the rows added since the previous
        checkpoint, and those the sink had not been handed by then (a batch spans
        checkpoints when ``sink_every`` exceeds an epoch's iterations)."""
        rows = self.rows[self._checkpointed:]
        # without a sink every row is already where it goes (the run's result)
        self._checkpointed = len(self.rows) - (len(self._pending) if self.sink is not None else 0)
        return rows

    def flush(self) -> None:
        if self.sink is not None and self._pending:
            self.sink(self._pending)
        self._pending = []
