"""The in-memory dataset every loader returns (train and test tensors, classes, task)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Dataset"]


@dataclass
class Dataset:
    """A train and a test split as tensors (inputs ``x``, targets ``y``)."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    #: Number of classes (vocabulary size for language modelling).
    num_classes: int
    task: str = "classification"

    @property
    def train_samples(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def test_samples(self) -> int:
        return int(self.x_test.shape[0])


# --------------------------------------------------------------------------- helpers
