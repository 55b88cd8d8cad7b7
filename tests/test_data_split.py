"""The non-IID split (RunConfig.data_split = "dirichlet"): label histograms per rank against
alpha, disjoint non-empty shards covering the set, determinism, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.config_flags import flag_of
from gtopk_lab.training.data import Shard, dirichlet_split
from gtopk_lab.training.dataset import Dataset

CLASSES = 10


def _dataset(n: int = 4000, seed: int = 0, task: str = "classification") -> Dataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % CLASSES  # balanced classes
    y = y[torch.randperm(n, generator=g)]
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)  # a sample's value is its index
    return Dataset("toy", x, y, x[:10], y[:10], CLASSES, task)


def _histograms(ds: Dataset, world: int, alpha: float, seed: int = 0, split: str = "dirichlet") -> np.ndarray:
    shards = [Shard(ds, r, world, 8, seed, split=split, alpha=alpha) for r in range(world)]
    return np.stack([np.bincount(s.y.numpy(), minlength=CLASSES) for s in shards]).astype(float)


def _mean_tv(hists: np.ndarray) -> float:
    """Oracle: mean total-variation distance of each rank's label distribution to the pooled one."""
    p = hists / hists.sum(axis=1, keepdims=True)
    pooled = hists.sum(axis=0) / hists.sum()
    return float(0.5 * np.abs(p - pooled).sum(axis=1).mean())


@pytest.mark.timeout(30)
def test_label_skew_follows_alpha() -> None:
    ds = _dataset()
    world = 10  # 400 samples per rank, 400 per class: small alpha leaves about one class a rank
    skew = {alpha: _mean_tv(_histograms(ds, world, alpha)) for alpha in (0.01, 0.1, 1.0, 1000.0)}
    iid = _mean_tv(_histograms(ds, world, 1.0, split="iid"))
    assert skew[0.01] > 0.75  # TV of a one-class rank to uniform over 10 classes is 0.9
    assert skew[0.01] > skew[0.1] > skew[1.0] > skew[1000.0]
    assert skew[1000.0] < 0.1 and iid < 0.1
    # alpha -> 0: a rank's largest class dominates its shard
    top = _histograms(ds, world, 0.01).max(axis=1) / 400
    assert np.median(top) > 0.9


@pytest.mark.timeout(30)
@pytest.mark.parametrize("world, alpha", [(4, 0.05), (7, 0.5), (16, 10.0)])
def test_shards_are_disjoint_non_empty_equal_and_deterministic(world: int, alpha: float) -> None:
    ds = _dataset(n=1000)
    shards = [Shard(ds, r, world, 8, seed=3, split="dirichlet", alpha=alpha) for r in range(world)]
    seen = [set(s.x[:, 0].long().tolist()) for s in shards]
    per_rank = 1000 // world
    assert all(len(s) == per_rank for s in seen)  # non-empty, equal, no duplicate inside a shard
    union = set().union(*seen)
    assert len(union) == world * per_rank  # disjoint, covering all but the remainder 1000 mod P
    for s in shards:
        assert torch.equal(s.y, ds.y_train[s.indices])  # labels travel with their samples
        assert s.iterations_per_epoch == per_rank // 8
    again = dirichlet_split(ds.y_train, world, per_rank, alpha, seed=3)
    assert all(torch.equal(a, s.indices) for a, s in zip(again, shards))  # from the seed alone
    other = dirichlet_split(ds.y_train, world, per_rank, alpha, seed=4)
    assert any(not torch.equal(a, b) for a, b in zip(again, other))


@pytest.mark.timeout(10)
def test_bad_split_and_alpha_name_the_field() -> None:
    for kw, field in ((dict(data_split="noniid"), "data_split"), (dict(dirichlet_alpha=0.0), "dirichlet_alpha"),
                      (dict(dirichlet_alpha=-1.0), "dirichlet_alpha"),
                      (dict(dirichlet_alpha=float("nan")), "dirichlet_alpha"),
                      (dict(dirichlet_alpha=float("inf")), "dirichlet_alpha")):
        with pytest.raises(ValueError, match=f"^{field}="):
            RunConfig(**kw)
    cfg = RunConfig(data_split="dirichlet", dirichlet_alpha=2)
    assert cfg.dirichlet_alpha == 2.0 and RunConfig.from_dict(cfg.to_dict()) == cfg
    assert flag_of("dirichlet_alpha") == "--dirichlet-alpha"
    ds = _dataset(n=100)
    with pytest.raises(ValueError, match="data_split='x'"):
        Shard(ds, 0, 2, 8, 0, split="x")
    with pytest.raises(ValueError, match="dirichlet_alpha=0"):
        Shard(ds, 0, 2, 8, 0, split="dirichlet", alpha=0)
    lm = Dataset("lm", torch.zeros(100, 5, dtype=torch.long), torch.zeros(100, 5, dtype=torch.long),
                 torch.zeros(4, 5, dtype=torch.long), torch.zeros(4, 5, dtype=torch.long), 7, "language_model")
    with pytest.raises(ValueError, match="data_split='dirichlet' is invalid for dataset='lm'"):
        Shard(lm, 0, 2, 8, 0, split="dirichlet", alpha=1.0)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("split", ["iid", "dirichlet"])
def test_stacked_shards_give_each_rank_the_batches_its_own_shard_gives(split: str) -> None:
    from gtopk_lab.training.shards import StackedShards
    ds, world, batch = _dataset(n=1000), 5, 8
    shards = [Shard(ds, r, world, batch, seed=7, split=split, alpha=0.5) for r in range(world)]
    stacked = StackedShards(shards)
    for epoch in (0, 3):
        got = list(stacked.epoch(epoch))
        assert len(got) == shards[0].iterations_per_epoch
        # oracle: each rank's own batches, one after the other
        for r, shard in enumerate(shards):
            for i, (x, y) in enumerate(shard.epoch(epoch)):
                assert torch.equal(got[i][0][r], x) and torch.equal(got[i][1][r], y)
    assert got[0][0].shape == (world, batch, 1) and got[0][1].shape == (world, batch)
    uneven = Shard(ds, 0, world, batch * 2, seed=7)
    with pytest.raises(ValueError, match=r"shards\[0\] has .* batches of 16"):
        StackedShards([shards[1], uneven])
