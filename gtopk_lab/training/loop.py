"""The per-rank S-SGD training loop: ``train_rank(config, sink, device) -> RankResult``.

One iteration on rank i of P (docs/architecture.md, "Data flow of one iteration"):

1. forward + backward on the rank's shard; every parameter's ``.grad`` is a view into
   one model-sized flat buffer, so the gradient ``g`` is that buffer (no copy)
2. optional local gradient clipping (``grad_clip``: ``g *= min(1, clip / ||g||)``) and,
   with ``momentum_correction`` (DGC, Lin et al. 2018), local velocity
   ``u = m * u + g`` which replaces ``g`` in what follows
3. sparse methods: ``acc = ErrorFeedback.compensate(g)``; ``values, indices = selector(acc, k)``
4. the method's collective, wrapped by the :class:`VirtualClock` (virtual time, throttling):
   ``dense -> dense_allreduce(g)``, ``topk / gaussiank -> topk_allgather``,
   ``gtopk -> gtopk_allreduce(algorithm=config.algorithm)``
5. ``ErrorFeedback.update`` (rule ``config.residual_rule``); with momentum correction the
   velocity is zeroed at this rank's own selection S_i (DGC's momentum factor masking: the
   entries whose accumulated velocity just left the residual)
6. the aggregated ``G / P`` is written into the flat gradient buffer and SGD steps
   (momentum / weight decay as configured, LR from :func:`~gtopk_lab.training.optim.lr_at`)
7. one metric row (docs/architecture.md schema), flushed to ``sink`` every ``sink_every``

Costs per iteration: one forward/backward, O(d) for flattening-free error feedback and
update, the selector's cost, and the collective's (see gtopk_lab.collectives).
Timings are wall-clock (``perf_counter``; CUDA is synchronised before each reading).

The process group: ``train_rank`` uses the default group when one is initialised
(any world size, also 1); without one it runs as the only rank (P must then be 1), using
the in-process collectives of :mod:`gtopk_lab.collectives_sim` so that stats match.

Evaluation (every ``eval_every_epochs`` and at the end) runs on rank 0 only, on the full
test split, outside the virtual clock; other ranks emit their epoch rows with NaN test
metrics. Epoch ``train_loss`` is the mean over all ranks of their epoch-mean losses.

Seeding: every rank seeds torch with ``config.seed`` before building the model
(identical initial weights), then with ``config.seed + rank`` for dropout; data order is
seeded in :class:`~gtopk_lab.training.data.Shard`. On CPU the same config gives the same
metrics (timings aside).

Example::

    # torchrun --nproc-per-node 4 -m gtopk_lab.train --method gtopk --density 0.01
    result = train_rank(RunConfig(method="gtopk", workers=4))
    result.summary["final_test_accuracy"]
"""

from __future__ import annotations

import math
import os
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gtopk_lab.config import RunConfig, k_for
from gtopk_lab.network.clock import VirtualClock
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.training.data import Dataset, Shard, check_model_fits, eval_batches, load_dataset
from gtopk_lab.training.models import get_model_spec, build_model, count_parameters
from gtopk_lab.training.optim import density_at, lr_at, make_optimizer, set_lr

Sink = Callable[[list[dict]], None]

__all__ = ["RankResult", "train_rank", "resolve_device"]


@dataclass
class RankResult:
    """All metric rows of one rank and its summary (rank 0's is the run summary)."""

    rows: list[dict] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    #: Flat copy of the final parameters, only when ``config.extra["return_weights"]`` is
    #: true (tests compare real and simulated runs with it); None otherwise.
    final_weights: torch.Tensor | None = None


# =========================================================================== plumbing
def resolve_device(config: RunConfig, device: torch.device | str | None = None) -> torch.device:
    """``device`` if given, else from ``config.device``: "auto" = cuda:LOCAL_RANK if available."""
    if device is not None:
        return torch.device(device)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if config.device == "cpu":
        return torch.device("cpu")
    if config.device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' is invalid here: torch sees no CUDA device; use 'auto' or 'cpu'")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _limit_threads(ranks_per_host: int) -> None:
    """Give each rank its share of the cores when ranks would oversubscribe them."""
    cores = os.cpu_count() or 1
    if ranks_per_host > 1:
        threads = max(1, cores // ranks_per_host)
        if threads < torch.get_num_threads():
            torch.set_num_threads(threads)


def network_of(config: RunConfig) -> NetworkModel:
    """The configured link model."""
    return NetworkModel.from_strings(config.bandwidth, config.latency)


# =========================================================================== replica
class Replica:
    """Model, optimiser and the one flat gradient buffer that every ``.grad`` views.

    In a real run each rank holds one replica; the simulator holds one for all its
    virtual ranks (weights are identical across ranks in synchronous SGD).
    """

    def __init__(self, config: RunConfig, world_size: int, device: torch.device) -> None:
        self.config = config
        self.world_size = world_size
        self.device = device
        self.spec = get_model_spec(config.model)
        model_kwargs = dict(config.extra.get("model_kwargs", {}))
        torch.manual_seed(config.seed)  # identical initial weights on every rank
        self.model: nn.Module = build_model(config.model, **model_kwargs).to(device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.numel = count_parameters(self.model)
        self.grad = torch.zeros(self.numel, dtype=torch.float32, device=device)
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = self.grad[offset:offset + n].view_as(p)
            offset += n
        self.optimizer = make_optimizer(self.model, config)
        self.language_model = self.spec.task == "language_model"

    def flat_weights(self) -> torch.Tensor:
        """A copy of all parameters as one flat tensor (tests compare these)."""
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.language_model:
            return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
        return F.cross_entropy(output, target)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Zero the flat buffer, forward, backward; returns the mini-batch loss."""
        self.model.train()
        self.grad.zero_()
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        loss = self.loss(self.model(x), y)
        loss.backward()
        return float(loss.detach())

    def apply(self, aggregate: torch.Tensor, lr: float) -> None:
        """Write ``aggregate / P`` into the gradient buffer and take one SGD step."""
        torch.div(aggregate, self.world_size, out=self.grad)
        set_lr(self.optimizer, lr)
        self.optimizer.step()

    @torch.no_grad()
    def evaluate(self, dataset: Dataset, batch_size: int = 1000) -> dict[str, float]:
        """Mean test loss, accuracy (fraction; per token for LMs) and perplexity (LMs)."""
        self.model.eval()
        total_loss, correct, count = 0.0, 0, 0
        for x, y in eval_batches(dataset, batch_size):
            x, y = x.to(self.device), y.to(self.device)
            out = self.model(x)
            n = y.numel()
            total_loss += float(self.loss(out, y)) * n
            correct += int((out.argmax(-1) == y).sum())
            count += n
        self.model.train()
        loss = total_loss / max(count, 1)
        return {"test_loss": loss, "test_accuracy": correct / max(count, 1),
                "test_perplexity": math.exp(min(loss, 700.0)) if self.language_model else math.nan}


# =========================================================================== per-rank state
class RankState:
    """What one (real or virtual) rank keeps between iterations.

    Residual memory, DGC velocity, its data shard, dropout RNG state and BN buffers
    (the simulator swaps the last two in and out of the shared replica).
    """

    def __init__(self, config: RunConfig, rank: int, world_size: int, replica: Replica,
                 dataset: Dataset) -> None:
        self.rank = rank
        self.config = config
        self.shard = Shard(dataset, rank, world_size, config.batch_size, config.seed)
        device = replica.device
        self.sparse = config.method != "dense"
        self.selector = _selector(config) if self.sparse else None
        self.error_feedback = _error_feedback(config, replica.numel, device) if self.sparse else None
        # DGC momentum correction only means something for sparse methods; dense runs keep
        # the optimiser's ordinary momentum (see optim.make_optimizer).
        self.velocity = (torch.zeros(replica.numel, device=device)
                         if config.momentum_correction and self.sparse else None)
        # Ok-Topk's region boundaries, re-balanced every few calls rather than every call.
        self.oktopk_state = _oktopk_state() if config.method == "oktopk" else None
        gen = torch.Generator().manual_seed(config.seed + 1 + rank)
        self.rng_state = gen.get_state()
        self.buffers = [b.detach().clone() for b in replica.model.buffers()]
        self.batches: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.epoch_loss_sum = 0.0
        self.epoch_loss_count = 0

    def next_batch(self, epoch: int, start_of_epoch: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if start_of_epoch or self.batches is None:
            self.batches = self.shard.epoch(epoch)
        return next(self.batches)

    @contextmanager
    def active(self, replica: Replica, swap_buffers: bool) -> Iterator[None]:
        """Make this rank's RNG (and, when ``swap_buffers``, BN buffers) current."""
        outer_rng = torch.get_rng_state()
        torch.set_rng_state(self.rng_state)
        if swap_buffers:
            for b, mine in zip(replica.model.buffers(), self.buffers):
                b.copy_(mine)
        try:
            yield
        finally:
            self.rng_state = torch.get_rng_state()
            torch.set_rng_state(outer_rng)
            if swap_buffers:
                for b, mine in zip(replica.model.buffers(), self.buffers):
                    mine.copy_(b)


@dataclass
class LocalSelection:
    """Output of :func:`prepare_local` for one rank and one iteration."""

    gradient: torch.Tensor                 # g (after clipping / momentum correction)
    acc: torch.Tensor | None = None        # g + residual (sparse methods)
    values: torch.Tensor | None = None
    indices: torch.Tensor | None = None


def prepare_local(state: RankState, replica: Replica, k: int) -> LocalSelection:
    """Steps 2-3: clip, momentum correction, error-feedback compensation, selection.

    For the simulator ``replica.grad`` is cloned because the next virtual rank reuses it.
    """
    g = replica.grad
    cfg = state.config
    if cfg.grad_clip is not None:
        norm = float(torch.linalg.vector_norm(g))
        if norm > cfg.grad_clip:
            g = g * (cfg.grad_clip / (norm + 1e-12))
    if state.velocity is not None:
        state.velocity.mul_(cfg.momentum).add_(g)
        g = state.velocity
    if not state.sparse:
        return LocalSelection(gradient=g)
    acc = state.error_feedback.compensate(g)
    values, indices = state.selector(acc, k)
    return LocalSelection(gradient=g, acc=acc, values=values, indices=indices)


def finish_local(state: RankState, local: LocalSelection, result: Any) -> None:
    """Step 5: residual update and momentum factor masking.

    The velocity is masked at the rank's *local* selection S_i, as in DGC (Lin et al. 2018,
    ``U <- U * not(Mask)`` with the local mask). Masking at the global index set instead
    would zero the velocity of entries this rank never sent (their accumulated mass still
    sits in its residual) whenever another rank's selection reached the global set.
    """
    if state.sparse:
        _update_error_feedback(state.error_feedback, local, result)
        if state.velocity is not None:
            state.velocity[local.indices.long()] = 0.0


def aggregate_dense(result: Any, numel: int, device: torch.device) -> torch.Tensor:
    """The collective's result as a dense model-sized tensor G (sum over ranks)."""
    if result.indices is None:
        return result.values.reshape(-1)
    dense = torch.zeros(numel, dtype=result.values.dtype, device=device)
    dense[result.indices.long()] = result.values
    return dense


# =========================================================================== adapters to the core
def _selector(config: RunConfig) -> Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]:
    from gtopk_lab.compression.selection import get_selector

    return get_selector(config.default_selector)


def _error_feedback(config: RunConfig, numel: int, device: torch.device) -> Any:
    from gtopk_lab.compression.residual import ErrorFeedback

    return ErrorFeedback(numel, rule=config.residual_rule, device=device)


def _update_error_feedback(ef: Any, local: LocalSelection, result: Any) -> None:
    ef.update(local.acc, local.values, local.indices, result)


def _oktopk_state() -> Any:
    from gtopk_lab.oktopk import OkTopkState

    return OkTopkState()


def _exact_k(config: RunConfig) -> bool:
    """The selector always returns exactly k: gTop-k sends header-free k-pair messages and
    the Top-k AllGather skips its count allgather."""
    from gtopk_lab.compression.selection import selects_exactly_k

    return selects_exactly_k(config.default_selector)


def collective_call(config: RunConfig, local: LocalSelection, numel: int, k: int,
                    oktopk_state: Any = None
                    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """(function, args, kwargs) of this method's real collective for one rank."""
    from gtopk_lab import collectives as C

    if config.method == "dense":
        return C.dense_allreduce, (local.gradient,), {}
    if config.method in ("topk", "gaussiank"):
        return C.topk_allgather, (local.values, local.indices, numel), {
            "exact_count": k if _exact_k(config) else None}
    if config.method == "gtopk":
        return C.gtopk_allreduce, (local.values, local.indices, numel, k), {
            "algorithm": config.algorithm, "exact_k": _exact_k(config)}
    fn = getattr(C, "oktopk_allreduce", None)
    if fn is None:
        raise ValueError(f"method={config.method!r} is not available: gtopk_lab.collectives has no "
                         "oktopk_allreduce; expected dense, topk, gtopk or gaussiank")
    return fn, (local.values, local.indices, numel, k), {"state": oktopk_state}


def simulated_collective(config: RunConfig, locals_: list[LocalSelection], numel: int, k: int,
                         oktopk_state: Any = None) -> list[Any]:
    """The in-process collective of :mod:`gtopk_lab.collectives_sim`: one result per rank.

    Dense inputs are summed in place, so callers pass per-rank copies of the gradient.
    """
    from gtopk_lab import collectives_sim as S

    if config.method == "dense":
        return S.sim_dense_allreduce([loc.gradient for loc in locals_])
    values = [loc.values for loc in locals_]
    indices = [loc.indices for loc in locals_]
    if config.method in ("topk", "gaussiank"):
        return S.sim_topk_allgather(values, indices, numel, exact_count=k if _exact_k(config) else None)
    if config.method == "gtopk":
        return S.sim_gtopk_allreduce(values, indices, numel, k, algorithm=config.algorithm,
                                     exact_k=_exact_k(config))
    fn = getattr(S, "sim_oktopk_allreduce", None)
    if fn is None:
        raise ValueError(f"method={config.method!r} is not available in the simulator: expected "
                         "dense, topk, gtopk or gaussiank")
    return fn(values, indices, numel, k, state=oktopk_state)


# =========================================================================== rows / summary
def iter_row(config: RunConfig, rank: int, world: int, iteration: int, epoch: float, density: float,
             k: int, loss: float, lr: float, t: dict[str, float], stats: Any, comm_model_s: float,
             wall_time_s: float, virtual_time_s: float) -> dict[str, Any]:
    """One ``kind="iter"`` row in the docs/architecture.md schema."""
    return {
        "kind": "iter", "rank": rank, "iteration": iteration, "epoch": epoch,
        "method": config.method, "workers": world, "density": density, "k": k,
        "train_loss": loss, "lr": lr, "compute_s": t["compute"], "selection_s": t["selection"],
        "comm_s": t["comm"], "update_s": t["update"], "comm_model_s": comm_model_s,
        "bytes_sent": int(getattr(stats, "bytes_sent", 0)), "bytes_recv": int(getattr(stats, "bytes_recv", 0)),
        "wall_time_s": wall_time_s, "virtual_time_s": virtual_time_s,
    }


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
        "wall_time_s": wall_time_s, "virtual_time_s": virtual_time_s,
    }


def build_summary(config: RunConfig, rows: list[dict], *, numel: int, world: int, iterations: int,
                  iterations_per_epoch: int, train_wall_s: float, wall_time_s: float,
                  virtual_time_s: float, status: str = "completed", error: str | None = None,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run summary (docs/architecture.md) from one rank's rows and its clocks.

    Throughputs count samples of all ranks: ``iterations * batch_size * P / time``, with
    wall time excluding evaluation. ``time_breakdown_s`` holds mean seconds per
    iteration (wall) of compute, selection, communication and update, plus the mean
    modelled communication ``communication_model``.
    """
    network = network_of(config)
    it_rows = [r for r in rows if r["kind"] == "iter"]
    ep_rows = [r for r in rows if r["kind"] == "epoch" and not math.isnan(r["test_accuracy"])]
    n = max(len(it_rows), 1)

    def mean(key: str) -> float:
        return sum(r[key] for r in it_rows) / n if it_rows else 0.0

    samples = iterations * config.batch_size * world
    last_ep = ep_rows[-1] if ep_rows else {}
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
        "wall_time_s": wall_time_s, "virtual_time_s": virtual_time_s,
        "samples_per_s_wall": samples / train_wall_s if train_wall_s > 0 else math.nan,
        "samples_per_s_virtual": samples / virtual_time_s if virtual_time_s > 0 else math.nan,
        "bytes_sent_per_rank_per_iter": mean("bytes_sent"),
        "time_breakdown_s": {"compute": mean("compute_s"), "selection": mean("selection_s"),
                             "communication": mean("comm_s"), "update": mean("update_s"),
                             "communication_model": mean("comm_model_s")},
        "model": config.model, "dataset": config.dataset, "algorithm": config.algorithm,
        "residual_rule": config.residual_rule, "batch_size": config.batch_size,
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

    def add(self, row: dict, count_iteration: bool = True) -> None:
        self.rows.append(row)
        self._pending.append(row)
        if count_iteration:
            self._iters += 1
            if self._iters % self.every == 0:
                self.flush()

    def flush(self) -> None:
        if self.sink is not None and self._pending:
            self.sink(self._pending)
        self._pending = []


# =========================================================================== the loop
def _process_group(config: RunConfig) -> tuple[int, int, bool]:
    """(rank, world size, has a process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        if world != config.workers:
            raise ValueError(f"workers={config.workers} does not match the process group's world "
                             f"size {world}")
        return dist.get_rank(), world, True
    if config.workers != 1:
        raise ValueError(f"workers={config.workers} needs an initialised torch.distributed process "
                         "group (torchrun, gtopk-lab run, run_gloo); without one only workers=1 runs")
    return 0, 1, False


def _all_mean(value: float, has_group: bool, world: int) -> float:
    if not has_group or world == 1:
        return value
    import torch.distributed as dist

    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t) / world


def rank_checkpoint_state(replica: Replica, state: RankState, *, virtual_time_s: float,
                          iteration: int, epoch: int, wall_time_s: float,
                          eval_wall_s: float) -> dict[str, Any]:
    """Everything this rank needs to continue after a completed epoch (see training.checkpoint).

    The replica must hold this rank's BN buffers (the simulator swaps them in first)."""
    import dataclasses

    return {
        "iteration": iteration, "epoch": epoch, "rank": state.rank,
        "model": replica.model.state_dict(),
        "optimizer": replica.optimizer.state_dict(),
        "error_feedback": state.error_feedback.state_dict() if state.error_feedback is not None else None,
        "velocity": state.velocity.detach().cpu().clone() if state.velocity is not None else None,
        "oktopk": dataclasses.asdict(state.oktopk_state) if state.oktopk_state is not None else None,
        "rng_state": state.rng_state.clone(),
        "virtual_time_s": float(virtual_time_s),
        "wall_time_s": float(wall_time_s), "eval_wall_s": float(eval_wall_s),
    }


def restore_rank_state(saved: dict[str, Any], replica: Replica, state: RankState) -> None:
    """Inverse of :func:`rank_checkpoint_state`, but for the clock: the caller advances its
    clock by ``saved["virtual_time_s"]`` (once, also when it restores several virtual ranks).
    Weights are copied in place, so the parameters keep their ``.grad`` views into the flat
    buffer; ``state.buffers`` takes this rank's BN buffers."""
    replica.model.load_state_dict(saved["model"])
    replica.optimizer.load_state_dict(saved["optimizer"])
    if state.error_feedback is not None and saved.get("error_feedback") is not None:
        state.error_feedback.load_state_dict(saved["error_feedback"])
    if state.velocity is not None and saved.get("velocity") is not None:
        state.velocity.copy_(saved["velocity"].to(state.velocity.device))
    if state.oktopk_state is not None and saved.get("oktopk") is not None:
        from gtopk_lab.oktopk import OkTopkState

        state.oktopk_state = OkTopkState(**saved["oktopk"])
    state.rng_state = saved["rng_state"].clone()
    state.buffers = [b.detach().clone() for b in replica.model.buffers()]


def _barrier(has_group: bool) -> None:
    if has_group:
        import torch.distributed as dist

        dist.barrier()


def run_dataset(config: RunConfig) -> Dataset:
    """The run's dataset (every rank loads the same; each trains on its own shard), checked
    against the model's input shape."""
    dataset = load_dataset(config.dataset, model=config.model, train_samples=config.train_samples,
                           test_samples=config.test_samples, seed=config.seed, data_dir=config.data_dir,
                           num_classes=config.extra.get("model_kwargs", {}).get("vocab_size"))
    check_model_fits(config.model, dataset)
    return dataset


def train_rank(config: RunConfig, sink: Sink | None = None,
               device: torch.device | None = None, *, checkpoint_dir: str | None = None,
               resume_from: str | None = None) -> RankResult:
    """Train this rank of ``config`` (see the module docstring for one iteration).

    Requires an initialised default process group of ``config.workers`` ranks, except for
    ``workers=1``, which also runs without one. Rows go to ``sink(rows)`` every
    ``config.sink_every`` iterations and at the end; exceptions propagate (after the
    rows produced so far were flushed).

    Checkpoints (:mod:`gtopk_lab.training.checkpoint`): with ``config.checkpoint`` and a
    ``checkpoint_dir``, every rank saves its state at the end of every epoch, then (after
    a barrier) rank 0 writes ``latest.json``. ``resume_from`` (a checkpoint folder) loads
    the newest complete checkpoint, if any, and continues from the next epoch: on CPU
    the final weights equal those of an uninterrupted run. Rows and the summary's
    per-iteration means then cover only the resumed part; ``iterations`` is the total.
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"config has type {type(config).__name__}: expected RunConfig")
    rank, world, has_group = _process_group(config)
    dev = resolve_device(config, device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    _limit_threads(int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    setup_start = time.perf_counter()

    dataset = run_dataset(config)
    replica = Replica(config, world, dev)
    state = RankState(config, rank, world, replica, dataset)
    if dev.type == "cuda":  # CUDA dropout masks differ between ranks, as on CPU
        torch.cuda.manual_seed(config.seed + 1 + rank)
    ipe = state.shard.iterations_per_epoch
    total = config.epochs * ipe if config.max_iterations is None else min(config.max_iterations,
                                                                          config.epochs * ipe)
    clock = VirtualClock(network_of(config), throttle=config.throttle,
                         include_merge_cpu=config.virtual_merge_cpu)
    buffer = RowBuffer(sink, config.sink_every)
    eval_wall_s = 0.0
    k = k_for(replica.numel, config.density)
    density = config.density
    start_iteration = 0
    # Wall time counts training from here: building the dataset and the replica (seconds
    # for MNIST-1D on a fresh worker) is reported as setup_wall_s, not as training time,
    # so a short run's throughput does not depend on whether its worker was fresh.
    wall_start = time.perf_counter()
    setup_wall_s = wall_start - setup_start
    if resume_from is not None:
        from gtopk_lab.training import checkpoint as ckpt

        latest = ckpt.resume_point(resume_from, world)
        if latest is not None:
            saved = ckpt.load_rank_state(resume_from, latest["epoch"], rank)
            restore_rank_state(saved, replica, state)
            clock.advance(float(saved["virtual_time_s"]))  # continue the virtual timeline
            start_iteration = int(saved["iteration"])
            wall_start -= float(saved["wall_time_s"])
            eval_wall_s = float(saved["eval_wall_s"])
    save_checkpoints = bool(config.checkpoint) and checkpoint_dir is not None
    try:
        clock.mark()
        for it in range(start_iteration, total):
            epoch_index, pos = divmod(it, ipe)
            progress = it / ipe
            lr = lr_at(config, progress, world)
            density = density_at(config, progress)
            k = k_for(replica.numel, density)
            x, y = state.next_batch(epoch_index, pos == 0)
            t: dict[str, float] = {}

            t0 = time.perf_counter()
            with state.active(replica, swap_buffers=False):
                loss = replica.forward_backward(x, y)
            _sync(dev)
            t1 = time.perf_counter()
            local = prepare_local(state, replica, k)
            _sync(dev)
            t2 = time.perf_counter()
            if has_group:
                fn, args, kwargs = collective_call(config, local, replica.numel, k, state.oktopk_state)
                result = clock.collective(fn, *args, **kwargs)
            else:
                result = clock.collective(lambda: simulated_collective(
                    config, [local], replica.numel, k, state.oktopk_state)[0])
            _sync(dev)
            t3 = time.perf_counter()
            finish_local(state, local, result)
            replica.apply(aggregate_dense(result, replica.numel, dev), lr)
            _sync(dev)
            t4 = time.perf_counter()
            t = {"compute": t1 - t0, "selection": t2 - t1, "comm": t3 - t2, "update": t4 - t3}
            state.epoch_loss_sum += loss
            state.epoch_loss_count += 1
            buffer.add(iter_row(config, rank, world, it, (it + 1) / ipe, density, k, loss, lr, t,
                                result.stats, clock.last_comm_model_s, t4 - wall_start,
                                clock.virtual_time_s))

            end_of_epoch = (it + 1) % ipe == 0
            if end_of_epoch or it + 1 == total:
                done_epochs = (it + 1) / ipe
                is_eval = (it + 1 == total) or (end_of_epoch and round(done_epochs) % config.eval_every_epochs == 0)
                e0 = time.perf_counter()
                with clock.paused():
                    mean_loss = _all_mean(state.epoch_loss_sum / max(state.epoch_loss_count, 1),
                                          has_group, world)
                    state.epoch_loss_sum, state.epoch_loss_count = 0.0, 0
                    test = replica.evaluate(dataset) if (is_eval and rank == 0) else None
                    if end_of_epoch or is_eval:
                        buffer.add(epoch_row(config, rank, world, it + 1, done_epochs, density, k,
                                             mean_loss, test, time.perf_counter() - wall_start,
                                             clock.virtual_time_s), count_iteration=False)
                eval_wall_s += time.perf_counter() - e0
                if save_checkpoints and end_of_epoch:
                    from gtopk_lab.training import checkpoint as ckpt

                    with clock.paused():
                        done = (it + 1) // ipe
                        ckpt.save_rank_state(checkpoint_dir, done, rank, rank_checkpoint_state(
                            replica, state, virtual_time_s=clock.virtual_time_s, iteration=it + 1,
                            epoch=done, wall_time_s=time.perf_counter() - wall_start,
                            eval_wall_s=eval_wall_s))
                        _barrier(has_group)
                        if rank == 0:
                            ckpt.write_latest(checkpoint_dir, done, it + 1, world)
                            ckpt.prune_older(checkpoint_dir, done)
        wall_time_s = time.perf_counter() - wall_start
        summary = build_summary(config, buffer.rows, numel=replica.numel, world=world, iterations=total,
                                iterations_per_epoch=ipe, train_wall_s=wall_time_s - eval_wall_s,
                                wall_time_s=wall_time_s, virtual_time_s=clock.virtual_time_s,
                                extra={"rank": rank, "device": str(dev),
                                       "merge_cpu_s": clock.total_merge_cpu_s,
                                       "virtual_merge_cpu": clock.include_merge_cpu,
                                       "setup_wall_s": setup_wall_s})
        weights = replica.flat_weights().cpu() if config.extra.get("return_weights") else None
        return RankResult(rows=buffer.rows, summary=summary, final_weights=weights)
    finally:  # rows produced before an exception still reach the sink
        buffer.flush()


def gloo_rank_entry(rank: int, world_size: int, config_dict: dict[str, Any]) -> RankResult:
    """``run_gloo`` target: ``train_rank`` of ``RunConfig.from_dict(config_dict)`` on this rank.

    Example::

        from gtopk_lab.distributed_utils import run_gloo
        results = run_gloo(gloo_rank_entry, 4, cfg.to_dict(), timeout_s=120)
    """
    return train_rank(RunConfig.from_dict(config_dict))


def gloo_checkpoint_entry(rank: int, world_size: int, config_dict: dict[str, Any],
                          checkpoint_dir: str | None, resume_from: str | None) -> RankResult:
    """``run_gloo`` target like :func:`gloo_rank_entry`, with checkpoint / resume folders."""
    return train_rank(RunConfig.from_dict(config_dict), checkpoint_dir=checkpoint_dir,
                      resume_from=resume_from)


def failed_summary(config: RunConfig, exc: BaseException) -> dict[str, Any]:
    """A minimal summary for a run that raised (status "failed", message + traceback)."""
    return {"run_id": config.run_id, "method": config.method, "workers": config.workers,
            "density": config.density, "status": "failed",
            "error": f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc))}"}
