"""Datasets from their real on-disk formats (tiny files), sharding, bad input."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from gtopk_lab.training.data import Shard, load_dataset, read_idx


def _write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(str(path) + ".gz", "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)


def test_mnist_idx_files_gz_and_plain(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    _write_idx(raw / "train-images-idx3-ubyte", rng.integers(0, 256, (12, 28, 28)), compress=True)
    _write_idx(raw / "train-labels-idx1-ubyte", np.arange(12) % 10, compress=True)
    _write_idx(raw / "t10k-images-idx3-ubyte", rng.integers(0, 256, (5, 28, 28)), compress=False)
    _write_idx(raw / "t10k-labels-idx1-ubyte", np.arange(5), compress=False)
    assert read_idx(raw / "t10k-labels-idx1-ubyte").tolist() == [0, 1, 2, 3, 4]
    ds = load_dataset("mnist", model="mlp", train_samples=10, test_samples=100, data_dir=str(tmp_path))
    assert ds.x_train.shape == (10, 1, 28, 28) and ds.x_test.shape == (5, 1, 28, 28)
    assert ds.y_train.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_cifar10_pickles(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, n in (("data_batch_1", 6), ("data_batch_2", 4), ("test_batch", 3)):
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": list(range(n))}
        with open(folder / name, "wb") as fh:
            pickle.dump(batch, fh)
    ds = load_dataset("cifar10", model="resnet20", train_samples=50_000, test_samples=10_000,
                      data_dir=str(tmp_path))
    assert ds.x_train.shape == (10, 3, 32, 32) and ds.x_test.shape == (3, 3, 32, 32)
    assert ds.y_train[:6].tolist() == list(range(6))
    assert abs(float(ds.x_train.mean())) < 1.5


def test_ptb_text(tmp_path: Path) -> None:
    words = "the cat sat on the mat and the dog sat on the log".split()
    for split, n_lines in (("train", 30), ("valid", 3), ("test", 10)):
        lines = [" ".join(words[i % 5:] + words[: i % 5]) for i in range(n_lines)]
        (tmp_path / f"ptb.{split}.txt").write_text("\n".join(lines) + "\n")
    ds = load_dataset("ptb", model="lstm", train_samples=10**6, test_samples=10**6, data_dir=str(tmp_path))
    assert ds.task == "language_model" and ds.x_train.shape[1] == 35
    assert ds.num_classes == len(set(words)) + 2  # + <eos>, <unk>
    torch.testing.assert_close(ds.x_train[0, 1:], ds.y_train[0, :-1])


def test_missing_folder_says_how_to_get_data(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cifar-10-python.tar.gz"):
        load_dataset("cifar10", model="resnet20", train_samples=1, test_samples=1, data_dir=str(tmp_path / "no"))
    with pytest.raises(ValueError, match="ptb.train.txt"):
        load_dataset("ptb", model="lstm", train_samples=1, test_samples=1, data_dir=None)
    with pytest.raises(ValueError, match="dataset='imagenette'"):
        load_dataset("imagenette", model="cnn", train_samples=1, test_samples=1)


@pytest.mark.timeout(60)
def test_mnist1d_digits_synthetic_and_disjoint_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTOPK_LAB_CACHE", str(tmp_path))
    ds = load_dataset("mnist1d", model="cnn", train_samples=400, test_samples=100)
    assert ds.x_train.shape == (400, 40) and ds.x_test.shape == (100, 40)
    assert len(list(tmp_path.glob("mnist1d-*.npz"))) == 1
    again = load_dataset("mnist1d", model="cnn", train_samples=400, test_samples=100)  # from the cache
    torch.testing.assert_close(again.x_train, ds.x_train)
    digits = load_dataset("digits", model="digits_cnn", train_samples=4000, test_samples=1000)
    assert digits.test_samples == 359 and digits.train_samples == 1797 - 359
    synth = load_dataset("synthetic", model="resnet20", train_samples=8, test_samples=2, seed=3)
    assert synth.x_train.shape == (8, 3, 32, 32)

    shards = [Shard(ds, r, 4, 16, seed=0) for r in range(4)]
    rows = {tuple(x.tolist()) for s in shards for x in s.x}
    assert len(rows) == 400 and all(s.iterations_per_epoch == 6 for s in shards)
    first = [b[1] for b in shards[0].epoch(0)]
    assert [b[1] for b in shards[0].epoch(0)][0].tolist() == first[0].tolist()  # seeded order
    assert [b[1] for b in shards[0].epoch(1)][0].tolist() != first[0].tolist()
    with pytest.raises(ValueError, match="batch_size=200 is invalid"):
        Shard(ds, 0, 4, 200, seed=0)
