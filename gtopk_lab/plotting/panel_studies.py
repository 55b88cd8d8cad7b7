"""The studies a ControlPanel's live tabs compare: every study launched from the panel and
every one overlaid on it (``panel.overlay(study)``: a notebook's study, or a stored one from
``Study.load``), in the order they joined.

:class:`PanelStudies` keeps them and builds the two figures:

1. each study joins with a title (``study 2 (rho-sweep)``): its legend group's title;
2. :meth:`PanelStudies.figures` draws them all with
   :func:`~gtopk_lab.plotting.figures_studies.scaling_studies_figure` and
   :func:`~gtopk_lab.plotting.figures_studies.convergence_studies_figure`: legend names
   carry only what varies between the shown series, the newest study is drawn in full and
   the earlier ones faded, a click on the legend hides or shows a whole study;
3. a study that has ended is read once (its points, rows and status kept), so a refresh
   costs only the studies still running.

Cost per refresh: O(points + rows) of the running studies, plus one rebuild of each figure.
Client side only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from gtopk_lab.plotting.figures_studies import (ShownStudy, convergence_studies_figure, scaling_studies_figure,
                                                shown_study)

__all__ = ["PanelStudies"]


@dataclass
class _Entry:
    study: Any
    title: str
    launched: bool
    ended: ShownStudy | None = None


class PanelStudies:
    """The launched and overlaid studies of one panel (see the module docstring)."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self._lock = threading.Lock()

    def add(self, study: Any, *, launched: bool) -> int:
        """Step 1: ``study`` joins (once; a study already shown keeps its place). Returns its
        number among the shown studies (1 = the first)."""
        with self._lock:
            for number, entry in enumerate(self._entries, start=1):
                if entry.study is study:
                    return number
            number = len(self._entries) + 1
            name = getattr(study, "study_id", None)
            title = f"study {number}" + (f" ({name})" if name else "") + ("" if launched else ", overlaid")
            self._entries.append(_Entry(study, title, launched))
            return number

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, study: Any) -> bool:
        return any(entry.study is study for entry in self._entries)

    def numbered(self) -> list[tuple[int, Any, bool]]:
        """``(number, study, launched)`` of every shown study, oldest first."""
        with self._lock:
            return [(n, e.study, e.launched) for n, e in enumerate(self._entries, start=1)]

    def _shown(self, entry: _Entry) -> ShownStudy:
        if entry.ended is not None:
            return entry.ended
        ended = bool(entry.study.done())  # read before the frames: a study ending meanwhile is read again
        shown = shown_study(entry.study, entry.title)
        if ended:
            entry.ended = shown  # step 3
        return shown

    def figures(self, time: str = "virtual") -> tuple[go.Figure, go.Figure]:
        """Step 2: ``(efficiency, convergence)`` of every shown study."""
        with self._lock:
            entries = list(self._entries)
        shown = [self._shown(entry) for entry in entries]
        if len(shown) == 1:  # one study: no group title to read
            shown = [ShownStudy(shown[0].points, shown[0].metrics, shown[0].status, shown[0].key, "")]
        return scaling_studies_figure(shown, time), convergence_studies_figure(shown)
