"""Per-rank sharding of a training set and evaluation batches (no dataset loading here).

``Shard(dataset, rank, world_size, batch_size, seed, split, alpha)``: ``"iid"`` permutes the
training set once with the seed and cuts it into P disjoint contiguous shards of
``n_train // P`` samples; ``"dirichlet"`` (:func:`dirichlet_split`) gives every rank as many
samples with label proportions drawn from a Dirichlet of concentration ``alpha``. Every rank
computes the whole partition from the seed, so real ranks and the simulator's virtual ranks
hold the same shards; each epoch within a shard uses a fresh permutation seeded by (seed,
epoch, rank). :class:`StackedShards` gives all P shards' batches of an iteration as one
``[P, B, ...]`` gather (the simulator's batched ranks), the same samples each rank's
``Shard.epoch`` gives. :func:`eval_batches` walks the full test split. Cost: O(n_train) once per
rank, O(batch) per batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from gtopk_lab.config import DATA_SPLITS
from gtopk_lab.training.dataset import Dataset

__all__ = ["dirichlet_split", "Shard", "StackedShards", "EpochCursor", "eval_batches"]


# --------------------------------------------------------------------------- sharding
def dirichlet_split(labels: torch.Tensor, world_size: int, per_rank: int, alpha: float,
                    seed: int) -> list[torch.Tensor]:
    """Label-skewed disjoint shards: ``world_size`` index tensors of ``per_rank`` samples each.

    The equal-size label-skew partition of Hsu, Qi and Brown ("Measuring the Effects of
    Non-Identical Data Distribution for Federated Visual Classification", arXiv:1909.06335),
    drawn from finite class pools:

    1. shuffle each class's sample indices (one private NumPy generator from ``seed``);
    2. for rank r = 0..P-1: class proportions ``q_r ~ Dirichlet(alpha * C * prior)``
       (``prior``: the class frequencies, so balanced classes give concentration
       ``alpha`` per class; alpha -> 0: one class per rank, alpha -> inf: the prior);
    3. take ``per_rank`` samples by drawing class counts ``~ Multinomial(q_r)`` restricted
       to the classes with samples left, capped by what is left, until the shard is full
       (a rank whose favourite classes ran out gets others, in proportion to ``q_r``).

    Deterministic from ``seed``; disjoint; ``P * per_rank <= len(labels)`` required.
    Cost: O(n + P C) plus a few multinomial draws per rank.
    """
    n = int(labels.numel())
    if world_size * per_rank > n:
        raise ValueError(f"per_rank={per_rank} is invalid: {world_size} ranks need {world_size * per_rank} "
                         f"samples, the training set has {n}")
    y = labels.detach().cpu().numpy().astype(np.int64, copy=False)
    classes, counts = np.unique(y, return_counts=True)
    # the seed's own stream, tagged so it is independent of the other uses of `seed`
    rng = np.random.default_rng([int(seed) % 2**32, 0x4449524943484C54])
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in classes]
    taken = np.zeros(len(classes), dtype=np.int64)
    concentration = alpha * len(classes) * counts / n
    shards: list[torch.Tensor] = []
    for _ in range(world_size):
        q = rng.dirichlet(concentration)
        mine = np.zeros(len(classes), dtype=np.int64)
        need = per_rank
        while need > 0:
            left = counts - taken - mine
            weights = np.where(left > 0, q, 0.0)
            if weights.sum() <= 0:  # q is ~0 on every class still available
                weights = left.astype(np.float64)
            draw = np.minimum(rng.multinomial(need, weights / weights.sum()), left)
            mine += draw
            need -= int(draw.sum())
        parts = [pools[c][taken[c]:taken[c] + mine[c]] for c in range(len(classes))]
        taken += mine
        shards.append(torch.from_numpy(np.sort(np.concatenate(parts))))
    return shards


class Shard:
    """Rank ``rank``'s disjoint part of the training set, batched per epoch.

    ``split``: ``"iid"`` or ``"dirichlet"`` (with ``alpha``; see the module docstring).
    ``iterations_per_epoch = (n_train // world_size) // batch_size`` (the last partial
    batch is dropped, so all ranks step together). Raises ``ValueError`` when a rank
    would get no full batch, and for ``"dirichlet"`` on a dataset without class labels.
    ``indices``: the training-set indices of this shard.
    """

    def __init__(self, dataset: Dataset, rank: int, world_size: int, batch_size: int,
                 seed: int, split: str = "iid", alpha: float = 0.5) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank!r} is invalid: expected 0 <= rank < world_size={world_size}")
        if split not in DATA_SPLITS:
            raise ValueError(f"data_split={split!r} is invalid: expected one of {', '.join(DATA_SPLITS)}")
        per_rank = dataset.train_samples // world_size
        if per_rank // batch_size < 1:
            raise ValueError(
                f"batch_size={batch_size} is invalid: each of the {world_size} ranks gets "
                f"{per_rank} of {dataset.train_samples} training samples; expected batch_size <= "
                f"{max(per_rank, 1)} (or more train_samples)")
        if split == "dirichlet":
            if dataset.task != "classification" or dataset.y_train.dim() != 1:
                raise ValueError(f"data_split='dirichlet' is invalid for dataset={dataset.name!r}: label skew "
                                 "needs one class label per sample (a classification dataset); use 'iid'")
            if not (math.isfinite(alpha) and alpha > 0):
                raise ValueError(f"dirichlet_alpha={alpha!r} is invalid: expected a finite number > 0")
            idx = dirichlet_split(dataset.y_train, world_size, per_rank, alpha, seed)[rank]
        else:
            perm = torch.randperm(dataset.train_samples, generator=torch.Generator().manual_seed(seed))
            idx = perm[rank * per_rank:(rank + 1) * per_rank]
        self.indices = idx
        self.x = dataset.x_train[idx]
        self.y = dataset.y_train[idx]
        self.rank, self.world_size, self.batch_size, self.seed = rank, world_size, batch_size, seed
        self.iterations_per_epoch = per_rank // batch_size

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """This shard's sample order in ``epoch``: a permutation seeded by (seed, epoch, rank)."""
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch * 10_007 + self.rank) % 2**63)
        return torch.randperm(len(self), generator=g)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of one epoch, in :meth:`epoch_order`."""
        order = self.epoch_order(epoch)
        for i in range(self.iterations_per_epoch):
            sel = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield self.x[sel], self.y[sel]


class StackedShards:
    """The P ranks' shards as one ``[P, n, ...]`` tensor, batched per iteration.

    ``shards``: every rank's :class:`Shard`, in rank order, all of one length and batch size
    (``ValueError`` otherwise). :meth:`epoch` yields, per iteration, ``(x, y)`` of shape
    ``[P, B, ...]`` whose row r is the batch rank r's ``Shard.epoch`` yields there:

    1. once: stack the shards' samples (``x`` ``[P, n, ...]``, ``y`` ``[P, n, ...]``);
    2. per epoch: stack the ranks' :meth:`Shard.epoch_order` into ``[P, n]``;
    3. per iteration: one gather of the B columns of every row.

    Cost: a copy of the training set once; per iteration one gather of P B samples, where P
    shards' batches cost P pairs of indexing calls.
    """

    def __init__(self, shards: list[Shard]) -> None:
        if not shards:
            raise ValueError("shards is empty: expected one Shard per rank (>= 1)")
        first = shards[0]
        for s in shards:
            if len(s) != len(first) or s.batch_size != first.batch_size:
                raise ValueError(f"shards[{s.rank}] has {len(s)} samples in batches of {s.batch_size}: expected "
                                 f"{len(first)} in batches of {first.batch_size} like rank {first.rank}")
        self.shards = shards
        self.x = torch.stack([s.x for s in shards])
        self.y = torch.stack([s.y for s in shards])
        self.batch_size = first.batch_size
        self.iterations_per_epoch = first.iterations_per_epoch

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Steps 2-3: the ``[P, B, ...]`` batches of one epoch."""
        orders = torch.stack([s.epoch_order(epoch) for s in self.shards])
        rows = torch.arange(len(self.shards)).unsqueeze(1)
        b = self.batch_size
        for i in range(self.iterations_per_epoch):
            sel = orders[:, i * b:(i + 1) * b]
            yield self.x[rows, sel], self.y[rows, sel]


class EpochCursor:
    """Where a rank (or the stacked ranks) is in its epoch: :meth:`next_batch` gives the next
    batch of ``source.epoch(epoch)`` (a :class:`Shard` or :class:`StackedShards`), starting the
    epoch's batches afresh at its first iteration or on first use (a resumed run)."""

    def __init__(self, source: Shard | StackedShards) -> None:
        self.source = source
        self._batches: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None

    def next_batch(self, epoch: int, start_of_epoch: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if start_of_epoch or self._batches is None:
            self._batches = self.source.epoch(epoch)
        return next(self._batches)


def eval_batches(dataset: Dataset, batch_size: int = 1000) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The full test split in order, in batches of ``batch_size``."""
    for start in range(0, dataset.test_samples, batch_size):
        yield dataset.x_test[start:start + batch_size], dataset.y_test[start:start + batch_size]


