"""The ``text`` dataset: a byte-level language-modelling corpus that exists offline.

Default corpus (``data_dir=None``): 32 pure-Python modules of the CPython 3.11 standard
library (:data:`STDLIB_CORPUS`, 553,500 bytes), read from ``sysconfig.get_paths()["stdlib"]``
in the pinned order and concatenated byte for byte. Every file's size and SHA-256 are
pinned, so the corpus is identical on every machine that runs it; a file that is missing or
differs raises ``ValueError`` naming it (no file is skipped: a silently different corpus
would make runs on two machines incomparable). The files were chosen because they are
identical in CPython 3.11.2 (Debian) and 3.11.7 (upstream) and are small, stable modules
with much prose in their docstrings; other CPython versions (3.12+) ship other bytes, and
there ``--data-dir`` is the way to train.

User corpus (``data_dir=PATH``): a single file, or a folder whose ``*.txt`` files (not
recursive) are concatenated in sorted name order (TinyShakespeare's ``input.txt``, WikiText
or PTB ``*.txt`` files, ...).

Split: the last 10% of the bytes of the concatenation (``floor(0.1 * n)``) is validation
(the "test" split of :class:`~gtopk_lab.training.data.Dataset`), the first 90% training.

Tokenizers: ``"byte"`` (default; token = byte value, vocabulary 256) or ``"char"`` (the
sorted distinct Unicode characters of the training split, plus one unknown-character id for
characters seen only in validation; the text must be UTF-8).

Samples: non-overlapping windows of ``seq_len + 1`` tokens with stride ``seq_len``: input
``tokens[i:i+seq_len]``, target ``tokens[i+1:i+seq_len+1]`` (every token is a target once).
``seq_len`` defaults to the model's ``input_shape[0]`` (128 for ``gpt``, 64 for ``gpt_tiny``).
``train_samples`` / ``test_samples`` cap the number of windows; when fewer are asked for than
exist, evenly spaced windows are taken (``i * n // cap``), so that a capped run still sees
the whole split.

Metrics: for the byte tokenizer, bits per byte = loss (nats per token) / ln 2
(:func:`bits_per_byte`); :func:`unigram_entropy_nats` is the baseline that a model which
ignores context cannot beat.
"""

from __future__ import annotations

import hashlib
import math
import sysconfig
from pathlib import Path

import numpy as np
import torch

from gtopk_lab.config_options import TOKENIZERS
from gtopk_lab.training.dataset import Dataset

#: Fraction of the corpus (its last bytes) used for validation.
VALIDATION_FRACTION = 0.1

#: (file name in the stdlib folder, size in bytes, SHA-256), in concatenation order.
STDLIB_CORPUS: tuple[tuple[str, int, str], ...] = (
    ("__future__.py", 5218, "981d4c398849f9ebcab72300d9c1fe288fd6d7f28957b3b3fa3a493a5836d95c"),
    ("bisect.py", 3135, "e5b2ff166f48a06e70ae831d8c9b47283fcd0c254306eee12d3dae9c55e11526"),
    ("cmd.py", 14873, "fb82a8c4e44e5b559c88d516d79051534cec69a463df97defe05ac8a261f0a0d"),
    ("copy.py", 8681, "27dcfc53a4b9d4fbc3d90c74e549eb6eca9301524d6d2fbff9a6589cf51b6fd5"),
    ("copyreg.py", 7677, "5499e1be7ba52d4715a911ae65ef2d703db9379d21fff2a07fad8877c318e070"),
    ("csv.py", 16030, "6c68a5186e3b85e6e267a7ef96479327a45ae2b40bf5e9f2017e4b2282b3f5b1"),
    ("difflib.py", 83308, "0c6afc23568d55b3e9ac914f9c5361e3033e778aa5b58d3cc82835fc5c638679"),
    ("fnmatch.py", 5999, "6683da36e47af523f3f41e18ad244d837783e19e98911cc0b7415dea81494ebc"),
    ("fractions.py", 28667, "b11e850e354808b882d13a70a911c29accd1dbdd41757566704e3b7206c74edb"),
    ("functools.py", 38413, "6d80018a3fa9fed44c5b78f881987ee3ab3fb1238b077b4e6dcb4b76da7db73b"),
    ("genericpath.py", 4975, "9d58ad64056a89f12258a62596c2073cd9e52b459dde152f710edc0cffcd865b"),
    ("getopt.py", 7489, "efafb88c7c978e96bd6c232b7fa10bf50cef5e7fb0fb7dc8e5bce44e19f8c92f"),
    ("graphlib.py", 9656, "7bd338c5a475d1101064603d3baa5507446d3c5e73f741f6d6e77c6204c1eb65"),
    ("heapq.py", 23024, "6d43277e5c76fc0f073cd388fcff852d14d068f6bb6d4886c340f8b75a1229a9"),
    ("keyword.py", 1061, "afbe73afb68d32fa998e5ff3d081090deec457152470f5331cc2bd430a0e9d2a"),
    ("linecache.py", 5690, "e814839fc75010db274ae034f45b0fff7e529ccb702319048545fef84c2045b7"),
    ("numbers.py", 10348, "6d70991643a109e9c99e94d6ea2734a995fa8e89114a70ea09737413fa9ae292"),
    ("operator.py", 10965, "b2af20f67667203c1730e686cc5d0427becc94db4c97f1d3efe3ed2158473f6a"),
    ("optparse.py", 60369, "07d224301cba312fa0697bff9cd5a4bb4f778a90629632091b3f4ae874d89af5"),
    ("pprint.py", 24489, "0b67dbc8af449d8ced3acd9df902e98c2dbc56c8f2a7a181c51cc72768db621f"),
    ("queue.py", 11496, "f6c37fc37cd7440979f7d22d40ee818fa3b714c573610c08fa52911d541193f0"),
    ("random.py", 32162, "b931a2d452db89ab9e1f79d59b66ce194dbd6748049cfe44699726da52b9c956"),
    ("reprlib.py", 5437, "264433cc232332db871666b3bb6e4c2cb97b092cb8d5056a45ec2e53daea2b1c"),
    ("sched.py", 6351, "edfb309483d7cb05e06ad86d1fdeb819629f71402dc6710a1bec36c7afcaac50"),
    ("shlex.py", 13501, "42ab6060f316e121e374e6621d8c1c98b8db323903c3df289a810c45a8ae46a7"),
    ("stat.py", 5485, "052af0327eae6941b69b05c088b3e748f79995635f80ac4cc7125eb333eb4c77"),
    ("statistics.py", 47705, "889a066f1b8063e73387ceb84018efc507a89b365b56c6afb9cc15b2ed25c2d9"),
    ("string.py", 11786, "24aeae1f0526250f442022022bf98df9a823b1cb330543ee79e70e44907462e9"),
    ("textwrap.py", 19718, "62867e40cdea6669b361f72af4d7daf0359f207c92cbeddfc7c7506397c1f31c"),
    ("token.py", 2386, "2cabb6a81cafa84b475fc852c20b6bad45955ec0f88063720a831495215f776b"),
    ("weakref.py", 21513, "56f8d313fb74019e53eb9287400702fbce788b7fe30e097b0b6e06296f3f080c"),
    ("_weakrefset.py", 5893, "91895a451d06e9f521a1171b31b9b19bc9740f35af00d4fa106338ab7167c9ac"),
)
#: Bytes of the default corpus (sum of the pinned sizes).
STDLIB_CORPUS_BYTES = sum(size for _, size, _ in STDLIB_CORPUS)

_HOW = "pass --data-dir with a text file or a folder of .txt files instead"


def bits_per_byte(loss_nats: float) -> float:
    """Mean cross-entropy in bits per byte for byte-level tokens: ``loss_nats / ln 2``.

    (For the ``char`` tokenizer this is bits per character, not per byte.)
    """
    return float(loss_nats) / math.log(2.0)


def unigram_entropy_nats(tokens: torch.Tensor | np.ndarray | bytes, vocab_size: int = 256) -> float:
    """Entropy (nats) of the token frequency distribution: the loss of the best context-free model."""
    if isinstance(tokens, (bytes, bytearray)):
        arr = np.frombuffer(bytes(tokens), dtype=np.uint8)
    else:
        arr = np.asarray(tokens).reshape(-1)
    counts = np.bincount(arr.astype(np.int64), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def stdlib_dir() -> Path:
    """Where the default corpus is read from: this interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_corpus(root: str | Path | None = None) -> bytes:
    """The default corpus: the pinned stdlib files, each checked against its SHA-256.

    Raises ``ValueError`` naming the first file that is missing or whose bytes differ.
    Cost: reads and hashes 0.55 MB (a few milliseconds).
    """
    folder = Path(root) if root is not None else stdlib_dir()
    parts: list[bytes] = []
    for name, size, sha in STDLIB_CORPUS:
        path = folder / name
        try:
            data = path.read_bytes()
        except OSError:
            raise ValueError(f"dataset='text' corpus file {name} is missing from {folder}: the default "
                             f"corpus needs CPython 3.11's standard library; {_HOW}") from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha:
            raise ValueError(f"dataset='text' corpus file {path} differs from the pinned one "
                             f"(sha256 {digest[:16]}..., {len(data)} bytes; expected {sha[:16]}..., "
                             f"{size} bytes): the default corpus is the CPython 3.11 stdlib; {_HOW}")
        parts.append(data)
    return b"".join(parts)


def read_corpus(data_dir: str | None) -> tuple[bytes, list[str]]:
    """(corpus bytes, the files it was made of, in order). ``None``: the pinned stdlib corpus."""
    if data_dir is None:
        return stdlib_corpus(), [name for name, _, _ in STDLIB_CORPUS]
    path = Path(data_dir).expanduser()
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.glob("*.txt") if p.is_file())
        if not files:
            raise ValueError(f"data_dir={data_dir!r} is invalid for dataset='text': the folder holds no "
                             "*.txt files; expected a text file or a folder of .txt files")
    else:
        raise ValueError(f"data_dir={data_dir!r} is invalid for dataset='text': no such file or folder; "
                         "expected a text file or a folder of .txt files")
    data = b"".join(p.read_bytes() for p in files)
    if not data:
        raise ValueError(f"data_dir={data_dir!r} is invalid for dataset='text': the corpus is empty "
                         f"({len(files)} file(s), 0 bytes)")
    return data, [str(p) for p in files]


def split_corpus(data: bytes) -> tuple[bytes, bytes]:
    """(train, validation): validation is the last ``floor(0.1 * len(data))`` bytes."""
    n_val = int(len(data) * VALIDATION_FRACTION)
    return data[:len(data) - n_val], data[len(data) - n_val:]


def _tokenize(train: bytes, valid: bytes, tokenizer: str) -> tuple[np.ndarray, np.ndarray, int]:
    if tokenizer == "byte":
        return (np.frombuffer(train, dtype=np.uint8).astype(np.int64),
                np.frombuffer(valid, dtype=np.uint8).astype(np.int64), 256)
    try:
        train_text, valid_text = train.decode("utf-8"), valid.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"tokenizer='char' is invalid for this corpus: it is not UTF-8 ({exc}); "
                         "expected tokenizer='byte'") from None
    chars = sorted(set(train_text))
    vocab = {c: i for i, c in enumerate(chars)}
    unk = len(chars)  # characters seen only in validation
    return (np.array([vocab[c] for c in train_text], dtype=np.int64),
            np.array([vocab.get(c, unk) for c in valid_text], dtype=np.int64), len(chars) + 1)


def _windows(ids: np.ndarray, seq_len: int, cap: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    n = (len(ids) - 1) // seq_len
    if n < 1:
        raise ValueError(f"dataset='text' {split} split has {len(ids)} tokens: fewer than one sequence "
                         f"of seq_len+1={seq_len + 1}; expected a larger corpus (or a shorter sequence)")
    t = torch.from_numpy(ids)
    x = t[: n * seq_len].view(n, seq_len)
    y = t[1: n * seq_len + 1].view(n, seq_len)
    if cap < n:
        sel = torch.arange(cap, dtype=torch.int64) * n // cap
        x, y = x[sel], y[sel]
    return x.contiguous(), y.contiguous()


def load_text_dataset(data_dir: str | None, train_samples: int, test_samples: int, seq_len: int,
                      tokenizer: str = "byte", num_classes: int | None = None) -> Dataset:
    """The ``text`` dataset (see the module docstring); ``num_classes`` is the model's vocabulary.

    Raises ``ValueError`` for a missing or empty corpus, a split shorter than one sequence,
    an unknown tokenizer or a vocabulary larger than ``num_classes``.
    """
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer={tokenizer!r} is invalid: expected one of {', '.join(TOKENIZERS)}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} is invalid: expected an integer >= 1")
    data, _ = read_corpus(data_dir)
    train, valid = split_corpus(data)
    train_ids, valid_ids, vocab = _tokenize(train, valid, tokenizer)
    if num_classes is not None and vocab > num_classes:
        raise ValueError(f"vocab_size={num_classes} is invalid for tokenizer={tokenizer!r}: the corpus "
                         f"needs {vocab} token ids; expected model_kwargs vocab_size >= {vocab}")
    x_train, y_train = _windows(train_ids, seq_len, train_samples, "training")
    x_test, y_test = _windows(valid_ids, seq_len, test_samples, "validation")
    return Dataset("text", x_train, y_train, x_test, y_test, num_classes or vocab, "language_model")
