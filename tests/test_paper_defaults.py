"""``preset="paper"`` runs each method's paper selector, EF21 / EF21-SGDM take the papers'
plain step, and every departure the registry declares is listed in docs/beyond_papers.md.

Oracles: hand-computed EF21 iterations and a table of each method's paper selector written
here (the preset's GaussianK against a port of the reference rule is in
tests/test_gaussiank_reference.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from gtopk_lab.config import RunConfig
from gtopk_lab.methods import available_methods, get_method
from gtopk_lab.training.optim import make_optimizer
from gtopk_lab.training.step import RankStep, communicate_simulated

pytestmark = pytest.mark.timeout(60)

#: The selector each built-in method's paper uses (None: nothing is selected; Ok-Topk selects
#: inside its collective by its own thresholds).
PAPER_SELECTORS = {
    "dense": None, "topk": "topk", "gtopk": "topk", "gaussiank": "gaussiank-paper",
    "oktopk": None, "oktopk-balanced": None, "oktopk-exact": "topk", "powersgd": None, "clt-k": None,
    "diloco": None, "ef21": "topk", "ef21-sgdm": "topk", "sparseloco": "chunk-topk",
    "sparseloco-gtopk": "chunk-topk",
}


def test_every_method_under_the_paper_preset_runs_its_papers_selector() -> None:
    assert set(available_methods()) >= set(PAPER_SELECTORS)
    for name, expected in PAPER_SELECTORS.items():
        config = RunConfig(method=name, preset="paper")
        if expected is None:
            continue
        assert config.default_selector == expected, name


def test_paper_selector_gives_way_to_a_given_one_and_follows_the_method() -> None:
    given = RunConfig(method="gaussiank", preset="paper", selector="gaussiank")
    assert given.selector == "gaussiank"
    paper = RunConfig(method="gaussiank", preset="paper")
    assert paper.replace(method="topk").selector is None
    assert paper.replace(preset=None).selector is None
    assert RunConfig(method="gaussiank").selector is None


def test_ef21_defaults_to_the_plain_step_and_a_given_momentum_wins() -> None:
    for name in ("ef21", "ef21-sgdm"):
        assert RunConfig(method=name).momentum == 0.0
        assert RunConfig(method=name, preset="paper").momentum == 0.0  # over the recipe's 0.9
        assert RunConfig(method=name, momentum=0.5).momentum == 0.5
        assert RunConfig(method=name).replace(method="topk").momentum == 0.9


class _Weights(nn.Module):
    def __init__(self, w0: list[float]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w0))


def _ef21_path(name: str, iterations: int) -> list[float]:
    """P = 1, d = 2, k = 1, loss 0.5 ||w||^2 (gradient w), lr 0.5, from w0 = [1, -3]: the
    weights after each iteration, flattened."""
    config = RunConfig(method=name, workers=1, lr=0.5)
    model = _Weights([1.0, -3.0])
    optimizer = make_optimizer(model, config)
    method = get_method(name)
    step = RankStep(method, 2, torch.device("cpu"), options=config.method_options)
    path = []
    for iteration in range(iterations):
        local = step.prepare(model.w.detach().clone(), 1)
        [result] = communicate_simulated(method, [local], step.call(1, iteration))
        step.finish(local, result)
        model.w.grad = step.aggregate(result, torch.device("cpu"))
        optimizer.step()
        path.extend(model.w.detach().tolist())
    return path


def test_ef21_three_steps_by_hand() -> None:
    """g_i = est, S = sum of c. 1: c = top1([1, -3]) = [0, -3], w = [1, -1.5];
    2: g - est = [1, 1.5] -> c = [0, 1.5], S = [0, -1.5], w = [1, -0.75];
    3: g - est = [1, 0.75] -> c = [1, 0], S = [1, -1.5], w = [0.5, 0].
    (With SGD momentum 0.9 on top, step 2 would give w = [1, 0.6].)"""
    assert _ef21_path("ef21", 3) == pytest.approx([1.0, -1.5, 1.0, -0.75, 0.5, 0.0])


def test_ef21_sgdm_two_steps_by_hand() -> None:
    """eta = 0.1, v starts at the first gradient. 1: v = [1, -3], c = [0, -3], w = [1, -1.5];
    2: v = 0.9 [1, -3] + 0.1 [1, -1.5] = [1, -2.85], v - est = [1, 0.15] -> c = [1, 0],
    S = [1, -3], w = [0.5, 0]."""
    assert _ef21_path("ef21-sgdm", 2) == pytest.approx([1.0, -1.5, 0.5, 0.0])


def test_every_declared_departure_is_listed_in_the_docs() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "beyond_papers.md").read_text()
    section = text.split("## Departures from the papers, method by method", 1)[1].split("\n## ", 1)[0]
    flat = re.sub(r"\s+", " ", section)
    for name in available_methods():
        if name not in PAPER_SELECTORS:
            continue  # a plugin registered by another test
        method = get_method(name)
        entry = f"- `{name}`: " + ("; ".join(method.departures) + "." if method.departures else "none.")
        assert entry in flat, name
        for phrase in method.departures:
            assert phrase in method.summary()["description"]
