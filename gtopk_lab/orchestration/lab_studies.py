"""The grid half of a :class:`~gtopk_lab.orchestration.lab.Lab`: studies, sweeps, tuning,
and the study points its studies share.

:class:`StudyLauncher` is mixed into ``Lab`` and asks of it only ``out``, ``worker_info()``,
``submit()`` and its monitor's queue:

1. :meth:`~StudyLauncher.study`: ``study_grid.expand_grid`` of the axes, calibrated costs
   (``compute="calibrated"``), then a :class:`~gtopk_lab.orchestration.study.Study`, which
   reads the results folder once and submits the points it does not find completed;
2. :meth:`~StudyLauncher.share_point`: a point another study of this Lab runs now is
   followed, not submitted twice: its handle gets the new study's labels (its summaries
   record both studies) and the new study reads that handle;
3. :meth:`~StudyLauncher.sweep`: configs as one study's points, waited for;
   :meth:`~StudyLauncher.tune`: each method's best learning rate through sweeps.

Cost: O(points) configs and one scheduler round trip per submitted point. Client side.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration import results as _results
from gtopk_lab.orchestration.arguments import (
    check_bool, check_configs, check_optional_bool, check_seconds,
)
from gtopk_lab.orchestration.handle import RunHandle
from gtopk_lab.orchestration.run_identity import RunLabels, check_study_id, check_tags, record_labels

if TYPE_CHECKING:
    from gtopk_lab.orchestration.study import Study

__all__ = ["StudyLauncher"]


class StudyLauncher:
    """Studies, sweeps and tuning on a Lab (see the module docstring); a mixin of ``Lab``."""

    out: str
    _monitor: Any

    def share_point(self, key: str, labels: RunLabels) -> RunHandle | None:
        """Step 2 of the module docstring: the queued or running study point ``key`` of this
        Lab, now also labelled ``labels``; None when there is none (submit it then)."""
        handle = self._monitor.active_point(key)
        if handle is None:
            return None
        if handle.add_labels(labels) and handle.status == "completed":
            # it ended meanwhile: its final summary was written without this study
            record_labels(_results.RunStore(self.out, handle.run_id).path, labels)
        return handle

    def study(self, *, base: RunConfig | dict[str, Any] | None = None,
              real_max_workers: int | None = None, both_ways: Sequence[int] = (),
              simulate: bool = False, skip_completed: bool = True, progress: bool | None = None,
              refresh_s: float = 1.0, compute: str = "calibrated", study_id: str | None = None,
              tags: str | Sequence[str] = (), **axes: Any) -> "Study":
        """Launch a grid of runs and return its :class:`~gtopk_lab.orchestration.study.Study`
        at once (non-blocking).

        ``axes``: ``RunConfig`` field names (``method``/``methods``, ``workers``, ``density``,
        ``bandwidth``, ``latency``, ... any field), each a scalar or a list, and ``seeds``
        (an int n: seeds ``seed .. seed+n-1``; or a list). ``base``: the fields every point
        shares. P <= ``real_max_workers`` (default: the workers this cluster has) run as
        real ranks, larger P in the simulator as Dask tasks on the workers; P in
        ``both_ways`` run both ways (a fidelity check); ``simulate=True`` simulates every
        point. Dense P = 1 baselines join and run first. Completed points under ``out``
        are not run again (``skip_completed``). ``compute``: ``"calibrated"`` (default) charges
        every rank, real or simulated, its workload's compute time and merge gamma measured
        once on a worker (:mod:`gtopk_lab.orchestration.calibration`, kept in
        ``out/calibration.json``; a point whose ``extra`` fixes ``compute_time_s`` keeps it);
        ``"measured"`` charges each rank's own CPU time. ``study_id`` (default: a generated
        ``study-<time>-<hex>``) and ``tags`` name the study in every run's summary, with the
        fields its points vary (``gtopk-lab runs --study ID --tag T``). Example::

            study = lab.study(methods=["dense", "topk", "gtopk"], workers=[1, 2, 4, 8, 16],
                              bandwidth="1GbE", density=0.001, seeds=2, base={"model": "cnn"})
            live_scaling(study); study.wait(); study.efficiency()
        """
        from gtopk_lab.orchestration.calibration import COMPUTE_MODES, with_calibrated_costs
        from gtopk_lab.orchestration.study import Study
        from gtopk_lab.orchestration.study_grid import expand_grid

        if base is not None and not isinstance(base, (RunConfig, dict)):
            raise TypeError(f"base={base!r} has type {type(base).__name__}: expected a RunConfig, a dict "
                            "of its fields, or None")
        for name, flag in (("simulate", simulate), ("skip_completed", skip_completed)):
            check_bool(name, flag)
        check_optional_bool("progress", progress)
        refresh_s = check_seconds("refresh_s", refresh_s, high=3600.0)
        if study_id is not None:
            check_study_id(study_id)
        tags = check_tags(tags)
        if real_max_workers is None:
            real_max_workers = len(self.worker_info())
        points = expand_grid(base, axes, real_max_workers=real_max_workers, both_ways=both_ways,
                             simulate=simulate)
        if compute not in COMPUTE_MODES:
            raise ValueError(f"compute={compute!r} is invalid: expected one of {', '.join(COMPUTE_MODES)}")
        if compute == "calibrated":
            points = with_calibrated_costs(self, points, self.out)
        return Study(self, points, skip_completed=skip_completed, progress=progress,
                     refresh_s=refresh_s, study_id=study_id, tags=tags)

    def tune(self, method: str | Sequence[str], lrs: Sequence[float], seeds: int | Sequence[int] = 1, *,
             base: RunConfig | dict[str, Any] | None = None, simulate: bool = True,
             metric: str = "final_test_loss", validation_fraction: float = 0.2,
             progress: bool | None = None) -> Any:
        """Each method's best learning rate on a validation split, then the methods compared at
        those LRs (:func:`gtopk_lab.orchestration.tuning.tune_and_compare`; returns its
        ``TuneResult``: ``best_lr``, ``trials``, ``comparison`` with the budget recorded).
        Runs go through :meth:`sweep` (simulated by default: the simulator gives a real run's
        weights to float tolerance, at a fraction of the cores); completed ones under ``out``
        are reused. Example::

            result = lab.tune(["dense", "gtopk"], lrs=[0.01, 0.05, 0.2], seeds=2,
                              base={"model": "cnn", "workers": 4, "epochs": 10})
            result.best_lr, result.comparison[["method", "best_lr", "final_test_accuracy"]]
        """
        from gtopk_lab.orchestration.run_files import config_hash
        from gtopk_lab.orchestration.tuning import tune_and_compare

        check_bool("simulate", simulate)

        def run(configs: list[RunConfig]) -> list[dict[str, Any] | None]:
            done = self.sweep(configs, simulate=simulate, progress=progress)
            by_hash = {row["config_hash"]: row for row in done.to_dict(orient="records")} \
                if "config_hash" in done.columns else {}
            return [by_hash.get(config_hash(c)) for c in configs]

        return tune_and_compare(run, method, lrs, seeds, base, metric=metric,
                                validation_fraction=validation_fraction)

    def sweep(self, configs: Iterable[RunConfig], skip_completed: bool = True,
              progress: bool | None = None, simulate: bool = False, *, study_id: str | None = None,
              tags: str | Sequence[str] = ()) -> pd.DataFrame:
        """Run ``configs`` as one study of real (or, with ``simulate``, simulated) points,
        wait, and return their summaries (stored ones marked ``skipped``).

        A thin wrapper of :class:`~gtopk_lab.orchestration.study.Study`: with
        ``skip_completed`` a config whose run already completed under ``out`` is not run
        again, so an interrupted sweep resumes where it stopped; a damaged run there is
        moved aside (``results.read_run``). ``configs``: a non-empty list of ``RunConfig``
        (or dicts of its fields). ``study_id``/``tags``: as for :meth:`study`.
        """
        from gtopk_lab.orchestration.study import Study
        from gtopk_lab.orchestration.study_grid import StudyPoint

        for name, flag in (("skip_completed", skip_completed), ("simulate", simulate)):
            check_bool(name, flag)
        check_optional_bool("progress", progress)
        source = "simulated" if simulate else "real"
        points = [StudyPoint(config, source) for config in check_configs(configs)]
        study = Study(self, points, skip_completed=skip_completed, progress=progress,
                      study_id=study_id, tags=tags)
        study.wait(cancel_on_interrupt=True)
        return study.summaries()
