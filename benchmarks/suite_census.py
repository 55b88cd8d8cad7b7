"""Where a command's CPU goes, by kind of process: a census for cutting the suite's time.

``python benchmarks/suite_census.py [--out census.json] -- COMMAND ...`` (default command:
the suite as ``make test`` runs it, ``-n 3 --dist loadfile``) runs COMMAND and, while it
runs, reads every process of the machine from ``/proc``:

1. Once a second, each process's own user + system CPU (``/proc/PID/stat`` fields 14-15,
   never its children's: a child reaped by a forkserver that nobody reaps would otherwise
   be lost, and one reaped by its parent counted twice) and, at first sight, its command
   line and parent. A process is keyed by (pid, start time), so a reused pid is a new one.
2. The machine's busy and idle jiffies (``/proc/stat``) at the start and the end: how busy
   the cores were.
3. At the end, processes that started before the command are dropped (their CPU is not
   the command's), the rest are sorted into kinds (forkserver, its forked workers and
   ranks, ``dask worker``, a ``gtopk-lab`` subcommand, kernel, Chromium, ...) and a table
   prints CPU seconds and processes per kind, and the CPU model.

What it misses: processes that live less than a second, and each process's last second.
Cost: one pass over ``/proc`` a second (a few ms of CPU with a few hundred processes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gtopk_lab.provenance import cpu_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadfile"]
TICK = os.sysconf("SC_CLK_TCK")


def machine_jiffies() -> tuple[int, int]:
    """(busy, idle) jiffies of all cores since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = values[3] + values[4]
    return sum(values) - idle, idle


def sample(seen: dict[tuple[int, int], list[Any]], me: int) -> None:
    """One pass over /proc (step 1): update each process's own CPU seconds."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
            fields = stat.rsplit(b") ", 1)[1].split()
            cpu_s = (int(fields[11]) + int(fields[12])) / TICK
            key = (int(name), int(fields[19]))
            if key in seen:
                seen[key][0] = cpu_s
            else:
                cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                seen[key] = [cpu_s, cmd[:300], int(fields[1])]
        except (OSError, IndexError, ValueError):
            continue  # gone between listing and reading


def kind_of(cmd: str, parent_cmd: str) -> str:
    """The kind of a process from its command line (step 3)."""
    if "forkserver import main" in cmd:
        return "forked worker/rank" if "forkserver import main" in parent_cmd else "forkserver"
    if "spawn_main" in cmd:
        return "spawned child (nanny worker)"
    if "exec(eval(sys.stdin" in cmd:
        return "pytest-xdist process"
    for word in ("dask worker", "dask scheduler", "ipykernel_launcher", "jupyter-lab", "jupyterlab"):
        if word in cmd:
            return word.replace("ipykernel_launcher", "ipykernel").replace("jupyter-lab", "jupyterlab")
    if "chromium" in cmd:
        return "chromium " + ("renderer" if "--type=renderer" in cmd else "other")
    found = re.search(r"(?:bin/gtopk-lab|gtopk_lab\.cli|gtopk_lab/cli/__main__\.py|-m gtopk_lab)\s+(\S+)", cmd)
    if found:
        return f"gtopk-lab {found.group(1)}"
    if not cmd.strip():
        return "(no command line: kernel thread or zombie)"
    return "other python" if "python" in cmd else "other"


def census(command: list[str]) -> dict[str, Any]:
    """Run ``command`` under the sampler (steps 1-3); returns the record."""
    seen: dict[tuple[int, int], list[Any]] = {}
    stop = threading.Event()
    me = os.getpid()

    def loop() -> None:
        while not stop.is_set():
            sample(seen, me)
            stop.wait(1.0)

    sample(seen, me)
    before = set(seen)
    busy0, idle0 = machine_jiffies()
    started = time.monotonic()
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        rc = subprocess.run(command, cwd=REPO).returncode
    finally:
        stop.set()
        thread.join()
    wall_s = time.monotonic() - started
    busy1, idle1 = machine_jiffies()
    commands = {pid: cmd for (pid, _), (_, cmd, _) in seen.items()}
    kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for key, (cpu_s, cmd, ppid) in seen.items():
        if key in before:
            continue
        entry = kinds[kind_of(cmd, commands.get(ppid, ""))]
        entry[0] += cpu_s
        entry[1] += 1
    return {"command": command, "rc": rc, "wall_s": round(wall_s, 1), "cpu": cpu_model(),
            "cores": os.cpu_count(), "busy_fraction": round((busy1 - busy0) / max(1, busy1 - busy0 + idle1 - idle0), 3),
            "kinds": {k: {"cpu_s": round(v[0], 1), "processes": v[1]}
                      for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0])}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the record as JSON here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command (default: the suite)")
    args = parser.parse_args(argv)
    command = [c for c in args.command if c != "--"] or DEFAULT
    record = census(command)
    total = sum(v["cpu_s"] for v in record["kinds"].values())
    print(f"{record['cpu']}, {record['cores']} cores; {' '.join(command)}")
    print(f"wall {record['wall_s']} s, cores busy {record['busy_fraction']:.0%}; "
          f"CPU of the processes it started: {total:.0f} s (exit status {record['rc']})")
    print(f"{'kind':<44} {'CPU s':>8} {'processes':>10}")
    for kind, v in record["kinds"].items():
        print(f"{kind:<44} {v['cpu_s']:>8.1f} {v['processes']:>10}")
    if args.out:
        args.out.write_text(json.dumps(record, indent=1))
    return int(record["rc"] != 0)


if __name__ == "__main__":
    sys.exit(main())
