"""Model registry: the networks gtopk-lab trains, by name.

Every entry records the input shape of one sample, the number of classes (or the
vocabulary size of a language model), the datasets it fits and its task, so that
the data layer, the synthetic-data throughput runs and ``gtopk-lab models`` can
all be driven from the registry alone.

=============  =====================  ==========================  ============
name           fits                   architecture                params (d)
=============  =====================  ==========================  ============
``mlp``        mnist1d (40 -> 10)     40-100-100-10, ReLU          ~15 k
``cnn``        mnist1d (40 -> 10)     3 x Conv1d(25) + linear      ~5 k
``cnn_wide``   mnist1d (40 -> 10)     3 x Conv1d(192) + linear     ~0.23 M
``digits_cnn`` digits (1x8x8 -> 10)   2 x Conv2d + 2 linear        ~38 k
``resnet20``   cifar10 (3x32x32)      He et al. 2016, option A     ~0.27 M
``vgg16``      cifar10 (3x32x32)      VGG-16 with BN, 1 linear     ~14.7 M
``lstm``       ptb (token ids)        2-layer LSTM language model  vocab-dependent
``gpt``        text (bytes, T=128)    4-layer GPT, n_embd 192      ~1.85 M
``gpt_tiny``   text (bytes, T=64)     2-layer GPT, n_embd 48 (CI)  72,000
``resnet50``   imagenet (3x224x224)   torchvision, when importable ~25.6 M
``alexnet``    imagenet (3x224x224)   torchvision, when importable ~61 M
=============  =====================  ==========================  ============

Example::

    model = build_model("cnn")            # torch.nn.Module
    spec = get_model_spec("cnn")          # input_shape=(40,), num_classes=10
    count_parameters(model)               # 5210
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gtopk_lab.training.gpt import GPT, GPT_DEFAULT, GPT_KWARGS, GPT_TINY, gpt_tiny


@dataclass(frozen=True)
class ModelSpec:
    """What the registry knows about one model."""

    name: str
    factory: Callable[..., nn.Module]
    #: Shape of one input sample (without the batch dimension).
    input_shape: tuple[int, ...]
    #: Number of classes; for language models the default vocabulary size.
    num_classes: int
    #: Datasets this model fits, the first being its natural one.
    datasets: tuple[str, ...]
    #: "classification" or "language_model" (tokens in, per-token logits out).
    task: str = "classification"
    description: str = ""
    #: Keyword arguments accepted by the factory (from ``RunConfig.model_options.kwargs``).
    kwargs: tuple[str, ...] = field(default_factory=tuple)
    #: Language models that take any sequence length up to their context (the GPTs):
    #: ``input_shape`` is then the default length, and datasets may use another one.
    variable_length: bool = False
    #: Why the simulator's batched ranks (training.batched_ranks) are slower than one rank
    #: at a time for this model, so that ``simulator.batched="auto"`` leaves it sequential
    #: ("on" still batches it); None: batching pays.
    batched_slower: str | None = None

    @property
    def input_dtype(self) -> torch.dtype:
        """int64 token ids for language models, float32 otherwise."""
        return torch.int64 if self.task == "language_model" else torch.float32


# --------------------------------------------------------------------------- MNIST-1D / digits
class MLP(nn.Module):
    """MNIST-1D multilayer perceptron (Greydanus 2020): 40-100-100-10 with ReLU."""

    def __init__(self, input_size: int = 40, hidden_size: int = 100, num_classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(input_size, hidden_size), nn.ReLU(),
            nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvNet1D(nn.Module):
    """MNIST-1D 1-D CNN (the ``ConvBase`` of Greydanus 2020, ~94% test accuracy).

    Three Conv1d layers (kernel 5/3/3, stride 2, 25 channels, ReLU) shrink a
    40-long signal to 25 x 5 features, followed by one linear classifier.
    """

    def __init__(self, input_size: int = 40, channels: int = 25, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 5, stride=2, padding=1)
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        length = input_size
        for kernel in (5, 3, 3):
            length = (length + 2 - kernel) // 2 + 1
        self.linear = nn.Linear(channels * length, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.view(x.shape[0], 1, -1)
        h = F.relu(self.conv1(h))
        h = F.relu(self.conv2(h))
        h = F.relu(self.conv3(h))
        return self.linear(h.flatten(1))


class WideConvNet1D(ConvNet1D):
    """The MNIST-1D CNN with 192 channels per conv layer (d = 232,330 instead of 5,210).

    Same layers, kernels and strides as :class:`ConvNet1D`; only the width differs. It exists
    so that convergence at the papers' density rho = 0.001 can be studied in their regime of
    k: here k = floor(0.001 * 232,330) = 232 entries per worker, where the standard CNN's k = 5
    (the papers' models have d = 0.27 M .. 138 M, k >= 270). Forward + backward of a batch of
    32 costs ~5 ms on one CPU core (standard CNN: ~1.4 ms).
    """

    def __init__(self, input_size: int = 40, channels: int = 192, num_classes: int = 10) -> None:
        super().__init__(input_size=input_size, channels=channels, num_classes=num_classes)


class DigitsCNN(nn.Module):
    """Small 2-D CNN for scikit-learn's 8x8 digits: 2 conv (16, 32) + max-pool + 2 linear."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x.view(x.shape[0], 1, 8, 8)))


# --------------------------------------------------------------------------- CIFAR-10
class _BasicBlock(nn.Module):
    """ResNet basic block; option-A shortcut (stride-2 subsampling + zero channel padding)."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.pad_channels = planes - in_planes
        self.stride = stride

    def _shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1 and self.pad_channels == 0:
            return x
        # Parameter-free shortcut keeps d at the paper's 0.27 M.
        x = x[:, :, :: self.stride, :: self.stride]
        half = self.pad_channels // 2
        return F.pad(x, (0, 0, 0, 0, half, self.pad_channels - half))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self._shortcut(x))


class ResNetCifar(nn.Module):
    """CIFAR ResNet-(6n+2) of He et al. 2016 (n=3: ResNet-20, 0.27 M parameters)."""

    def __init__(self, depth: int = 20, num_classes: int = 10) -> None:
        super().__init__()
        if (depth - 2) % 6 != 0 or depth < 8:
            raise ValueError(f"depth={depth!r} is invalid: expected 6n+2 with n >= 1 (20, 32, 44, 56)")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers: list[nn.Module] = []
        in_planes = 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(_BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.linear = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layers(out)
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


_VGG16_LAYOUT: tuple[int | str, ...] = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
                                        512, 512, 512, "M", 512, 512, 512, "M")


class VGGCifar(nn.Module):
    """VGG-16 for 32x32 inputs: 13 conv3x3 + BN + ReLU, 5 max-pools, one 512->10 linear (14.7 M)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_channels = 3
        for v in _VGG16_LAYOUT:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(in_channels, int(v), 3, padding=1), nn.BatchNorm2d(int(v)),
                           nn.ReLU(inplace=True)]
                in_channels = int(v)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


# --------------------------------------------------------------------------- PTB
class LSTMLanguageModel(nn.Module):
    """2-layer LSTM language model (Zaremba et al. 2014 style), untied embedding/decoder.

    Input ``[batch, bptt]`` token ids, output ``[batch, bptt, vocab]`` logits. Each
    batch starts from a zero hidden state (sequences are independent samples, so
    that sharding across ranks stays a plain split of the sample set).
    Parameters: vocab*emb + 2 * 4 * h * (emb|h + h + 2) + h*vocab + vocab.
    """

    def __init__(self, vocab_size: int = 10000, embedding_size: int = 650, hidden_size: int = 650,
                 num_layers: int = 2, dropout: float = 0.5) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_size)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(embedding_size, hidden_size, num_layers=num_layers,
                            dropout=dropout if num_layers > 1 else 0.0, batch_first=True)
        self.decoder = nn.Linear(hidden_size, vocab_size)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.drop(self.embedding(tokens)))
        return self.decoder(self.drop(out))


# --------------------------------------------------------------------------- torchvision
def _torchvision_factory(name: str) -> Callable[..., nn.Module]:
    def build(num_classes: int = 1000) -> nn.Module:
        import torchvision  # imported lazily: optional dependency

        return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)

    build.__name__ = f"torchvision_{name}"
    return build


# --------------------------------------------------------------------------- registry
#: The GPTs under vmap: their attention batches (gpt.causal_attention, written out: torch
#: 2.13's CPU scaled_dot_product_attention has no batching rule), but a rank's batch (16 x 64
#: tokens) is already compute-bound, so one vmapped call saves little overhead and its
#: per-rank weight-gradient bmm and written-out attention cost more than P fused calls:
#: measured 1.2-1.5x the CPU time of the sequential path (gpt_tiny, P = 4, 16 and 64, batch 16).
_GPT_BATCHED_SLOWER = ("batched it is compute-bound (measured 1.2-1.5x the sequential CPU time at "
                       "P = 4, 16 and 64, batch 16)")

MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec("mlp", MLP, (40,), 10, ("mnist1d", "synthetic"),
                     description="MNIST-1D MLP 40-100-100-10", kwargs=("hidden_size",)),
    "cnn": ModelSpec("cnn", ConvNet1D, (40,), 10, ("mnist1d", "synthetic"),
                     description="MNIST-1D 1-D CNN (3 conv, 25 channels)", kwargs=("channels",)),
    "cnn_wide": ModelSpec("cnn_wide", WideConvNet1D, (40,), 10, ("mnist1d", "synthetic"),
                          description="MNIST-1D 1-D CNN, 192 channels (d ~0.23 M: k = 232 at rho 0.001)",
                          kwargs=("channels",)),
    "digits_cnn": ModelSpec("digits_cnn", DigitsCNN, (1, 8, 8), 10, ("digits", "synthetic"),
                            description="8x8 digits 2-D CNN"),
    "resnet20": ModelSpec("resnet20", ResNetCifar, (3, 32, 32), 10, ("cifar10", "synthetic"),
                          description="CIFAR-10 ResNet-20 (option A)", kwargs=("depth",)),
    "vgg16": ModelSpec("vgg16", VGGCifar, (3, 32, 32), 10, ("cifar10", "synthetic"),
                       description="CIFAR-10 VGG-16 with batch norm"),
    "lstm": ModelSpec("lstm", LSTMLanguageModel, (35,), 10000, ("ptb", "synthetic"),
                      task="language_model", description="2-layer LSTM LM (PTB, bptt 35)",
                      kwargs=("vocab_size", "embedding_size", "hidden_size", "num_layers", "dropout")),
    "gpt": ModelSpec("gpt", GPT, (GPT_DEFAULT["block_size"],), 256, ("text", "synthetic"),
                     task="language_model", variable_length=True, kwargs=GPT_KWARGS,
                     batched_slower=_GPT_BATCHED_SLOWER,
                     description="byte-level GPT, 4 layers x 4 heads, n_embd 192, context 128, tied head"),
    "gpt_tiny": ModelSpec("gpt_tiny", gpt_tiny, (GPT_TINY["block_size"],), 256, ("text", "synthetic"),
                          task="language_model", variable_length=True, kwargs=GPT_KWARGS,
                          batched_slower=_GPT_BATCHED_SLOWER,
                          description="CI-size byte-level GPT, 2 layers x 2 heads, n_embd 48, context 64"),
}

if importlib.util.find_spec("torchvision") is not None:  # optional ImageNet models
    for _name in ("resnet50", "alexnet"):
        MODELS[_name] = ModelSpec(_name, _torchvision_factory(_name), (3, 224, 224), 1000,
                                  ("imagenet", "synthetic"), description=f"torchvision {_name}")


def get_model_spec(name: str) -> ModelSpec:
    """The registry entry for ``name``; unknown names raise ``ValueError`` listing the known ones."""
    if not isinstance(name, str):
        raise TypeError(f"model={name!r} has type {type(name).__name__}: expected str")
    try:
        return MODELS[name]
    except KeyError:
        hint = " (needs torchvision)" if name in ("resnet50", "alexnet") else ""
        raise ValueError(f"model={name!r} is invalid{hint}: expected one of {', '.join(MODELS)}") from None


def build_model(name: str, **kwargs: Any) -> nn.Module:
    """Instantiate model ``name``; ``kwargs`` must be among the spec's factory arguments.

    The caller seeds torch beforehand for reproducible initial weights.
    """
    spec = get_model_spec(name)
    unknown = sorted(set(kwargs) - set(spec.kwargs))
    if unknown:
        raise ValueError(f"model_kwargs={sorted(kwargs)!r} is invalid for model {name!r}: "
                         f"allowed keys are {list(spec.kwargs) or 'none'}")
    return spec.factory(**kwargs)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars d (the length of the flat gradient buffer)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def model_table() -> list[dict[str, Any]]:
    """One row per registered model: name, params, input shape, datasets, task, description.

    Cost: builds every model once on CPU (VGG-16 takes ~0.2 s).
    """
    rows = []
    for spec in MODELS.values():
        rows.append({"name": spec.name, "params": count_parameters(spec.factory()),
                     "input_shape": "x".join(map(str, spec.input_shape)),
                     "datasets": ", ".join(spec.datasets), "task": spec.task,
                     "description": spec.description})
    return rows
