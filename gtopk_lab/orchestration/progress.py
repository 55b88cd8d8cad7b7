"""Progress bars for runs and sweeps (``tqdm.auto``: a widget in Jupyter, text elsewhere).

Client side only. A :class:`RunProgress` is a RunHandle subscriber: it advances on
rank 0's ``iter`` rows and shows the latest training loss. A :class:`SweepProgress`
counts finished runs of a sweep.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from gtopk_lab.config import RunConfig


def expected_iterations(config: RunConfig) -> int:
    """Estimate of a run's total iterations: ``epochs * ceil(train_samples / P / batch)``,
    capped by ``max_iterations``. The bar's total grows if the real count is larger."""
    per_rank = math.ceil(config.train_samples / config.workers)
    per_epoch = max(1, math.ceil(per_rank / config.batch_size))
    total = config.epochs * per_epoch
    if config.max_iterations is not None:
        total = min(total, config.max_iterations)
    return max(1, total)


def _tqdm(**kwargs: Any) -> Any:
    from tqdm.auto import tqdm

    return tqdm(**kwargs)


class RunProgress:
    """Progress of one run, driven by the run's metric rows."""

    def __init__(self, config: RunConfig, *, position: int | None = None, leave: bool = True) -> None:
        self.total = expected_iterations(config)
        self.done = 0
        self.bar = _tqdm(total=self.total, desc=f"{config.method} P={config.workers}", unit="it",
                         position=position, leave=leave, dynamic_ncols=True)

    def __call__(self, new_rows: pd.DataFrame) -> None:
        if new_rows is None or not len(new_rows) or "kind" not in new_rows:
            return
        it_rows = new_rows[(new_rows["kind"] == "iter") & (new_rows.get("rank", 0) == 0)]
        if not len(it_rows):
            return
        reached = int(it_rows["iteration"].max()) + 1
        if reached > self.bar.total:
            self.bar.total = reached
        if reached > self.done:
            self.bar.update(reached - self.done)
            self.done = reached
        loss = it_rows["train_loss"].iloc[-1] if "train_loss" in it_rows else None
        if loss is not None:
            self.bar.set_postfix(loss=f"{float(loss):.4g}", refresh=False)

    def close(self, status: str) -> None:
        if status == "completed" and self.done < self.bar.total:
            self.bar.total = max(self.done, 1)
            self.bar.refresh()
        self.bar.set_description_str(f"{self.bar.desc} [{status}]")
        self.bar.close()


class SweepProgress:
    """Progress of a sweep: one step per finished run, with counts of failures."""

    def __init__(self, total_runs: int, desc: str = "sweep") -> None:
        self.bar = _tqdm(total=total_runs, desc=desc, unit="run", dynamic_ncols=True)
        self.failed = 0

    def run_finished(self, status: str) -> None:
        if status != "completed":
            self.failed += 1
            self.bar.set_postfix(failed=self.failed, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
