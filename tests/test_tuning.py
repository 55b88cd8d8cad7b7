"""Each method at its best LR (orchestration.tuning): tuned on a validation split carved from
the training set, compared at the chosen LRs, the budget recorded.

The case: dense S-SGD (SGD, momentum 0.9) and DiLoCo (inner AdamW) on MNIST-1D, LRs 0.001 and
0.1, small simulated runs. AdamW wants a small step and SGD a large one, so the best LRs
differ; the oracle is each method's own trials, averaged over seeds by the test."""

from __future__ import annotations

import math

import pytest
import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration.tuning import tune_and_compare
from gtopk_lab.training.data import validation_split
from gtopk_lab.training.dataset import Dataset
from gtopk_lab.training.simulator import simulate

BASE = dict(model="mlp", dataset="mnist1d", train_samples=400, test_samples=100, workers=2, epochs=3,
            batch_size=16, device="cpu", eval_every_epochs=3)


@pytest.mark.timeout(240)
def test_best_lr_differs_between_two_methods_and_the_comparison_runs_there() -> None:
    seen: list[RunConfig] = []

    def run(configs: list[RunConfig]) -> list[dict]:
        seen.extend(configs)
        return [simulate(c).summary for c in configs]

    result = tune_and_compare(run, ["dense", "diloco"], [0.1, 0.001], seeds=1, base=BASE)
    trials = result.trials
    by_hand = {m: float(trials[trials.method == m].groupby("lr")["value"].mean().idxmin()) for m in ("dense", "diloco")}
    assert result.best_lr == by_hand == {"dense": 0.1, "diloco": 0.001}
    assert len(trials) == 4 and trials["value"].map(math.isfinite).all()
    tuning, final = seen[:4], seen[4:]
    assert all(c.model_options.validation_fraction == 0.2 for c in tuning)  # never the test split
    assert [(c.method, c.lr) for c in final] == [("dense", 0.1), ("diloco", 0.001)]
    assert all(c.model_options.validation_fraction is None for c in final)
    comparison = result.comparison
    assert comparison["best_lr"].tolist() == [0.1, 0.001]
    assert comparison["lr_budget"].tolist() == [[0.001, 0.1]] * 2 and (comparison["tuning_runs"] == 4).all()
    assert (comparison["validation_fraction"] == 0.2).all() and (comparison["status"] == "completed").all()


def test_a_failed_run_counts_as_the_worst_and_ties_go_to_the_smaller_lr() -> None:
    def run(configs: list[RunConfig]) -> list[dict | None]:
        out: list[dict | None] = []
        for c in configs:
            if c.lr == 0.3:
                out.append(None)  # no summary
            elif c.lr == 1.0:
                out.append({"status": "completed", "final_test_loss": math.inf})
            else:
                out.append({"status": "completed", "final_test_loss": 1.0})
        return out

    result = tune_and_compare(run, "topk", [1.0, 0.3, 0.2, 0.1], base={"model": "mlp"})
    assert result.best_lr == {"topk": 0.1}
    accuracy = tune_and_compare(lambda cs: [{"status": "completed", "final_test_accuracy": c.lr} for c in cs],
                                "topk", [0.1, 0.2], metric="final_test_accuracy")
    assert accuracy.best_lr == {"topk": 0.2}  # an accuracy is maximised


@pytest.mark.parametrize("kwargs, match", [
    ({"lrs": []}, "lrs="), ({"lrs": [0.1, -1]}, "lrs="), ({"seeds": 0}, "seeds="),
    ({"validation_fraction": 1.0}, "validation_fraction="), ({"methods": []}, "methods="),
])
def test_bad_arguments_fail_before_anything_runs(kwargs: dict, match: str) -> None:
    args = {"methods": "topk", "lrs": [0.1], **kwargs}
    with pytest.raises(ValueError, match=match):
        tune_and_compare(lambda cs: pytest.fail("nothing may run"), args.pop("methods"), args.pop("lrs"), **args)


def test_validation_split_is_carved_from_the_training_set_only() -> None:
    x = torch.arange(10.0).view(10, 1)
    data = Dataset("t", x, torch.arange(10), torch.full((4, 1), -1.0), torch.full((4,), -1), 10)
    split = validation_split(data, 0.3, seed=5)
    assert split.train_samples == 7 and split.test_samples == 3
    train, valid = set(split.x_train.view(-1).tolist()), set(split.x_test.view(-1).tolist())
    assert train | valid == set(range(10)) and not train & valid  # the test split is gone
    assert torch.equal(split.y_test, split.x_test.view(-1).long())  # labels travel with samples
    assert torch.equal(validation_split(data, 0.3, seed=5).x_test, split.x_test)  # seeded
    for bad in (0.0, 1.0, 0.01, "0.2"):
        with pytest.raises(ValueError, match="validation_fraction"):
            validation_split(data, bad, seed=0)
