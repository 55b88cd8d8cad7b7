"""Price saved ``benchmarks/tcp_model.py`` runs again with today's model (no testbed, no root).

Each JSON log keeps every call's rounds, per-rank CPU, I/O and peers, so a model change can be
judged on the calls already measured: for each file, the TCP terms are fitted again on its
P <= 4 sweep (as the run did) and every call predicted with the current
``gtopk_lab.network.tcp_fit`` (``tcp_model.fit_and_predict``, as the run itself); prints the
run's error table (``tcp_model_report.error_table``).

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/tcp_model_reprice.py benchmarks/logs/2026-12-07-tcp-model*.json

Cost: a second or so per file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tcp_model import fit_and_predict  # noqa: E402
from tcp_model_report import error_table  # noqa: E402

from gtopk_lab.network.model import NetworkModel  # noqa: E402
from gtopk_lab.testbed import parse_rate_bps  # noqa: E402


def reprice(path: Path) -> str:
    """The error table of the run in ``path`` under the current model."""
    run = json.loads(path.read_text())
    net, cores, rows = NetworkModel.from_dict(run["network"]), run["env"]["cores"], run["rows"]
    args = run.get("args", {})
    if "straggler_network" in run:
        slow = NetworkModel.from_dict(run["straggler_network"])
    else:  # a run from before the straggler's link was calibrated: beta times the rates' ratio, as it was priced
        ratio = (parse_rate_bps(args.get("rate", "200mbit"), "rate")
                 / parse_rate_bps(args.get("straggler_rate", "50mbit"), "straggler_rate"))
        slow = NetworkModel.from_alpha_beta(net.latency_s, net.beta_s_per_byte * ratio)
    fit_and_predict(rows, net, cores, slow)
    return error_table(rows)


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: tcp_model_reprice.py RUN.json [RUN.json ...]", file=sys.stderr)
        return 2
    for name in sys.argv[1:]:
        table = reprice(Path(name))
        print(f"# {name}\n" + table[table.index("| group |"):])
    return 0


if __name__ == "__main__":
    sys.exit(main())
