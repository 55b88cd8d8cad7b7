"""Datasets and per-rank sharding; nothing is downloaded at run time.

=============  ============================================================================
name           source
=============  ============================================================================
``digits``     scikit-learn's ``load_digits`` (1,797 8x8 images shipped in the wheel)
``mnist1d``    ``mnist1d.data.make_dataset`` (offline, from the package's templates),
               cached as ``.npz`` under ``$GTOPK_LAB_CACHE`` or ``~/.cache/gtopk-lab``
``synthetic``  seeded random tensors of the model's input shape (throughput runs)
``cifar10``    a local ``cifar-10-batches-py`` folder (torchvision's pickles)
``mnist``      a local folder of MNIST idx files (``.gz`` or not; torchvision's ``MNIST/raw``)
``ptb``        a local folder holding ``ptb.train.txt``, ``ptb.valid.txt``, ``ptb.test.txt``
``text``       bytes of 32 pinned CPython 3.11 stdlib modules (SHA-256 checked), or a local
               text file / folder of ``.txt`` files; last 10% validation
               (:mod:`gtopk_lab.training.text_data`)
=============  ============================================================================

Sizes: ``config.train_samples`` / ``config.test_samples`` cap the number of samples
taken from each split (mnist1d and synthetic generate exactly that many); the recipes
set the full sizes for CIFAR-10 and PTB.

Sharding (``config.data_split``, :mod:`gtopk_lab.training.shards`): ``"iid"`` permutes the training set once with
``config.seed`` and cuts it into P disjoint contiguous shards of equal size
``n_train // P`` (the remainder is unused), so every rank runs the same number of
iterations per epoch. ``"dirichlet"`` (non-IID label skew, :func:`dirichlet_split`) gives
every rank the same ``n_train // P`` samples, but with class proportions drawn from a
Dirichlet of concentration ``config.dirichlet_alpha``. Every rank computes the whole
partition from the seed, so real ranks and the simulator's virtual ranks hold the same
shards. Within a shard each epoch uses a fresh permutation seeded by (seed, epoch, rank).
Evaluation uses the full test split, or with ``config.model_options.validation_fraction = f``
(:func:`validation_split`, what LR tuning uses) a validation split carved from the training
set: a seeded permutation of the training samples, its last ``round(f n)`` held out and
evaluated on, the rest trained on; the test split is then not touched.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gtopk_lab.training.dataset import Dataset
from gtopk_lab.training.models import ModelSpec, get_model_spec
from gtopk_lab.training.text_data import load_text_dataset
# sharding lives in shards.py; these names stay importable from here
from gtopk_lab.training.shards import Shard, dirichlet_split, eval_batches  # noqa: F401

DATASETS: tuple[str, ...] = ("digits", "mnist1d", "synthetic", "cifar10", "mnist", "ptb", "text")

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
#: Tokens per PTB training sample (truncated BPTT length).
PTB_BPTT = 35


def cache_dir() -> Path:
    """Where generated arrays are cached: ``$GTOPK_LAB_CACHE`` or ``~/.cache/gtopk-lab``."""
    return Path(os.environ.get("GTOPK_LAB_CACHE", Path.home() / ".cache" / "gtopk-lab"))


def _atomic_save_npz(path: Path, **arrays: np.ndarray) -> None:
    # Several ranks may generate the same file at once: write aside, then rename.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def _require_dir(data_dir: str | None, dataset: str, how: str) -> Path:
    if data_dir is None:
        raise ValueError(f"data_dir=None is invalid for dataset={dataset!r}: expected a local folder; {how}")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise ValueError(f"data_dir={data_dir!r} is not a folder (dataset={dataset!r}): {how}")
    return path


def _cap(x: torch.Tensor, y: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return x[:n], y[:n]


# --------------------------------------------------------------------------- generators
def load_digits_dataset(train_samples: int, test_samples: int, seed: int) -> Dataset:
    """scikit-learn digits (8x8, pixel values 0..16 scaled to 0..1), seeded split.

    The test split takes ``min(test_samples, 20%)`` of the 1,797 images, the train split
    at most ``train_samples`` of the rest.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_test = min(test_samples, round(0.2 * len(y)))
    n_train = min(train_samples, len(y) - n_test)
    return Dataset("digits", x[n_test:n_test + n_train], y[n_test:n_test + n_train],
                   x[:n_test], y[:n_test], 10)


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def load_mnist1d_dataset(train_samples: int, test_samples: int, seed: int = 42) -> Dataset:
    """MNIST-1D built offline by ``make_dataset`` (never ``get_dataset``, which downloads).

    ``num_samples = train_samples + test_samples`` and ``train_split`` matches, so the
    default 4000/1000 reproduces the published split. Arrays are cached by their args.
    Cost: ~2 s to generate 5,000 samples (plus ~3 s to import mnist1d), milliseconds from
    the cache, which is keyed by the package version, the sizes and the seed.
    """
    num_samples = train_samples + test_samples
    # keyed by the package version, not its default args: reading those imports mnist1d,
    # which imports matplotlib and scipy (about 3 s of CPU), while a cache hit needs neither
    key_args = {"mnist1d": _package_version("mnist1d"), "num_samples": num_samples,
                "train_samples": train_samples, "seed": seed}
    key = hashlib.sha256(json.dumps(key_args, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / f"mnist1d-{key}.npz"
    arrays: dict[str, np.ndarray] | None = None
    if path.exists():
        try:
            with np.load(path) as f:
                arrays = {k: f[k] for k in ("x", "y", "x_test", "y_test")}
        except (OSError, ValueError, KeyError, EOFError):  # a corrupt cache is rebuilt
            arrays = None
    if arrays is None:
        from mnist1d.data import get_dataset_args, make_dataset
        from mnist1d.utils import ObjectView

        args = get_dataset_args(as_dict=True)
        args.update(num_samples=num_samples, train_split=train_samples / num_samples, seed=seed)
        args.pop("url", None)

        state = np.random.get_state()  # make_dataset reseeds numpy's global RNG
        try:
            data = make_dataset(ObjectView(dict(args)))
        finally:
            np.random.set_state(state)
        arrays = {k: np.asarray(data[k]) for k in ("x", "y", "x_test", "y_test")}
        try:
            _atomic_save_npz(path, **arrays)
        except OSError:  # read-only home: run without the cache
            pass
    return Dataset(
        "mnist1d",
        torch.tensor(arrays["x"], dtype=torch.float32)[:train_samples],
        torch.tensor(arrays["y"], dtype=torch.int64)[:train_samples],
        torch.tensor(arrays["x_test"], dtype=torch.float32)[:test_samples],
        torch.tensor(arrays["y_test"], dtype=torch.int64)[:test_samples],
        10,
    )


def load_synthetic_dataset(spec: ModelSpec, train_samples: int, test_samples: int, seed: int,
                           num_classes: int | None = None) -> Dataset:
    """Seeded random samples of the model's input shape (N(0,1) inputs / uniform token ids).

    For throughput and scaling runs: the values are meaningless, the shapes are real.
    """
    classes = num_classes or spec.num_classes
    g = torch.Generator().manual_seed(seed)
    n = train_samples + test_samples
    if spec.task == "language_model":
        x = torch.randint(0, classes, (n, *spec.input_shape), generator=g)
        y = torch.randint(0, classes, (n, *spec.input_shape), generator=g)
    else:
        x = torch.randn(n, *spec.input_shape, generator=g)
        y = torch.randint(0, classes, (n,), generator=g)
    return Dataset("synthetic", x[:train_samples], y[:train_samples], x[train_samples:],
                   y[train_samples:], classes, spec.task)


_CIFAR_HOW = ("download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz on a machine with "
              "internet, extract it and pass the folder holding cifar-10-batches-py/ (or that folder)")


def load_cifar10_dataset(data_dir: str | None, train_samples: int, test_samples: int) -> Dataset:
    """CIFAR-10 from torchvision's on-disk pickles (``data_batch_1..5``, ``test_batch``).

    Images are scaled to 0..1 and normalised per channel with the usual CIFAR-10 mean/std.
    """
    root = _require_dir(data_dir, "cifar10", _CIFAR_HOW)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    train_files = sorted(root.glob("data_batch_*"))
    if not train_files or not (root / "test_batch").exists():
        raise ValueError(f"data_dir={data_dir!r} holds no CIFAR-10 batches "
                         f"(data_batch_1..5, test_batch): {_CIFAR_HOW}")

    def read(files: list[Path]) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for f in files:
            with open(f, "rb") as fh:
                batch = pickle.load(fh, encoding="bytes")
            xs.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.append(np.asarray(batch.get(b"labels", batch.get(b"fine_labels")), dtype=np.int64))
        x = torch.from_numpy(np.concatenate(xs)).float() / 255.0
        mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
        return (x - mean) / std, torch.from_numpy(np.concatenate(ys))

    x_train, y_train = _cap(*read(train_files), train_samples)
    x_test, y_test = _cap(*read([root / "test_batch"]), test_samples)
    return Dataset("cifar10", x_train, y_train, x_test, y_test, 10)


_MNIST_HOW = ("fetch train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz "
              "and t10k-labels-idx1-ubyte.gz (e.g. from a torchvision MNIST/raw folder) and pass their folder")


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed): magic 0x0000 <dtype> <ndim>, big-endian dims."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    dtypes = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
    if zero != 0 or dtype_code not in dtypes:
        raise ValueError(f"{path} is not an IDX file (magic {data[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=dtypes[dtype_code], offset=4 + 4 * ndim).reshape(dims)


def load_mnist_dataset(data_dir: str | None, train_samples: int, test_samples: int) -> Dataset:
    """MNIST from idx files (``.gz`` or plain), in ``data_dir`` or ``data_dir/MNIST/raw``.

    Pixels are scaled to 0..1 and normalised with mean 0.1307 and std 0.3081.
    """
    root = _require_dir(data_dir, "mnist", _MNIST_HOW)
    if (root / "MNIST" / "raw").is_dir():
        root = root / "MNIST" / "raw"

    def find(stem: str) -> Path:
        for candidate in (root / stem, root / f"{stem}.gz"):
            if candidate.exists():
                return candidate
        raise ValueError(f"data_dir={data_dir!r} has no {stem}[.gz]: {_MNIST_HOW}")

    def images(stem: str) -> torch.Tensor:
        x = torch.from_numpy(read_idx(find(stem)).astype(np.float32)) / 255.0
        return ((x - 0.1307) / 0.3081).unsqueeze(1)

    def labels(stem: str) -> torch.Tensor:
        return torch.from_numpy(read_idx(find(stem)).astype(np.int64))

    x_train, y_train = _cap(images("train-images-idx3-ubyte"), labels("train-labels-idx1-ubyte"),
                            train_samples)
    x_test, y_test = _cap(images("t10k-images-idx3-ubyte"), labels("t10k-labels-idx1-ubyte"),
                          test_samples)
    return Dataset("mnist", x_train, y_train, x_test, y_test, 10)


_PTB_HOW = ("copy ptb.train.txt, ptb.valid.txt and ptb.test.txt (the Mikolov PTB text, e.g. from "
            "the simple-examples tarball) into one folder and pass it")


def load_ptb_dataset(data_dir: str | None, train_samples: int, test_samples: int,
                     bptt: int = PTB_BPTT) -> Dataset:
    """Penn Treebank word-level LM: vocabulary from the train file (+ ``<eos>`` per line).

    The token stream is cut into non-overlapping ``bptt``-long samples, input
    ``tokens[i:i+bptt]`` and target ``tokens[i+1:i+bptt+1]``; the test split is ptb.test.txt.
    Words of valid/test absent from train map to ``<unk>``.
    """
    root = _require_dir(data_dir, "ptb", _PTB_HOW)
    files = {split: root / f"ptb.{split}.txt" for split in ("train", "valid", "test")}
    missing = [p.name for p in files.values() if not p.exists()]
    if missing:
        raise ValueError(f"data_dir={data_dir!r} lacks {', '.join(missing)}: {_PTB_HOW}")

    def words(path: Path) -> list[str]:
        out: list[str] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            out += line.split() + ["<eos>"]
        return out

    train_words = words(files["train"])
    vocab = {w: i for i, w in enumerate(dict.fromkeys(train_words + ["<unk>"]))}
    unk = vocab["<unk>"]

    def samples(ws: list[str], cap: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor([vocab.get(w, unk) for w in ws], dtype=torch.int64)
        n = max(0, (len(ids) - 1) // bptt)
        if n == 0:
            raise ValueError(f"PTB split has {len(ids)} tokens: fewer than bptt+1={bptt + 1}")
        n = min(n, cap)
        x = ids[: n * bptt].view(n, bptt)
        y = ids[1: n * bptt + 1].view(n, bptt)
        return x, y

    x_train, y_train = samples(train_words, train_samples)
    x_test, y_test = samples(words(files["test"]), test_samples)
    return Dataset("ptb", x_train, y_train, x_test, y_test, len(vocab), "language_model")


def validation_split(dataset: Dataset, fraction: Any, seed: int) -> Dataset:
    """``dataset`` with a validation split carved from its training set as its evaluation split.

    1. permute the n training indices with a generator seeded by ``seed``;
    2. the last ``v = round(fraction * n)`` permuted samples are the validation split (the
       dataset's ``x_test`` / ``y_test`` now), the first ``n - v`` the training split;
    3. the original test split is dropped (a tuned choice must never see it).

    ``fraction`` in (0, 1) and both parts non-empty, else ``ValueError`` naming
    ``validation_fraction``. O(n).
    """
    n = dataset.train_samples
    ok = isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0.0 < fraction < 1.0
    held = int(round(fraction * n)) if ok else 0
    if not ok or not 1 <= held < n:
        raise ValueError(f"validation_fraction={fraction!r} is invalid for {n} training samples: expected a "
                         "fraction in (0, 1) leaving at least one sample on each side")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    train, valid = order[:n - held], order[n - held:]
    return Dataset(dataset.name, dataset.x_train[train], dataset.y_train[train], dataset.x_train[valid],
                   dataset.y_train[valid], dataset.num_classes, dataset.task)


def load_dataset(name: str, *, model: str, train_samples: int, test_samples: int, seed: int = 0,
                 data_dir: str | None = None, num_classes: int | None = None,
                 seq_len: int | None = None, tokenizer: str = "byte") -> Dataset:
    """Load dataset ``name`` for ``model`` (whose spec gives the synthetic input shape).

    Unknown names raise ``ValueError`` listing :data:`DATASETS`. ``seed`` drives the
    digits split and the synthetic values; mnist1d always uses its own seed (42) so
    that the published split is reproduced. ``seq_len`` and ``tokenizer`` apply to
    ``text`` only (``seq_len`` None: the model's ``input_shape[0]``).
    """
    if name not in DATASETS:
        raise ValueError(f"dataset={name!r} is invalid: expected one of {', '.join(DATASETS)}")
    if name == "digits":
        return load_digits_dataset(train_samples, test_samples, seed)
    if name == "mnist1d":
        return load_mnist1d_dataset(train_samples, test_samples)
    if name == "synthetic":
        return load_synthetic_dataset(get_model_spec(model), train_samples, test_samples, seed,
                                      num_classes)
    if name == "cifar10":
        return load_cifar10_dataset(data_dir, train_samples, test_samples)
    if name == "mnist":
        return load_mnist_dataset(data_dir, train_samples, test_samples)
    if name == "text":
        spec = get_model_spec(model)
        return load_text_dataset(data_dir, train_samples, test_samples,
                                 seq_len=seq_len if seq_len is not None else int(spec.input_shape[0]),
                                 tokenizer=tokenizer, num_classes=num_classes)
    return load_ptb_dataset(data_dir, train_samples, test_samples)


def check_model_fits(model: str, dataset: Dataset) -> None:
    """Raise ``ValueError`` when the model's input shape does not match the dataset's samples."""
    spec = get_model_spec(model)
    sample_shape = tuple(dataset.x_train.shape[1:])
    # Variable-length LMs (the GPTs) take any [T] sequence; the model checks T <= block_size.
    any_length = spec.variable_length and len(sample_shape) == 1
    if (dataset.name != "synthetic" and not any_length
            and int(np.prod(sample_shape)) != int(np.prod(spec.input_shape))):
        raise ValueError(f"model={model!r} (input {spec.input_shape}) does not fit dataset="
                         f"{dataset.name!r} (samples {sample_shape}): models for it are "
                         f"{[m.name for m in _models_for(dataset.name)]}")
    if spec.task != dataset.task:
        raise ValueError(f"model={model!r} is a {spec.task} model but dataset={dataset.name!r} "
                         f"is a {dataset.task} dataset")


def _models_for(dataset: str) -> list[ModelSpec]:
    from gtopk_lab.training.models import MODELS

    return [s for s in MODELS.values() if dataset in s.datasets]


def dataset_info(dataset: Dataset) -> dict[str, Any]:
    """Sizes and shapes, for logs and the run summary."""
    return {"dataset": dataset.name, "train_samples": dataset.train_samples,
            "test_samples": dataset.test_samples, "sample_shape": list(dataset.x_train.shape[1:]),
            "num_classes": dataset.num_classes}
