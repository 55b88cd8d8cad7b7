"""SparseLoCo's wire format: the chunk-wise Top-k selector and the 2-bit message encoding.

Used by :mod:`gtopk_lab.methods.sparseloco` (steps 4 and 5 of its docstring).

- ``chunk-topk`` (:func:`chunk_topk`, registered as a selector with the exact-k promise): the
  flat buffer is cut into chunks of :data:`CHUNK` = 4096 entries; chunk c (entries
  ``[s_c, e_c)``) keeps its ``k_c = floor(k e_c / d) - floor(k s_c / d)`` largest |x|, its
  proportional share, exactly k in all. O(d log k_c).
- :func:`encode` / :func:`decode`: one uint8 tensor per message. Layout: per chunk its entry
  count (int16, so a message is self-describing after gTop-k merges too); per entry its offset
  in its chunk (int16); then, 2-bit: two fp32 levels per non-empty chunk (the mean |v| of the
  entries above / at-or-below the chunk's mean |v|) and per entry a 2-bit code (sign, class),
  four to a byte; or, unquantised (32): the fp32 values. Size of n entries in m non-empty
  chunks out of c: ``2c + 2n + 8m + ceil(n/4)`` bytes (:func:`encoded_bytes`). O(n + c).
  The quantiser (sign + class, two levels per chunk) is this project's choice of a 2-bit
  per-chunk-statistics quantiser.
"""

from __future__ import annotations

import torch

from gtopk_lab.compression.merge import index_dtype
from gtopk_lab.compression.selection import register_selector

__all__ = ["CHUNK", "QUANT_BITS", "chunk_topk", "encode", "decode", "quantize", "encoded_bytes"]

#: Entries per chunk of the chunk-wise Top-k and of the quantiser's statistics.
CHUNK = 4096
#: quant_bits values: 2 (the paper's) or 32 (no quantisation: fp32 values on the wire).
QUANT_BITS: tuple[int, ...] = (2, 32)
# int16 counts and offsets: a chunk holds at most 2**15 - 1 entries
assert CHUNK < 2**15

Sparse = tuple[torch.Tensor, torch.Tensor]


@register_selector("chunk-topk", exact_k=True)
def chunk_topk(x: torch.Tensor, k: int) -> Sparse:
    """The k_c largest |x| of every chunk of :data:`CHUNK` entries, k in all, ascending indices.

    Chunk c (entries ``[s_c, e_c)``) keeps ``k_c = floor(k e_c / d) - floor(k s_c / d)`` entries:
    its proportional share, summing to exactly k, never more than the chunk holds.
    """
    x = x.reshape(-1)
    n = x.numel()
    nchunks = -(-n // CHUNK)
    ends = torch.clamp(torch.arange(1, nchunks + 1, device=x.device) * CHUNK, max=n)
    cum = (k * ends) // n
    kc = torch.diff(cum, prepend=cum.new_zeros(1))
    kmax = int(kc.max())
    magnitude = x.abs()
    pad = nchunks * CHUNK - n
    if pad:  # the last chunk's padding can never be chosen: k_c <= its length
        magnitude = torch.cat([magnitude, magnitude.new_full((pad,), -1.0)])
    top = torch.topk(magnitude.view(nchunks, CHUNK), kmax, dim=1, sorted=True).indices
    keep = torch.arange(kmax, device=x.device)[None, :] < kc[:, None]
    idx = (top + torch.arange(nchunks, device=x.device)[:, None] * CHUNK)[keep].sort().values
    return x[idx], idx.to(index_dtype(n))


# --------------------------------------------------------------------------- the encoding
def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(-1)


def encode(values: torch.Tensor, indices: torch.Tensor, numel: int, bits: int) -> torch.Tensor:
    """The message of a sparse vector (ascending unique indices) as one uint8 tensor (module
    docstring). Deterministic: the same input gives the same bytes on every driver."""
    if bits not in QUANT_BITS:
        raise ValueError(f"method_options quant_bits={bits!r} is invalid: expected one of {QUANT_BITS}")
    nchunks = -(-numel // CHUNK)
    idx = indices.long()
    chunk = idx // CHUNK
    counts = torch.bincount(chunk, minlength=nchunks)
    parts = [_bytes(counts.to(torch.int16)), _bytes((idx - chunk * CHUNK).to(torch.int16))]
    if bits == 32:
        parts.append(_bytes(values.to(torch.float32)))
        return torch.cat(parts)
    nonempty = counts > 0
    row = (torch.cumsum(nonempty, 0) - 1).index_select(0, chunk)  # entry -> its non-empty chunk
    m = int(nonempty.sum())
    magnitude = values.abs()
    mean, _ = _class_mean(magnitude, row, m, torch.ones_like(magnitude, dtype=torch.bool))
    high = magnitude.double() > mean.index_select(0, row)
    lo_level, n_lo = _class_mean(magnitude, row, m, ~high)
    hi_level, n_hi = _class_mean(magnitude, row, m, high)
    # a class with no entry takes the other's level (all |v| equal, or rounding at the mean)
    lo_level = torch.where(n_lo > 0, lo_level, hi_level)
    hi_level = torch.where(n_hi > 0, hi_level, lo_level)
    levels = torch.stack([lo_level, hi_level], dim=1).to(torch.float32)
    codes = (values < 0).to(torch.uint8) | (high.to(torch.uint8) << 1)
    parts += [_bytes(levels), _pack2(codes)]
    return torch.cat(parts)


def _class_mean(magnitude: torch.Tensor, row: torch.Tensor, m: int, member: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per non-empty chunk: mean |v| of its entries in ``member`` (0 where none), and their count.
    float64 sums: the levels should not depend on the order rounding errors pile up in."""
    total = torch.zeros(m, dtype=torch.float64, device=magnitude.device).index_add_(
        0, row, torch.where(member, magnitude, 0.0).double())
    count = torch.zeros(m, dtype=torch.float64, device=magnitude.device).index_add_(0, row, member.double())
    return total / count.clamp(min=1.0), count


def _pack2(codes: torch.Tensor) -> torch.Tensor:
    pad = (-codes.numel()) % 4
    c = torch.cat([codes, codes.new_zeros(pad)]).view(-1, 4)
    return c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)


def _unpack2(packed: torch.Tensor, n: int) -> torch.Tensor:
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=packed.device)
    return ((packed[:, None] >> shifts) & 3).reshape(-1)[:n]


def _view(blob: torch.Tensor, start: int, count: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    size = count * torch.empty(0, dtype=dtype).element_size()
    return blob[start:start + size].clone().view(dtype), start + size  # clone: aligned storage


def decode(blob: torch.Tensor, numel: int, bits: int) -> Sparse:
    """Inverse of :func:`encode`: ``(values, indices)``, indices ascending, values dequantised."""
    nchunks = -(-numel // CHUNK)
    counts, at = _view(blob, 0, nchunks, torch.int16)
    counts = counts.long()
    n = int(counts.sum())
    offsets, at = _view(blob, at, n, torch.int16)
    chunk = torch.repeat_interleave(torch.arange(nchunks, device=blob.device), counts)
    indices = (chunk * CHUNK + offsets.long()).to(index_dtype(numel))
    if bits == 32:
        values, at = _view(blob, at, n, torch.float32)
        return values, indices
    nonempty = counts > 0
    m = int(nonempty.sum())
    levels, at = _view(blob, at, 2 * m, torch.float32)
    codes = _unpack2(blob[at:], n)
    row = (torch.cumsum(nonempty, 0) - 1).index_select(0, chunk)
    level = levels.view(m, 2)[row, (codes >> 1).long()]
    values = torch.where((codes & 1).bool(), -level, level)
    return values, indices


def quantize(values: torch.Tensor, indices: torch.Tensor, numel: int, bits: int) -> tuple[torch.Tensor, Sparse]:
    """``(message, Q(v))``: the encoding and what every receiver decodes from it."""
    blob = encode(values, indices, numel, bits)
    return blob, decode(blob, numel, bits)


def encoded_bytes(n: int, nonempty_chunks: int, numel: int, bits: int = 2) -> int:
    """Bytes of :func:`encode`'s message of n entries in ``nonempty_chunks`` chunks (no header)."""
    nchunks = -(-numel // CHUNK)
    body = 8 * nonempty_chunks + -(-n // 4) if bits == 2 else 4 * n
    return 2 * nchunks + 2 * n + body
