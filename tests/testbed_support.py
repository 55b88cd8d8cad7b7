"""Helpers the testbed and network-fault tests share (not a test module).

What the host's own namespace shows (to assert a testbed left nothing behind), whether a
process is alive, the environment a testbed run starts with (no interface pinned: ranks
must find their own), and a polling wait with a deadline.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]


def root_view() -> dict[str, object]:
    """What the host's own namespace shows: namespaces, links, the testbed routes."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    routes = subprocess.run(["ip", "route", "show", "table", "all", "proto", "77"], capture_output=True,
                            text=True).stdout
    return {"netns": sorted(line.split()[0] for line in netns.splitlines() if line.strip()),
            "links": sorted(line.split(":")[1].strip() for line in links.splitlines()),
            "routes": routes.strip()}


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie is not alive)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().split(b") ", 1)[-1][:1] != b"Z"
    except OSError:
        return False


def run_env() -> dict[str, str]:
    """This environment without GLOO/NCCL_SOCKET_IFNAME, with the repository importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, step_s: float = 0.2) -> Any:
    """Poll ``condition`` until it is truthy (returned) or ``timeout_s`` passed (assertion naming ``what``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} after {timeout_s:.0f} s"
        time.sleep(step_s)
