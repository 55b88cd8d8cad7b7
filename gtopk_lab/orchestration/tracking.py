"""Optional experiment tracking: a study's configs, metric rows and summaries forwarded to
MLflow or to Weights & Biases (offline), through the study's subscription.

``track_study(study, MLflowTracker())`` (or ``WandbTracker()``, or both) subscribes to the
:class:`~gtopk_lab.orchestration.study.Study` (:meth:`Study.subscribe`: called from the
study's watcher thread, never the Lab's monitor, so a slow tracking store delays no run):

1. **Open.** Each tracker opens its store once: MLflow at ``tracking_uri`` (default a local
   file store, ``<study out>/mlruns``; any URI MLflow takes, ``sqlite:///...`` or a
   server), W&B in ``mode="offline"`` under ``<study out>/wandb`` (``wandb sync`` uploads
   it later, if ever).
2. **Start.** A point seen for the first time becomes one tracked run named by its run id:
   its ``RunConfig`` as parameters (``extra`` as JSON), tags ``gtopk_lab.run_id``,
   ``gtopk_lab.point_key``, ``gtopk_lab.source`` (real | simulated), ``gtopk_lab.study_id``
   where the study has one, and the caller's ``tags``.
3. **Rows.** At every call the rank-0 rows not forwarded yet (by kind and iteration) go out
   as metrics at ``step = iteration``: an iteration row's numeric fields under their own
   names (``train_loss``, ``comm_s``, ``virtual_time_s``, ...), an epoch row's as
   ``epoch_end/<field>`` (``epoch_end/test_accuracy``; not ``epoch/``: MLflow's file store
   keeps a metric per file, and the iteration rows' ``epoch`` is one). Identity fields
   (kind, rank, iteration, method, workers, density) are parameters, not metrics; NaN is
   skipped.
4. **Finish.** A point whose run ended (or was stored, completed earlier) sends its
   summary's numbers as ``summary/<field>`` (dicts flattened: ``summary/time_breakdown_s/
   compute``), the whole summary as the artifact ``summary.json`` (MLflow) or the run's
   summary (W&B), and ends the tracked run as finished, failed or killed.

:meth:`Tracking.wait` returns once every point finished; a tracker's error is printed once
per tracker and point (one line) and kept in :attr:`Tracking.errors`; the study goes on.
A tracker whose package is absent raises ``ModuleNotFoundError`` in one line naming the
extra (``pip install 'gtopk-lab[mlflow]'``, ``'gtopk-lab[wandb]'``) when it is made.

Cost: per call O(points + new rows); each row is forwarded once per tracker.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from gtopk_lab.orchestration import results as _results

__all__ = ["MLflowTracker", "Tracker", "TrackedRun", "Tracking", "WandbTracker", "track_study",
           "row_metrics", "summary_metrics"]

#: Row fields that say which run and row this is: parameters or steps, never metrics.
_IDENTITY = frozenset({"kind", "rank", "iteration", "method", "workers", "density"})
_STATUS = {"completed": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


def _require(module: str, extra: str, who: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ModuleNotFoundError(f"{who} needs the {extra} extra: pip install 'gtopk-lab[{extra}]' "
                                  f"({type(exc).__name__}: {exc})") from None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def row_metrics(row: dict[str, Any]) -> dict[str, float]:
    """A metric row's numeric fields as metric names (step 3 of the module docstring)."""
    prefix = "epoch_end/" if row.get("kind") == "epoch" else ""
    out = {}
    for name, value in row.items():
        number = _number(value)
        if name not in _IDENTITY and number is not None:
            out[prefix + name] = number
    return out


def summary_metrics(summary: dict[str, Any], prefix: str = "summary/") -> dict[str, float]:
    """A summary's numbers, dicts flattened (``summary/time_breakdown_s/compute``)."""
    out: dict[str, float] = {}
    for name, value in summary.items():
        if isinstance(value, dict):
            out.update(summary_metrics(value, f"{prefix}{name}/"))
        elif (number := _number(value)) is not None:
            out[prefix + name] = number
    return out


def _params(config: dict[str, Any]) -> dict[str, str]:
    return {k: v if isinstance(v, str) else json.dumps(v, default=str) for k, v in config.items()}


@dataclass
class TrackedRun:
    """One point as the trackers see it; ``refs`` holds each tracker's own run object."""

    key: str
    run_id: str
    config: dict[str, Any]
    source: str
    tags: dict[str, str]
    refs: dict[int, Any] = field(default_factory=dict)
    sent: set[tuple[str, int]] = field(default_factory=set)
    finished: bool = False


class Tracker(Protocol):
    """What :func:`track_study` drives (steps 1-4 of the module docstring)."""

    def open(self, out: str) -> None: ...
    def start(self, run: TrackedRun) -> Any: ...
    def log(self, ref: Any, rows: list[dict[str, Any]]) -> None: ...
    def finish(self, ref: Any, summary: dict[str, Any]) -> None: ...


class MLflowTracker:
    """Forwards to MLflow: ``tracking_uri`` (default ``file:<out>/mlruns``), one experiment.

    MLflow 3 refuses a file store unless ``MLFLOW_ALLOW_FILE_STORE=true``; for a file URI
    this sets that variable when it is unset (a database or server URI is left alone).
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str = "gtopk-lab") -> None:
        mlflow = _require("mlflow", "mlflow", "MLflowTracker")
        if tracking_uri is not None and not isinstance(tracking_uri, str):
            raise TypeError(f"tracking_uri={tracking_uri!r} has type {type(tracking_uri).__name__}: "
                            "expected str or None")
        if not isinstance(experiment, str) or not experiment.strip():
            raise ValueError(f"experiment={experiment!r} is invalid: expected a non-empty name")
        self._mlflow, self.tracking_uri, self.experiment = mlflow, tracking_uri, experiment
        self.client: Any = None
        self.experiment_id: str | None = None

    def open(self, out: str) -> None:
        uri = self.tracking_uri or (Path(out).resolve() / "mlruns").as_uri()
        if uri.startswith("file:") or "://" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.tracking_uri = uri
        self.client = self._mlflow.tracking.MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(self.experiment)
        if found is None:
            try:
                self.experiment_id = self.client.create_experiment(self.experiment)
            except Exception:  # another client created it meanwhile
                found = self.client.get_experiment_by_name(self.experiment)
                if found is None:
                    raise
        if found is not None:
            self.experiment_id = found.experiment_id

    def start(self, run: TrackedRun) -> Any:
        created = self.client.create_run(self.experiment_id, run_name=run.run_id, tags=run.tags)
        from mlflow.entities import Param

        params = [Param(k, v[:6000]) for k, v in _params(run.config).items()]
        for i in range(0, len(params), 100):  # MLflow's batch limit for parameters
            self.client.log_batch(created.info.run_id, params=params[i:i + 100])
        return created.info.run_id

    def log(self, ref: Any, rows: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, int(row["iteration"]))
                   for row in rows for name, value in row_metrics(row).items()]
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit for metrics
            self.client.log_batch(ref, metrics=metrics[i:i + 1000])

    def finish(self, ref: Any, summary: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), int(summary.get("iterations") or 0)
        metrics = [Metric(k, v, now, step) for k, v in summary_metrics(summary).items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(ref, metrics=metrics[i:i + 1000])
        self.client.log_dict(ref, json.loads(json.dumps(summary, default=str)), "summary.json")
        self.client.set_terminated(ref, status=_STATUS.get(summary.get("status"), "FAILED"))


class WandbTracker:
    """Forwards to Weights & Biases, offline by default (``mode="offline"``, files under
    ``dir``, default ``<out>/wandb``); one W&B run per point, grouped by ``group``."""

    def __init__(self, project: str = "gtopk-lab", *, mode: str = "offline", dir: str | None = None,
                 group: str | None = None, entity: str | None = None) -> None:
        self._wandb = _require("wandb", "wandb", "WandbTracker")
        if mode not in ("offline", "online", "disabled"):
            raise ValueError(f"mode={mode!r} is invalid: expected offline, online or disabled")
        self.project, self.mode, self.dir, self.group, self.entity = project, mode, dir, group, entity

    def open(self, out: str) -> None:
        self.dir = self.dir or str(Path(out) / "wandb")
        Path(self.dir).mkdir(parents=True, exist_ok=True)

    def start(self, run: TrackedRun) -> Any:
        # several points run at once: each its own live W&B run (reinit="create_new")
        return self._wandb.init(project=self.project, entity=self.entity, name=run.run_id,
                                group=self.group or run.tags.get("gtopk_lab.study_id"), config=run.config,
                                tags=[run.source, str(run.config.get("method"))], dir=self.dir,
                                mode=self.mode, reinit="create_new")

    def log(self, ref: Any, rows: list[dict[str, Any]]) -> None:
        by_step: dict[int, dict[str, float]] = {}
        for row in rows:
            by_step.setdefault(int(row["iteration"]), {}).update(row_metrics(row))
        last = getattr(ref, "_gtopk_last_step", -1)
        for step in sorted(by_step):
            if step >= last:  # W&B steps only go forward
                ref.log(by_step[step], step=step)
                last = step
        ref._gtopk_last_step = last

    def finish(self, ref: Any, summary: dict[str, Any]) -> None:
        ref.summary.update({k.removeprefix("summary/"): v for k, v in summary_metrics(summary).items()})
        ref.summary.update({"status": summary.get("status"), "run_id": summary.get("run_id")})
        ref.finish(exit_code=0 if summary.get("status") == "completed" else 1)


class Tracking:
    """The forwarding of one study to its trackers (made by :func:`track_study`)."""

    def __init__(self, study: Any, trackers: list[Any], tags: dict[str, str]) -> None:
        self.study, self.trackers, self.tags = study, trackers, dict(tags)
        self.runs: dict[str, TrackedRun] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._all_finished = threading.Event()
        self._unsubscribe: Any = None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every point's run was finished in the trackers; False on timeout."""
        return self._all_finished.wait(timeout_s)

    def stop(self) -> None:
        """Stop forwarding (runs not finished stay open in the tracking store)."""
        if self._unsubscribe is not None:
            self._unsubscribe()

    def __call__(self, study: Any) -> None:
        """The study's subscriber: steps 2-4 of the module docstring for every point."""
        with self._lock:
            for point in study.points_list:
                self._forward(study, point)
            if all(self.runs.get(p.key) is not None and self.runs[p.key].finished
                   for p in study.points_list):
                self._all_finished.set()

    # --- internals -----------------------------------------------------------------------
    def _forward(self, study: Any, point: Any) -> None:
        handle = study.handles.get(point.key)
        stored = study.stored.get(point.key)
        run = self.runs.get(point.key)
        if run is None:
            run_id = handle.run_id if handle is not None else (stored or {}).get("run_id") or point.key
            tags = {"gtopk_lab.run_id": str(run_id), "gtopk_lab.point_key": point.key,
                    "gtopk_lab.source": point.source, **self.tags}
            if getattr(study, "study_id", None):
                tags["gtopk_lab.study_id"] = str(study.study_id)
            run = TrackedRun(point.key, str(run_id), point.config.to_dict(), point.source, tags)
            self.runs[point.key] = run
            self._each(run, "start", lambda i, t: run.refs.__setitem__(i, t.start(run)))
        if run.finished:
            return
        summary = stored if handle is None else (dict(handle.summary) if handle.done() and
                                                 handle.summary is not None else None)
        if handle is not None:
            frame = handle.metrics
        else:
            frame = _results.RunStore(study.lab.out, run.run_id).read_metrics() if stored else None
        rows = self._new_rows(run, frame)
        if rows:
            self._each(run, "log", lambda i, t: t.log(run.refs[i], rows))
        if summary is not None:
            self._each(run, "finish", lambda i, t: t.finish(run.refs[i], summary))
            run.finished = True

    @staticmethod
    def _new_rows(run: TrackedRun, frame: pd.DataFrame | None) -> list[dict[str, Any]]:
        if frame is None or not len(frame) or "rank" not in frame.columns:
            return []
        records = frame[frame["rank"] == 0].sort_values("iteration").to_dict("records")
        new = [r for r in records if (r.get("kind"), int(r["iteration"])) not in run.sent]
        run.sent.update((r.get("kind"), int(r["iteration"])) for r in new)
        return new

    def _each(self, run: TrackedRun, step: str, action: Any) -> None:
        for i, tracker in enumerate(self.trackers):
            if step != "start" and i not in run.refs:
                continue  # its start failed: nothing to log into
            try:
                action(i, tracker)
            except Exception as exc:  # a tracking store's trouble must not stop the study
                message = f"{type(tracker).__name__} {step} of run {run.run_id}: {type(exc).__name__}: " \
                          f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                if not any(e.startswith(f"{type(tracker).__name__} {step} of run {run.run_id}:")
                           for e in self.errors):
                    print(f"gtopk-lab tracking: {message}", file=sys.stderr)
                self.errors.append(message)


def track_study(study: Any, *trackers: Any, tags: dict[str, str] | None = None) -> Tracking:
    """Forward ``study`` to ``trackers`` (:class:`MLflowTracker`, :class:`WandbTracker`, or
    any object with ``open/start/log/finish``) from now on; points already done are
    forwarded at once. Returns the :class:`Tracking` (``wait``, ``stop``, ``errors``)."""
    if not trackers:
        raise ValueError("trackers=() is invalid: expected at least one tracker, e.g. MLflowTracker()")
    for tracker in trackers:
        missing = [m for m in ("open", "start", "log", "finish") if not callable(getattr(tracker, m, None))]
        if missing:
            raise TypeError(f"tracker={tracker!r} is invalid: it lacks {', '.join(missing)}")
    if tags is not None and (not isinstance(tags, dict) or not all(isinstance(k, str) for k in tags)):
        raise TypeError(f"tags={tags!r} is invalid: expected a dict of str keys")
    for tracker in trackers:
        tracker.open(study.lab.out)
    tracking = Tracking(study, list(trackers), {k: str(v) for k, v in (tags or {}).items()})
    tracking._unsubscribe = study.subscribe(tracking)
    return tracking
