"""The runs table of the ControlPanel: readable columns, sortable and filterable with itables.

Why itables (``itables.widget.ITable``, an anywidget over DataTables) rather than
ipydatagrid: both sort and filter, but the same itables table also renders without a kernel
(``itables.to_html_datatable`` with its offline DataTables bundle, in exported notebooks;
the HTML report keeps plain ``DataFrame.to_html`` tables), its widget builds on anywidget, which gtopk-lab already depends on (no extra
JupyterLab extension to install), and it is actively maintained (2.x releases through
2026); ipydatagrid needs its own front-end extension and a live kernel to show anything.

- :func:`runs_frame`: one row per run of ``lab.runs()`` with short, readable columns (P,
  source, network, test accuracy, samples/s), statuses of runs still going taken from their
  live handles (a stored summary says "queued" until the run ends), why a queued run waits
  ("waiting for": e.g. workers held by another client's runs); grouped by study (its id
  first, then any other study that reused the run; its tags), a study where its first run
  was submitted, newest last so that a new run never moves the rows a person selected
- :func:`compare_frame`: selected runs side by side, one column per run
- :func:`runs_table_widget`: the live widget (click-to-sort headers, a search box,
  per-column filters in the footer, row selection for *compare*)

Client side only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from gtopk_lab.network.model import format_bandwidth
from gtopk_lab.orchestration.run_identity import study_order

__all__ = ["RUN_COLUMNS", "runs_frame", "compare_frame", "runs_table_widget", "update_runs_table",
           "TABLE_OPTIONS", "selects"]

#: Columns of the table, in order (``run_id`` last: long, but what a person copies).
RUN_COLUMNS: tuple[str, ...] = ("study", "status", "method", "P", "source", "density", "network", "seed",
                                "iterations", "test acc", "samples/s virtual", "waiting for", "tags", "run_id")
#: DataTables options: multi-row selection by click; click-to-sort headers, each with a
#: search menu (ColumnControl) to filter that column; a search box and page controls even
#: for a few rows (itables hides its default layout on tables that fit one page, and this
#: one grows while a study runs); a horizontal scroll bar rather than cut columns.
TABLE_OPTIONS: dict[str, Any] = {
    "select": {"style": "multi"}, "pageLength": 10, "lengthMenu": [10, 25, 100], "showIndex": False,
    "layout": {"topStart": "search", "topEnd": "pageLength", "bottomStart": "info", "bottomEnd": "paging"},
    "columnControl": ["searchDropdown"], "scrollX": True,
    "classes": "display compact nowrap", "maxBytes": 0}


def _network(row: dict[str, Any]) -> str:
    """The link as the person typed it (``1GbE``, ``1Gbps, 40ms``), else from the numbers."""
    typed, latency = row.get("bandwidth"), row.get("latency")
    if isinstance(typed, str) and typed and not typed.lstrip().startswith("{"):
        text = "unthrottled" if typed.lower() in ("none", "unthrottled") else typed
        return text + (f", {latency}" if isinstance(latency, str) and latency else "")
    bandwidth = row.get("bandwidth_bps")
    if _blank(bandwidth) or math.isinf(float(bandwidth)):
        return "unthrottled"
    text = format_bandwidth(float(bandwidth))
    if not _blank(row.get("latency_s")):
        text += f", {float(row['latency_s']) * 1e6:g} us"
    return text


def selects(method: Any) -> bool:
    """Whether ``method`` selects entries (a density means something for it), from the
    method registry; an unknown name (a plugin not loaded here) is shown as if it did."""
    from gtopk_lab.methods import is_dense

    return not is_dense(str(method))


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def runs_frame(summaries: pd.DataFrame, live: pd.DataFrame | None = None) -> pd.DataFrame:
    """The table's rows from ``lab.runs()`` (and ``live``: run_id, status, seed, source of
    runs the panel follows, e.g. ``Study.status()``); columns :data:`RUN_COLUMNS`."""
    live_by_id = {}
    if live is not None and len(live) and "run_id" in live.columns:
        live_by_id = {str(r["run_id"]): r for r in live.to_dict("records") if not _blank(r.get("run_id"))}
    records = []
    order = study_order(summaries).to_dict("records") if len(summaries) else []
    seen = set()
    for row in order:
        run_id = str(row.get("run_id"))
        seen.add(run_id)
        now = live_by_id.get(run_id, {})
        status = str(now.get("status") or row.get("status") or "")
        accuracy = row.get("final_test_accuracy")
        speed = row.get("samples_per_s_virtual")
        density = row.get("density")
        source = now.get("source") or row.get("source") or ("simulated" if row.get("simulated") else "real")
        seed = now.get("seed")
        reason = now.get("queue_reason") if now else row.get("queue_reason")
        records.append({
            "study": _studies(row.get("study_id") or now.get("study_id"), row.get("study_ids")),
            "status": status.replace(" (stored)", ""),
            "method": row.get("method"), "P": _int(row.get("workers")), "source": source,
            "density": "" if _blank(density) or not selects(row.get("method")) else f"{float(density):g}",
            "network": _network(row), "seed": "" if _blank(seed) else int(seed),
            "iterations": "" if status != "completed" else _int(row.get("iterations")),
            "test acc": "" if _blank(accuracy) or status != "completed" else f"{100 * float(accuracy):.1f}%",
            "samples/s virtual": "" if _blank(speed) or status != "completed" else round(float(speed), 1),
            "waiting for": _reason(status, reason), "tags": _words(row.get("tags")), "run_id": run_id})
    for run_id, now in live_by_id.items():  # submitted, summary not readable yet
        if run_id not in seen:
            records.append({"study": _studies(now.get("study_id"), None),
                            "status": str(now.get("status")), "method": now.get("method"),
                            "P": _int(now.get("workers")), "source": now.get("source"),
                            "density": "", "network": _network(now),
                            "seed": "" if _blank(now.get("seed")) else int(now["seed"]),
                            "iterations": "", "test acc": "", "samples/s virtual": "",
                            "waiting for": _reason(str(now.get("status")), now.get("queue_reason")),
                            "tags": "", "run_id": run_id})
    return pd.DataFrame.from_records(records, columns=list(RUN_COLUMNS))


def _studies(first: Any, ids: Any) -> str:
    """The run's study, then every other study that reused it: ``"s1, s2"``."""
    names = [first] if isinstance(first, str) else []
    names += [s for s in (ids if isinstance(ids, (list, tuple)) else ()) if isinstance(s, str) and s not in names]
    return ", ".join(names)


def _words(value: Any) -> str:
    return ", ".join(t for t in value if isinstance(t, str)) if isinstance(value, (list, tuple)) else ""


def _reason(status: str, reason: Any) -> str:
    """What a queued run waits for, without the leading "waiting for " ("" otherwise)."""
    if status != "queued" or not isinstance(reason, str):
        return ""
    return reason.removeprefix("waiting for ")


def _int(value: Any) -> Any:
    return "" if _blank(value) else int(value)


#: Rows of the side-by-side comparison: (label, summary key, format).
_COMPARE_ROWS: tuple[tuple[str, str, str], ...] = (
    ("method", "method", "{}"), ("P", "workers", "{}"), ("source", "source", "{}"),
    ("density", "density", "{:g}"), ("k", "k", "{}"), ("network", "network", "{}"),
    ("status", "status", "{}"), ("iterations", "iterations", "{}"),
    ("final train loss", "final_train_loss", "{:.4f}"),
    ("final test accuracy", "final_test_accuracy", "{:.1%}"),
    ("samples/s (virtual)", "samples_per_s_virtual", "{:.1f}"),
    ("samples/s (wall)", "samples_per_s_wall", "{:.1f}"),
    ("compute s/iter", "time_compute_s", "{:.2e}"), ("selection s/iter", "time_selection_s", "{:.2e}"),
    ("communication s/iter", "time_communication_s", "{:.2e}"),
    ("bytes sent/rank/iter", "bytes_sent_per_rank_per_iter", "{:,.0f}"),
    ("virtual time s", "virtual_time_s", "{:.3g}"), ("wall time s", "wall_time_s", "{:.3g}"))


def compare_frame(summaries: pd.DataFrame, run_ids: Sequence[str]) -> pd.DataFrame:
    """``run_ids`` side by side: one row per field, one column per run (in the given order)."""
    by_id = {str(r["run_id"]): r for r in summaries.to_dict("records")} if len(summaries) else {}
    columns = {}
    for run_id in run_ids:
        row = by_id.get(str(run_id))
        if row is None:
            continue
        values = []
        for _label, key, fmt in _COMPARE_ROWS:
            value = _network(row) if key == "network" else row.get(key)
            try:
                values.append("" if _blank(value) else fmt.format(value))
            except (ValueError, TypeError):
                values.append(str(value))
        name = f"{row.get('method')} P={_int(row.get('workers'))} [{str(run_id)[-4:]}]"
        columns[name if name not in columns else f"{name} {run_id}"] = values
    return pd.DataFrame(columns, index=[label for label, _, _ in _COMPARE_ROWS])


def runs_table_widget(frame: pd.DataFrame, **options: Any) -> Any:
    """An ``itables.widget.ITable`` of ``frame`` with :data:`TABLE_OPTIONS` (row selection
    in ``.selected_rows``, positions in ``frame``)."""
    from itables.widget import ITable

    return ITable(frame, **{**TABLE_OPTIONS, **options})


def update_runs_table(widget: Any, frame: pd.DataFrame, selected_rows: Sequence[int] = ()) -> None:
    """Show ``frame`` in a :func:`runs_table_widget`, keeping its options: ``ITable.update``
    recomputes itables' defaults (a layout without search box for a small table) and would
    otherwise replace them."""
    widget.update(frame, **{**TABLE_OPTIONS, "selected_rows": list(selected_rows)})
