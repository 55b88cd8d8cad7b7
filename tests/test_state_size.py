"""A method's memory overhead, counted from its step's state, against hand-computed values.

fp32 state per parameter: a residual is 4 bytes; EF21 keeps its estimate g_i and the sum S
(8), EF21-SGDM also its momentum v_i (12); DiLoCo its anchor and the outer Nesterov momentum
(8); PowerSGD its error (4) plus one warm-start Q of m x r floats per compressed layer."""

from __future__ import annotations

import pytest

from gtopk_lab.config import RunConfig
from gtopk_lab.training.simulator import simulate
from gtopk_lab.training.state_size import method_state_bytes_per_parameter, tensor_bytes

pytestmark = pytest.mark.timeout(120)

#: the CNN's parameter shapes (d = 5210)
CNN_LAYOUT = [(25, 1, 5), (25,), (25, 25, 3), (25,), (25, 25, 3), (25,), (10, 125), (10,)]


def _powersgd_by_hand(rank: int = 1, min_compression_rate: float = 2.0) -> float:
    """torch's hook rule: an (n, ...) parameter is the n x m matrix, m = numel / n, compressed
    at rank r when (n + m) r * rate < n m; each compressed one keeps Q (m x r floats)."""
    d, q_floats = 0, 0
    for shape in CNN_LAYOUT:
        n = shape[0]
        numel = 1
        for s in shape:
            numel *= s
        m = numel // n
        d += numel
        if (n + m) * rank * min_compression_rate < n * m:
            q_floats += m * rank
    return 4.0 + 4.0 * q_floats / d


@pytest.mark.parametrize("method, want", [
    ("dense", 0.0), ("topk", 4.0), ("gtopk", 4.0), ("ef21", 8.0), ("ef21-sgdm", 12.0), ("diloco", 8.0),
    ("powersgd", _powersgd_by_hand()),
])
def test_bytes_per_parameter_by_hand(method: str, want: float) -> None:
    assert method_state_bytes_per_parameter(method) == pytest.approx(want)


def test_powersgd_oracle_sees_the_cnn_layout() -> None:
    # 5 + 75 + 75 + 125 = 280 Q floats over d = 5210
    assert _powersgd_by_hand() == pytest.approx(4.0 + 4.0 * 280 / 5210)


def test_run_summaries_carry_the_run_own_state_bytes() -> None:
    """A simulated Top-k run with DGC momentum correction keeps a residual and a velocity
    (8 bytes per parameter); dense keeps nothing beyond its optimiser."""
    base = dict(model="mlp", dataset="synthetic", train_samples=64, test_samples=16, batch_size=8, workers=2,
                max_iterations=3, device="cpu")
    dgc = simulate(RunConfig(method="topk", momentum_correction=True, **base)).summary
    assert dgc["state_bytes_per_param"] == pytest.approx(8.0)
    assert simulate(RunConfig(method="dense", **base)).summary["state_bytes_per_param"] == 0.0


def test_tensor_bytes_walks_nested_state() -> None:
    import torch

    state = {"a": torch.zeros(3), "b": [torch.zeros(2, dtype=torch.float64), {"c": torch.zeros(4, dtype=torch.int8)}],
             "d": 7, "e": None}
    assert tensor_bytes(state) == 3 * 4 + 2 * 8 + 4
