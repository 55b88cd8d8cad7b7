"""Run identity: which study (or studies) a run belongs to, its tags, and the study's varied
fields, kept in the run's ``summary.json`` beside the config, never in it.

The config hash (:func:`~gtopk_lab.orchestration.run_files.config_hash`) stays what makes
two runs one point: a point shared by two studies is one run, and both studies' labels are
recorded on it. A run's identity in its summary:

- ``study_id``: the study whose run it is (the first that recorded it; None for a run
  submitted alone), ``study_ids``: every study that holds it, in the order they did;
- ``tags``: the union of its studies' (and its own) tags, sorted;
- ``varied``: the values of the fields that differ between the points of its first study
  (``{"method": "gtopk", "workers": 4}``); ``studies``: per study id, its tags and varied values.

How it is made:

1. :func:`run_labels` checks what ``Lab.submit(labels=...)`` or a ``Study`` gives
   (``study_id`` a name of letters, digits and ``._-``; ``tags`` strings; ``varied`` a dict);
   :func:`new_study_id` names a study that was given none (``study-<UTC time>-<4 hex>``).
2. :func:`varied_fields` of a study's points: the ``RunConfig`` fields (and ``source``) whose
   values are not all equal; :func:`point_varied` the values of one point.
3. :func:`with_labels` adds one study's labels to a summary (used for every summary the
   store writes for a run: queued, running, final); :func:`record_labels` adds them to a
   stored run that another study completed, under the run folder's lock, rewriting its
   ``summary.json`` atomically.
4. :func:`filter_runs` keeps the runs of a study and/or a tag; :func:`study_order` sorts a
   listing so that each study's runs stand together (``gtopk-lab runs``, ``Lab.runs``).

Cost: O(points x fields) to find the varied fields; one locked read and write of a
summary per reused point. Client side only.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gtopk_lab.jsonsafe import json_safe
from gtopk_lab.orchestration.run_files import LOCK_FILE, SUMMARY_FILE, read_json, write_json_atomic

__all__ = ["IDENTITY_KEYS", "RunLabels", "run_labels", "check_study_id", "check_tags", "new_study_id",
           "varied_fields", "point_varied", "with_labels", "record_labels", "filter_runs",
           "study_order", "labels_of"]

#: The summary keys this module writes.
IDENTITY_KEYS: tuple[str, ...] = ("study_id", "study_ids", "tags", "varied", "studies")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
#: Seconds a reusing study waits for a stored run's folder lock before giving up on labelling it.
LABEL_LOCK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RunLabels:
    """One study's (or a lone run's) labels for a run: checked by :func:`run_labels`."""

    study_id: str | None = None
    tags: tuple[str, ...] = ()
    varied: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"study_id": self.study_id, "tags": list(self.tags), "varied": dict(self.varied)}


def check_study_id(value: Any, name: str = "study_id") -> str:
    """``value`` as a study id; ``TypeError``/``ValueError`` naming ``name`` otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{name}={value!r} has type {type(value).__name__}: expected a str")
    if not _NAME.match(value):
        raise ValueError(f"{name}={value!r} is invalid: expected 1-100 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return value


def check_tags(value: Any, name: str = "tags") -> tuple[str, ...]:
    """``value`` (a str or a list of str) as a tuple of distinct tags, in the order given."""
    items = [value] if isinstance(value, str) else value
    if items is None:
        return ()
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise TypeError(f"{name}={value!r} has type {type(value).__name__}: expected a str or a list of str")
    tags: list[str] = []
    for tag in items:
        if not isinstance(tag, str):
            raise TypeError(f"{name}={value!r} is invalid: tag {tag!r} is not a str")
        if not tag.strip() or tag != tag.strip() or len(tag) > 100:
            raise ValueError(f"{name}={value!r} is invalid: a tag is 1-100 characters without leading "
                             "or trailing spaces")
        if tag not in tags:
            tags.append(tag)
    return tuple(tags)


def new_study_id() -> str:
    """A fresh, sortable study id: ``study-<UTC time>-<4 hex>``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"study-{stamp}-{secrets.token_hex(2)}"


def run_labels(value: RunLabels | Mapping[str, Any] | None) -> RunLabels:
    """Checked labels from a :class:`RunLabels`, a dict with keys ``study_id``, ``tags``,
    ``varied`` (each optional), or None (no labels)."""
    if value is None:
        return RunLabels()
    if isinstance(value, RunLabels):
        value = value.to_dict()
    if not isinstance(value, Mapping):
        raise TypeError(f"labels={value!r} has type {type(value).__name__}: expected a dict with keys "
                        "study_id, tags, varied (or None)")
    unknown = sorted(set(value) - {"study_id", "tags", "varied"})
    if unknown:
        raise ValueError(f"labels has unknown key(s) {', '.join(map(str, unknown))}: expected study_id, tags, varied")
    study_id = value.get("study_id")
    varied = value.get("varied") or {}
    if not isinstance(varied, Mapping):
        raise TypeError(f"labels['varied']={varied!r} has type {type(varied).__name__}: expected a dict")
    return RunLabels(None if study_id is None else check_study_id(study_id, "labels['study_id']"),
                     check_tags(value.get("tags"), "labels['tags']"), json_safe(dict(varied)))


# ------------------------------------------------------------------------------------------
def _canonical(value: Any) -> str:
    return json.dumps(json_safe(value), sort_keys=True, separators=(",", ":"))


def varied_fields(points: Sequence[Any]) -> list[str]:
    """The fields that differ between ``points`` (objects with ``config`` and ``source``,
    e.g. ``StudyPoint``): ``RunConfig`` fields in their declared order, ``run_id`` aside,
    then ``source``."""
    if not points:
        return []
    dicts = [p.config.to_dict() for p in points]
    names = [n for n in dicts[0] if n != "run_id"]
    varied = [n for n in names if len({_canonical(d.get(n)) for d in dicts}) > 1]
    if len({p.source for p in points}) > 1:
        varied.append("source")
    return varied


def point_varied(point: Any, names: Iterable[str]) -> dict[str, Any]:
    """The values of ``names`` (from :func:`varied_fields`) for one point."""
    return json_safe({n: point.source if n == "source" else getattr(point.config, n) for n in names})


# ------------------------------------------------------------------------------------------
def labels_of(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """The identity keys of ``summary`` (what a resumed run keeps), blanks filled."""
    summary = summary or {}
    studies = summary.get("studies")
    tags = summary.get("tags")
    ids = summary.get("study_ids")
    return {"study_id": summary.get("study_id") if isinstance(summary.get("study_id"), str) else None,
            "study_ids": [s for s in ids if isinstance(s, str)] if isinstance(ids, list) else [],
            "tags": [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else [],
            "varied": dict(summary["varied"]) if isinstance(summary.get("varied"), dict) else {},
            "studies": {str(k): dict(v) for k, v in studies.items() if isinstance(v, dict)}
            if isinstance(studies, dict) else {}}


def with_labels(summary: dict[str, Any], labels: RunLabels | None,
                earlier: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``summary`` with its identity keys: those of ``earlier`` (a summary holding them
    already; default ``summary`` itself) plus ``labels``' study and tags. The first study
    recorded stays ``study_id`` and gives ``varied``."""
    ident = labels_of(summary if earlier is None else earlier)
    labels = labels or RunLabels()
    if labels.study_id is not None:
        if labels.study_id not in ident["study_ids"]:
            ident["study_ids"].append(labels.study_id)
        ident["studies"][labels.study_id] = {"tags": list(labels.tags), "varied": dict(labels.varied)}
        if ident["study_id"] is None:
            ident["study_id"], ident["varied"] = labels.study_id, dict(labels.varied)
    elif labels.varied and not ident["varied"]:
        ident["varied"] = dict(labels.varied)
    ident["tags"] = sorted(set(ident["tags"]) | set(labels.tags))
    return {**summary, **ident}


def record_labels(run_folder: str | os.PathLike[str], labels: RunLabels,
                  timeout_s: float = LABEL_LOCK_TIMEOUT_S) -> dict[str, Any] | None:
    """Add ``labels`` to the stored run at ``run_folder`` (step 3 of the module docstring):
    under its folder lock, read ``summary.json``, add them, write it back atomically.
    Returns the new summary, or None when there is no readable summary or the lock stayed
    held for ``timeout_s`` (the run is then used unlabelled; nothing is lost)."""
    from gtopk_lab.orchestration.locks import wait_lock

    folder = Path(run_folder)
    try:
        held = wait_lock(folder / LOCK_FILE, timeout_s)
    except (TimeoutError, ValueError):
        return None
    with held:
        try:
            summary = read_json(folder, SUMMARY_FILE)
        except ValueError:  # damaged: leave it to the readers, which say so
            return None
        if summary is None:
            return None
        updated = with_labels(summary, labels)
        if any(updated.get(k) != summary.get(k) for k in IDENTITY_KEYS):
            write_json_atomic(folder / SUMMARY_FILE, updated)
        return updated


# ------------------------------------------------------------------------------------------
def _ids(value: Any, first: Any) -> list[str]:
    ids = [s for s in value if isinstance(s, str)] if isinstance(value, (list, tuple)) else []
    if isinstance(first, str) and first not in ids:
        ids.insert(0, first)
    return ids


def filter_runs(summaries: pd.DataFrame, study: str | Sequence[str] | None = None,
                tag: str | Sequence[str] | None = None) -> pd.DataFrame:
    """The rows of ``summaries`` (``load_summaries``) in study ``study`` (any of several)
    and carrying tag ``tag`` (every one of several); runs without identity match neither."""
    if summaries.empty:
        return summaries
    blank = [None] * len(summaries)
    keep = [True] * len(summaries)
    if study is not None:
        wanted = {study} if isinstance(study, str) else set(study)
        ids, first = summaries.get("study_ids", blank), summaries.get("study_id", blank)
        keep = [k and bool(wanted & set(_ids(i, f))) for k, i, f in zip(keep, ids, first)]
    if tag is not None:
        wanted_tags = {tag} if isinstance(tag, str) else set(tag)
        tags = summaries.get("tags", blank)
        keep = [k and wanted_tags <= set(t if isinstance(t, (list, tuple)) else ()) for k, t in zip(keep, tags)]
    return summaries[pd.Series(keep, index=summaries.index, dtype=bool)]


def study_order(summaries: pd.DataFrame) -> pd.DataFrame:
    """``summaries`` with each study's runs together: a study stands where its first run was
    submitted (a run without a study where it was), its runs by submission time, then run id."""
    if summaries.empty:
        return summaries
    frame = summaries.copy()
    study = frame["study_id"] if "study_id" in frame.columns else pd.Series([None] * len(frame), index=frame.index)
    frame["_study"] = [s if isinstance(s, str) else "" for s in study]
    submitted = frame["submitted_at"] if "submitted_at" in frame.columns else frame.get("run_id")
    frame["_when"] = [str(s) if isinstance(s, str) else "" for s in submitted]
    first = frame[frame["_study"] != ""].groupby("_study")["_when"].min().to_dict()
    frame["_first"] = [first.get(s, w) for s, w in zip(frame["_study"], frame["_when"])]
    keys = ["_first", "_study", "_when"] + (["run_id"] if "run_id" in frame.columns else [])
    frame = frame.sort_values(keys, kind="stable")
    return frame.drop(columns=["_study", "_when", "_first"])
