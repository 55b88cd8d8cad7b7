"""PowerSGD's options, its layer plan and its orthonormalisation (steps 2 and 5 of
:mod:`gtopk_lab.methods.powersgd`, whose docstring states the algorithm).

- :func:`powersgd_options` checks the ``powersgd_*`` keys of ``RunConfig.method_options``;
- :func:`layer_plan` decides which layers are compressed with which rank (torch's
  ``min_compression_rate`` rule) and the order the hook draws their Q in;
- :func:`orthonormalize`: Gram-Schmidt for r <= 2, QR otherwise, as the hook.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["OPTION_PREFIX", "PowerSGDOptions", "powersgd_options", "LayerPlan", "layer_plan", "orthonormalize"]

#: Every ``RunConfig.method_options`` key of this method starts with it (unknown ones are refused).
OPTION_PREFIX = "powersgd_"


# =========================================================================== options
@dataclass(frozen=True)
class PowerSGDOptions:
    """The method's hyper-parameters (see the module docstring)."""

    rank: int = 1
    min_compression_rate: float = 2.0
    warm_start: bool = True
    seed: int = 0


def powersgd_options(extra: Mapping[str, Any] | None) -> PowerSGDOptions:
    """The options in ``extra`` (``RunConfig.method_options``); ``ValueError`` naming the key when one
    is invalid or unknown. Keys without the ``powersgd_`` prefix are not this method's."""
    extra = extra or {}
    known = {f"{OPTION_PREFIX}{name}" for name in ("rank", "min_compression_rate", "warm_start", "seed")}
    unknown = sorted(k for k in extra if isinstance(k, str) and k.startswith(OPTION_PREFIX) and k not in known)
    if unknown:
        raise ValueError(f"method_options[{unknown[0]!r}] is invalid: unknown PowerSGD option; expected one of "
                         f"{', '.join(sorted(known))}")

    def get(name: str, default: Any) -> Any:
        return extra.get(f"{OPTION_PREFIX}{name}", default)

    rank = get("rank", 1)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"method_options['powersgd_rank']={rank!r} is invalid: expected an integer >= 1")
    rate = get("min_compression_rate", 2.0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 0:
        raise ValueError(f"method_options['powersgd_min_compression_rate']={rate!r} is invalid: "
                         "expected a finite number >= 0")
    warm = get("warm_start", True)
    if not isinstance(warm, bool):
        raise ValueError(f"method_options['powersgd_warm_start']={warm!r} is invalid: expected true or false")
    seed = get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"method_options['powersgd_seed']={seed!r} is invalid: expected an integer in [0, 2**32)")
    return PowerSGDOptions(rank=rank, min_compression_rate=float(rate), warm_start=warm, seed=seed)


# =========================================================================== layers
@dataclass(frozen=True)
class LayerPlan:
    """Which layers are compressed (step 2) and where they lie in the flat buffer.

    ``compressed``: ``(offset, n, m, r)`` per compressed layer, in layout order;
    ``dense``: ``(offset, numel)`` per layer sent as it is; ``draw_order``: indices into
    ``compressed`` in the order step 3 draws their Q (grouped by (n, m), first appearance).
    """

    layout: tuple[tuple[int, ...], ...]
    compressed: tuple[tuple[int, int, int, int], ...]
    dense: tuple[tuple[int, int], ...]
    draw_order: tuple[int, ...]

    @property
    def dense_numel(self) -> int:
        return sum(n for _, n in self.dense)

    @property
    def p_numel(self) -> int:
        return sum(n * r for _, n, _, r in self.compressed)

    @property
    def q_numel(self) -> int:
        return sum(m * r for _, _, m, r in self.compressed)


def layer_plan(layout: Sequence[Sequence[int]], rank: int, min_compression_rate: float,
               numel: int | None = None) -> LayerPlan:
    """Step 2 of the module docstring for ``layout``; ``ValueError`` when the layout is empty
    or does not add up to ``numel`` (PowerSGD cannot work on the flat buffer alone)."""
    shapes = tuple(tuple(int(s) for s in shape) for shape in layout)
    if not shapes:
        raise ValueError("layout=() is invalid for PowerSGD: it compresses each parameter matrix and needs "
                         "the parameters' shapes (CommCall.layout, Replica.layout)")
    compressed: list[tuple[int, int, int, int]] = []
    dense: list[tuple[int, int]] = []
    offset = 0
    for shape in shapes:
        size = math.prod(shape)
        if len(shape) >= 1 and size > 0:
            n = shape[0]
            m = size // n
            r = min(n, m, rank)
            if (n + m) * r * min_compression_rate < n * m:
                compressed.append((offset, n, m, r))
            else:
                dense.append((offset, size))
        elif size > 0:  # a 0-d parameter: one number, nothing to factorise
            dense.append((offset, size))
        offset += size
    if numel is not None and offset != numel:
        raise ValueError(f"layout={shapes!r} is invalid: its shapes hold {offset} elements, expected "
                         f"numel={numel}")
    groups: dict[tuple[int, int], list[int]] = {}
    for j, (_, n, m, _) in enumerate(compressed):
        groups.setdefault((n, m), []).append(j)
    order = tuple(j for members in groups.values() for j in members)
    return LayerPlan(shapes, tuple(compressed), tuple(dense), order)


# =========================================================================== linear algebra
def orthonormalize(matrix: torch.Tensor, epsilon: float = 0.0) -> torch.Tensor:
    """Orthonormal columns spanning those of ``matrix`` (``(1, n, r)``), a new tensor.

    r <= 2: Gram-Schmidt (columns normalised in order, each projected out of the later
    ones); r > 2: the Q factor of ``torch.linalg.qr``; the hook makes the same choice. An
    all-zero column stays zero here (the hook's default ``epsilon=0`` would give NaN).
    """
    out = matrix.clone()
    r = out.shape[-1]
    if r > 2:
        return torch.linalg.qr(out).Q
    for i in range(r):
        col = out[:, :, i:i + 1]
        norm = torch.norm(col, dim=1, keepdim=True)
        col.copy_(torch.where(norm > 0, col / (norm + epsilon), torch.zeros_like(col)))
        if i + 1 < r:
            rest = out[:, :, i + 1:]
            rest -= torch.sum(col * rest, dim=1, keepdim=True) * col
    return out
