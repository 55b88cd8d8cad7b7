"""The ControlPanel's run lines: one line per run of every study it shows, grouped by study.

:func:`study_lines_html` of ``(number, study, launched)`` triples (``PanelStudies.numbered``):

1. studies newest on top, each headed by its number, its point count by status and its id
   (an overlaid study says so);
2. under it one line per point: a status mark, method, P, density (for a method that
   selects), link, seed, source, status (``(stored)`` when a completed run was reused),
   rows received, and why a queued run waits;
3. coloured by status, monospace, HTML-escaped.

Cost: one ``study.status()`` per study. Client side only.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

import pandas as pd

from gtopk_lab.plotting.runs_table import selects

__all__ = ["study_lines_html"]

_STATUS_COLOR = {"completed": "#2e7d32", "running": "#1565c0", "queued": "#757575",
                 "failed": "#b00020", "cancelled": "#e65100", "crashed": "#6a1b9a"}
_STATUS_MARK = {"completed": "✓", "running": "▶", "queued": "…", "failed": "✗", "cancelled": "■",
                "crashed": "⚠"}


def study_lines_html(numbered: Iterable[tuple[int, Any, bool]]) -> str:
    """Steps 1-3 of the module docstring (``<i>no study launched yet</i>`` for none)."""
    blocks = []
    for number, study, launched in reversed(list(numbered)):  # newest on top
        status = study.status()
        counts = status["status"].str.replace(" (stored)", "", regex=False).value_counts()
        summary = ", ".join(f"{n} {s}" for s, n in counts.items())
        name = getattr(study, "study_id", None)
        lines = [f"<b>study {number}</b>{'' if launched else ' (overlaid)'}: {len(status)} point(s): "
                 f"{html.escape(summary)}" + (f"  [study {html.escape(str(name))}]" if name else "")]
        for row in status.itertuples():
            state = str(row.status).replace(" (stored)", "")
            stored = " (stored)" if str(row.status).endswith("(stored)") else ""
            density = f" ρ={row.density:g}" if selects(row.method) else ""
            network = str(row.bandwidth) + (f", {row.latency}" if row.latency else "")
            rows = "" if row.rows is None or pd.isna(row.rows) else f", {int(row.rows)} rows"
            reason = getattr(row, "queue_reason", None)
            if state == "queued" and isinstance(reason, str):  # e.g. workers another client holds
                rows += f" ({reason})"
            text = (f"{_STATUS_MARK.get(state, '·')} {row.method} P={row.workers}{density} {network} "
                    f"seed {row.seed} {row.source}: {state}{stored}{rows}  [{row.run_id}]")
            lines.append(f"<span style='color:{_STATUS_COLOR.get(state, '#333')}'>{html.escape(text)}</span>")
        blocks.append("<br>".join(lines))
    return ("<div style='font-family:monospace;font-size:12px;line-height:1.35'>"
            + "<hr style='margin:2px 0'>".join(blocks) + "</div>") if blocks else "<i>no study launched yet</i>"
