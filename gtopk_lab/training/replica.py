"""One model replica and what each rank keeps: the state shared by real ranks and the simulator.

``Replica``: the model, its optimiser and the one flat gradient buffer every ``.grad``
views. ``RankState``: per (real or virtual) rank, its method's training step, data shard,
RNG state and BN buffers. Also the checkpoint state of a rank and the plumbing both
loops need (device, threads, network, dataset).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gtopk_lab.config import RunConfig
from gtopk_lab.methods import get_method
from gtopk_lab.network.model import NetworkModel, network_model
from gtopk_lab.training.data import Dataset, check_model_fits, load_dataset
from gtopk_lab.training.shards import Shard, eval_batches
from gtopk_lab.training.models import build_model, count_parameters, get_model_spec
from gtopk_lab.training.optim import dgc_local_velocity, make_optimizer, set_lr
from gtopk_lab.training.step import LocalSteps, RankStep, flat_params, load_flat_params

__all__ = ["RankResult", "Replica", "RankState", "resolve_device", "sync_device", "limit_threads",
           "network_of", "run_dataset", "rank_checkpoint_state", "restore_rank_state"]


@dataclass
class RankResult:
    """All metric rows of one rank and its summary (rank 0's is the run summary)."""

    rows: list[dict] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    #: Flat copy of the final parameters, only when ``config.extra["return_weights"]`` is
    #: true (tests compare real and simulated runs with it); None otherwise.
    final_weights: torch.Tensor | None = None


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


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_cpu_timer(device: torch.device) -> Callable[[], float]:
    """The clock a rank's compute is measured with: the training thread's CPU time when
    torch computes on that one thread (a Dask worker's other threads are not the rank's
    compute), else the process's CPU time (intra-op threads count too)."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.process_time


def rank_clock_s(device: torch.device) -> float:
    """Now on the clock compute is timed with: synchronised wall time on CUDA, else
    :func:`rank_cpu_timer`'s CPU time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return rank_cpu_timer(device)()


def limit_threads(ranks_per_host: int) -> None:
    """Give each rank its share of the cores when ranks would oversubscribe them."""
    cores = os.cpu_count() or 1
    if ranks_per_host > 1:
        threads = max(1, cores // ranks_per_host)
        if threads < torch.get_num_threads():
            torch.set_num_threads(threads)


def network_of(config: RunConfig) -> NetworkModel:
    """The configured link model: the process-wide cache of :func:`~gtopk_lab.network.model.network_model`
    (the parse RunConfig's validation already made)."""
    return network_model(config.bandwidth, config.latency)


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
        #: DGC's weight decay inside the momentum: added to every rank's gradient (see optim)
        self.decay_in_gradient = config.weight_decay if dgc_local_velocity(config) else 0.0
        #: parameter shapes in flat-buffer order (per-layer collectives reshape with it)
        self.layout = tuple(tuple(p.shape) for p in self.params)
        self.language_model = self.spec.task == "language_model"

    def flat_weights(self) -> torch.Tensor:
        """A copy of all parameters as one flat tensor (tests compare these)."""
        return flat_params(self.params)

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
        if self.decay_in_gradient:
            with torch.no_grad():
                for p in self.params:  # p.grad is a view into self.grad
                    p.grad.add_(p, alpha=self.decay_in_gradient)
        return float(loss.detach())

    def load_flat(self, flat: torch.Tensor) -> None:
        """Copy a flat tensor into the parameters in place (they keep their ``.grad`` views)."""
        load_flat_params(self.params, flat)

    def local_step(self, optimizer: torch.optim.Optimizer, lr: float) -> None:
        """One optimiser step on this rank's own gradient (local steps between syncs)."""
        set_lr(optimizer, lr)
        optimizer.step()

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
                "test_perplexity": math.exp(min(loss, 700.0)) if self.language_model else math.nan,
                # nats per token -> bits per token: bits per byte for the byte tokenizer
                "test_bits_per_token": loss / math.log(2) if self.language_model else math.nan}


class RankState:
    """What one (real or virtual) rank keeps between iterations.

    Its method's :class:`~gtopk_lab.training.step.RankStep` (memory, velocity, collective
    state), its data shard, dropout RNG state and BN buffers (the simulator swaps the last
    two in and out of the shared replica). For methods with local steps (``sync_every`` > 1)
    also its own weights and optimiser while they differ between synchronisations
    (``local``: the :class:`~gtopk_lab.training.step.LocalSteps` anchor and outer optimiser).
    """

    def __init__(self, config: RunConfig, rank: int, world_size: int, replica: Replica,
                 dataset: Dataset, own_optimizer: bool = False) -> None:
        self.rank = rank
        self.config = config
        self.method = get_method(config.method)
        self.shard = Shard(dataset, rank, world_size, config.batch_size, config.seed,
                           split=config.data_split, alpha=config.dirichlet_alpha)
        self.step = RankStep(self.method, replica.numel, replica.device, rank=rank,
                             residual_rule=config.residual_rule, selector=config.selector,
                             grad_clip=config.grad_clip, grad_clip_mode=config.grad_clip_mode,
                             momentum_correction=config.momentum_correction,
                             momentum=config.momentum, algorithm=config.algorithm, layout=replica.layout,
                             world=world_size, options=config.extra,
                             collective_options=config.extra.get("collective_options"))
        gen = torch.Generator().manual_seed(config.seed + 1 + rank)
        self.rng_state = gen.get_state()
        self.buffers = [b.detach().clone() for b in replica.model.buffers()]
        self.local = LocalSteps(self.method, replica.params, config) if self.method.local_steps else None
        # virtual ranks of a local-steps method each keep their weights and inner optimiser
        self.optimizer = make_optimizer(replica.model, config) if own_optimizer else replica.optimizer
        self.weights = replica.flat_weights() if own_optimizer else None
        self.batches: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.epoch_loss_sum = 0.0
        self.epoch_loss_count = 0

    def next_batch(self, epoch: int, start_of_epoch: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if start_of_epoch or self.batches is None:
            self.batches = self.shard.epoch(epoch)
        return next(self.batches)

    @contextmanager
    def active(self, replica: Replica, swap_buffers: bool) -> Iterator[None]:
        """Make this rank's RNG (and, when ``swap_buffers``, BN buffers; with own weights,
        its weights) current in the shared replica."""
        outer_rng = torch.get_rng_state()
        torch.set_rng_state(self.rng_state)
        if swap_buffers:
            for b, mine in zip(replica.model.buffers(), self.buffers):
                b.copy_(mine)
        if self.weights is not None:
            replica.load_flat(self.weights)
        try:
            yield
        finally:
            self.rng_state = torch.get_rng_state()
            torch.set_rng_state(outer_rng)
            if swap_buffers:
                for b, mine in zip(replica.model.buffers(), self.buffers):
                    mine.copy_(b)
            if self.weights is not None:
                self.weights = replica.flat_weights()


def rank_checkpoint_state(replica: Replica, state: RankState, *, virtual_time_s: float,
                          iteration: int, epoch: int, wall_time_s: float,
                          eval_wall_s: float) -> dict[str, Any]:
    """Everything this rank needs to continue after a completed epoch (see training.checkpoint).

    The replica must hold this rank's BN buffers (the simulator swaps them in first)."""
    return {
        "iteration": iteration, "epoch": epoch, "rank": state.rank,
        "model": replica.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "step": state.step.state_dict(),
        "local_steps": state.local.state_dict() if state.local is not None else None,
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
    state.optimizer.load_state_dict(saved["optimizer"])
    state.step.load_state_dict(saved["step"])
    if state.local is not None and saved.get("local_steps") is not None:
        state.local.load_state_dict(saved["local_steps"])
    if state.weights is not None:
        state.weights = replica.flat_weights()
    state.rng_state = saved["rng_state"].clone()
    state.buffers = [b.detach().clone() for b in replica.model.buffers()]


def run_dataset(config: RunConfig) -> Dataset:
    """The run's dataset (every rank loads the same; each trains on its own shard), checked
    against the model's input shape."""
    model_kwargs = config.extra.get("model_kwargs", {})
    dataset = load_dataset(config.dataset, model=config.model, train_samples=config.train_samples,
                           test_samples=config.test_samples, seed=config.seed, data_dir=config.data_dir,
                           num_classes=model_kwargs.get("vocab_size"),
                           # a GPT built with another context trains on windows of that length
                           seq_len=model_kwargs.get("block_size"),
                           tokenizer=config.extra.get("tokenizer", "byte"))
    check_model_fits(config.model, dataset)
    return dataset
