"""What each (real or virtual) rank keeps between iterations, and its checkpoint state.

``RankState``: the rank's training step (:class:`~gtopk_lab.training.step.RankStep`, built from
the run's :class:`~gtopk_lab.training.step_settings.StepSettings`), its data shard, dropout RNG
state and BN buffers; a virtual rank whose weights diverge from the others' between
synchronisations (a local-steps method in the simulator) also its own weights and optimiser.
:func:`rank_checkpoint_state` / :func:`restore_rank_state`: everything a rank needs to
continue after a completed epoch (:mod:`gtopk_lab.training.checkpoint` writes it).
``RankResult``: one rank's rows, summary and (on request) final weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.training.data import Dataset
from gtopk_lab.training.optim import make_optimizer
from gtopk_lab.training.replica import Replica
from gtopk_lab.training.shards import EpochCursor, Shard
from gtopk_lab.training.step import RankStep
from gtopk_lab.training.step_settings import StepSettings

__all__ = ["RankResult", "RankState", "rank_checkpoint_state", "restore_rank_state"]


@dataclass
class RankResult:
    """All metric rows of one rank and its summary (rank 0's is the run summary)."""

    rows: list[dict] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    #: Flat copy of the final parameters, only when ``config.output.return_weights`` is
    #: true (tests compare real and simulated runs with it); None otherwise.
    final_weights: torch.Tensor | None = None


class RankState:
    """What one (real or virtual) rank keeps between iterations (see the module docstring).

    ``shares_replica``: this rank's replica serves other ranks too (the simulator): it then
    keeps its RNG and BN buffers to swap in (:meth:`active`) and, when its weights diverge
    between synchronisations (``settings.local_steps``), its own weights and optimiser.
    """

    def __init__(self, settings: StepSettings, config: RunConfig, rank: int, replica: Replica,
                 dataset: Dataset, *, shares_replica: bool = False) -> None:
        self.rank = rank
        self.config = config
        self.shard = Shard(dataset, rank, settings.world, config.batch_size, config.seed,
                           split=config.data_split, alpha=config.dirichlet_alpha)
        gen = torch.Generator().manual_seed(config.seed + 1 + rank)
        self.rng_state = gen.get_state()
        self.buffers = [b.detach().clone() for b in replica.model.buffers()]
        own_weights = shares_replica and settings.local_steps
        self.optimizer = make_optimizer(replica.model, config) if own_weights else replica.optimizer
        self.weights = replica.flat_weights() if own_weights else None
        self.step = RankStep(settings, replica.numel, replica.device, rank=rank, layout=replica.layout,
                             params=replica.params, optimizer=self.optimizer)
        self.cursor = EpochCursor(self.shard)
        self.epoch_loss_sum = 0.0
        self.epoch_loss_count = 0

    def next_batch(self, epoch: int, start_of_epoch: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cursor.next_batch(epoch, start_of_epoch)

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
    local = state.step.local
    return {
        "iteration": iteration, "epoch": epoch, "rank": state.rank,
        "model": replica.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "step": state.step.state_dict(),
        "local_steps": local.state_dict() if local is not None else None,
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
    local = state.step.local
    if local is not None and saved.get("local_steps") is not None:
        local.load_state_dict(saved["local_steps"])
    if state.weights is not None:
        state.weights = replica.flat_weights()
    state.rng_state = saved["rng_state"].clone()
    state.buffers = [b.detach().clone() for b in replica.model.buffers()]
