"""The GPT under the simulator's batched virtual ranks: its attention batches under vmap (no
per-rank fallback), every rank's batched gradient equals its own plain backward through the
fused attention, and a simulated gTop-k GPT run gives the same losses batched and sequential."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from gtopk_lab.config import RunConfig
from gtopk_lab.training.batched_ranks import BatchedGradients
from gtopk_lab.training.gpt import causal_attention
from gtopk_lab.training.replica import Replica
from gtopk_lab.training.simulator import simulate

WORLD = 3
SEQ = 16


def _config(method: str, batched: str, **kw) -> RunConfig:
    fields = dict(method=method, workers=WORLD, model="gpt_tiny", dataset="text", train_samples=10**6,
                  test_samples=8, batch_size=2, epochs=10, max_iterations=3, density=0.05, lr=0.05,
                  momentum=0.9, bandwidth="1GbE", sink_every=3, simulator={"batched": batched},
                  extra={"return_weights": True})
    return RunConfig(**{**fields, **kw})


@pytest.mark.timeout(30)
def test_written_out_attention_is_causal_softmax_attention() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=gen) for _ in range(3))
    out = causal_attention(q, k, v, 0.0)
    # oracle: query i attends to keys 0..i, one position at a time
    want = torch.empty_like(out)
    for i in range(7):
        scores = q[..., i:i + 1, :] @ k[..., :i + 1, :].transpose(-2, -1) / math.sqrt(4)
        want[..., i, :] = (torch.softmax(scores, dim=-1) @ v[..., :i + 1, :]).squeeze(-2)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(60)
def test_batched_gpt_gradients_are_each_ranks_own_gradient() -> None:
    replica = Replica(_config("dense", "on"), WORLD, torch.device("cpu"))
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randint(0, 256, (2, SEQ), generator=gen) for _ in range(WORLD)]
    ys = [torch.randint(0, 256, (2, SEQ), generator=gen) for _ in range(WORLD)]
    with warnings.catch_warnings():  # vmap's per-sample fallback warns: the attention must batch
        warnings.filterwarnings("error", message="There is a performance drop")
        grads, losses = BatchedGradients(replica)(xs, ys)
    assert grads.shape == (WORLD, replica.numel) and losses.shape == (WORLD,)
    for r in range(WORLD):  # oracle: plain autograd through the fused attention, one rank at a time
        logits = replica.model(xs[r])
        loss = F.cross_entropy(logits.reshape(-1, 256), ys[r].reshape(-1))
        own = torch.autograd.grad(loss, replica.params)
        torch.testing.assert_close(grads[r], torch.cat([g.reshape(-1) for g in own]), rtol=1e-4, atol=1e-6)
        assert abs(float(losses[r]) - float(loss.detach())) < 1e-5
    assert not torch.allclose(grads[0], grads[1])


@pytest.mark.timeout(120)
def test_simulated_gtopk_gpt_run_same_losses_batched_and_sequential() -> None:
    on, off = simulate(_config("gtopk", "on")), simulate(_config("gtopk", "off"))
    assert on.summary["batched_ranks"] is True and off.summary["batched_ranks"] is False

    def losses(rows: list[dict]) -> list[tuple[int, int, float]]:
        return sorted((r["rank"], r["iteration"], r["train_loss"]) for r in rows if r["kind"] == "iter")

    got, want = losses(on.rows), losses(off.rows)
    assert [g[:2] for g in got] == [w[:2] for w in want] and len(got) == WORLD * 3
    for g, w in zip(got, want):
        assert abs(g[2] - w[2]) < 1e-4, (g, w)
    torch.testing.assert_close(on.final_weights, off.final_weights, rtol=1e-4, atol=1e-5)
