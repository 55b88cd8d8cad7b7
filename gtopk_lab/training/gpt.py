"""A small GPT language model (nanoGPT-shaped), byte-level by default.

Architecture (Radford et al. 2019 / Karpathy's nanoGPT): token embedding + learned position
embedding, ``n_layer`` pre-LayerNorm blocks ``x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))``
with causal multi-head self-attention
(:func:`torch.nn.functional.scaled_dot_product_attention` with ``is_causal=True``; under a
``torch.func`` transform the same attention written out, see :func:`causal_attention`) and a
4x GELU MLP, a final LayerNorm and a linear head **tied** to the token embedding by default
(``tie_weights=False`` gives an untied head of ``vocab_size * n_embd`` more parameters). The
head has no bias; every other Linear has one.

Input ``[B, T]`` int64 token ids with ``T <= block_size``, output ``[B, T, vocab_size]`` logits,
which is what the training loop's language-model loss ``cross_entropy(out.reshape(-1, V),
y.reshape(-1))`` expects.

Parameters (tied head, biases included)::

    d = vocab*n_embd + block_size*n_embd + n_layer*(12*n_embd**2 + 13*n_embd) + 2*n_embd

==============================  ===========  ===========  ========  ==========
size                            n_layer      n_head       n_embd    block_size
==============================  ===========  ===========  ========  ==========
default (``gpt``): 1,853,568     4            4            192       128
CI (``gpt_tiny``): 72,000        2            2            48        64
==============================  ===========  ===========  ========  ==========

Initialisation follows nanoGPT: N(0, 0.02) weights, zero biases, and the residual output
projections scaled by ``1 / sqrt(2 * n_layer)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

#: Default size of the registered ``gpt`` model (~1.85 M parameters).
GPT_DEFAULT = dict(vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=192)
#: CI size (``gpt_tiny``; 72,000 parameters): fast enough for a unit test on one core.
GPT_TINY = dict(vocab_size=256, block_size=64, n_layer=2, n_head=2, n_embd=48)
#: Keyword arguments both registry entries accept (``RunConfig.model_options.kwargs``).
GPT_KWARGS: tuple[str, ...] = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd",
                               "dropout", "tie_weights")


def gpt_parameter_count(vocab_size: int, block_size: int, n_layer: int, n_embd: int,
                        tie_weights: bool = True) -> int:
    """Closed-form number of parameters of :class:`GPT` (see the module docstring)."""
    d = vocab_size * n_embd + block_size * n_embd + n_layer * (12 * n_embd ** 2 + 13 * n_embd) + 2 * n_embd
    return d if tie_weights else d + vocab_size * n_embd


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """Causal scaled dot-product attention written out, for ``vmap``.

    torch's CPU ``scaled_dot_product_attention`` has no vmap batching rule: under the
    simulator's batched ranks (``vmap(grad)``, training.batched_ranks) it falls back to one
    call per rank, slower than the sequential path. These plain ops all batch:

    1. scores ``q k^T / sqrt(C/H)``: ``[.., T, T]``;
    2. positions after the query set to ``-inf`` (the causal mask, built here rather than kept
       as a buffer: a buffer would make the batched ranks refuse the model);
    3. softmax over the keys, dropout ``dropout_p`` on the weights (as the fused call does);
    4. weights ``@ v``.

    Cost: O(T^2 C) flops and a ``[.., H, T, T]`` weight tensor per layer, as the fused call's
    math backend. Equals the fused call to float tolerance (another summation order).
    """
    t, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale
    future = _future_mask(t, q.device)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v


_MASKS: dict[tuple[int, str], torch.Tensor] = {}


def _future_mask(t: int, device: torch.device) -> torch.Tensor:
    """``[T, T]`` bool, True above the diagonal; cached per size and device (built once, not
    per layer and call)."""
    key = (t, str(device))
    mask = _MASKS.get(key)
    if mask is None:
        mask = _MASKS[key] = torch.ones(t, t, dtype=torch.bool, device=device).triu(1)
    return mask


def _under_functorch() -> bool:
    """Whether the caller runs inside a ``torch.func`` transform (vmap, grad)."""
    return torch._C._functorch.peek_interpreter_stack() is not None


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused q/k/v projection."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.dropout = dropout
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        shape = (b, t, self.n_head, c // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))  # [B, H, T, C/H]
        p = self.dropout if self.training else 0.0
        # the fused call outside torch.func keeps the sequential path's results bit for bit
        if _under_functorch():
            y = causal_attention(q, k, v, p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    """n_embd -> 4 n_embd -> GELU -> n_embd."""

    def __init__(self, n_embd: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only transformer LM; see the module docstring for shapes and sizes."""

    def __init__(self, vocab_size: int = 256, block_size: int = 128, n_layer: int = 4, n_head: int = 4,
                 n_embd: int = 192, dropout: float = 0.0, tie_weights: bool = True) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("block_size", block_size),
                            ("n_layer", n_layer), ("n_head", n_head), ("n_embd", n_embd)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model_kwargs {name}={value!r} is invalid: expected an integer >= 1")
        if n_embd % n_head != 0:
            raise ValueError(f"model_kwargs n_embd={n_embd!r} is invalid: expected a multiple of "
                             f"n_head={n_head}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"model_kwargs dropout={dropout!r} is invalid: expected a number in [0, 1)")
        self.vocab_size, self.block_size = vocab_size, block_size
        self.tie_weights = bool(tie_weights)
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, float(dropout)) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # residual projections (attention and MLP)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
        if self.tie_weights:
            self.head.weight = self.wte.weight  # one parameter: counted and synchronised once

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"GPT input has shape {tuple(tokens.shape)}: expected [batch, time] token ids")
        t = tokens.shape[1]
        if t > self.block_size:
            raise ValueError(f"sequence length {t} is invalid for block_size={self.block_size}: "
                             f"expected at most {self.block_size} tokens")
        pos = torch.arange(t, device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt_tiny(vocab_size: int = 256, block_size: int = 64, n_layer: int = 2, n_head: int = 2,
             n_embd: int = 48, dropout: float = 0.0, tie_weights: bool = True) -> GPT:
    """The CI-size GPT (72,000 parameters with the tied head)."""
    return GPT(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
               n_embd=n_embd, dropout=dropout, tie_weights=tie_weights)
