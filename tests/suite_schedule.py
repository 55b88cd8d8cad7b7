"""How the suite's test files are spread over pytest-xdist processes (not a test module).

``make test`` runs ``-n 3 --dist loadfile`` (Makefile JOBS): one test file at a time per process. Two rules
are added to pytest-xdist's own (``tests/conftest.py`` installs them):

1. **The testbed files run in one process, one after the other** (``SHARED_SCOPES``). Each
   asserts that the host's namespace (namespaces, links, the testbed's guard route) reads
   the same before and after its testbed; another file's testbed coming up or going down
   in between, in the other process, would break that.
2. **The longest work first.** pytest-xdist orders files by their number of tests, so the
   long integration files (a few tests of tens of seconds each) came last, and one process
   idled while the other finished them. Here files run in descending order of the seconds
   they took in a recorded suite (``file_seconds.json``: per file, the junit ``time`` of its
   tests, setup and teardown included), files not recorded after them in collection order.
   This is the longest-processing-time rule: with the long files first the processes
   end within about one short file of each other.

Refresh the record after large changes: ``pytest -n 3 --dist loadfile --junitxml=j.xml``,
then ``python tests/suite_schedule.py j.xml > tests/file_seconds.json``. A stale record only
costs balance; which tests run is unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("file_seconds.json")

#: files that must share one xdist process (rule 1), by the scope name they share
SHARED_SCOPES: dict[str, str] = {
    "tests/test_testbed.py": "testbed",
    "tests/test_network_faults.py": "testbed",
}


def file_of(nodeid: str) -> str:
    """The test file of a pytest node id (``tests/test_x.py::test_y[z]`` -> ``tests/test_x.py``)."""
    return nodeid.split("::", 1)[0]


def scope_of(nodeid: str) -> str:
    """The xdist work unit of a node id: its file, or the scope it shares (rule 1)."""
    path = file_of(nodeid)
    return SHARED_SCOPES.get(path, path)


def recorded_seconds(path: Path = RECORD) -> dict[str, float]:
    """Seconds per test file of the recorded suite ({} when there is no record)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.get("seconds", {}).items()}


def longest_first(nodeids: Sequence[str], seconds: dict[str, float]) -> list[int]:
    """The order (indices into ``nodeids``) that runs work units longest first (rule 2).

    A unit's cost is the sum of its files' recorded seconds; ties and unrecorded units keep
    collection order (a stable sort), and every unit's tests stay in their own order."""
    cost: Counter[str] = Counter()
    first: dict[str, int] = {}
    for i, nodeid in enumerate(nodeids):
        unit = scope_of(nodeid)
        first.setdefault(unit, i)
    for path in {file_of(n) for n in nodeids}:
        cost[scope_of(path)] += seconds.get(path, 0.0)
    units = sorted(first, key=lambda u: (-cost[u], first[u]))
    rank = {u: r for r, u in enumerate(units)}
    return sorted(range(len(nodeids)), key=lambda i: (rank[scope_of(nodeids[i])], i))


def make_scheduler(config: Any, log: Any) -> Any:
    """pytest-xdist's file scheduler with rules 1 and 2 (``--dist loadfile`` only)."""
    from xdist.scheduler import LoadFileScheduling

    class TestbedTogetherLongestFirst(LoadFileScheduling):
        def __init__(self, config: Any, log: Any = None) -> None:
            super().__init__(config, log)
            # the collection arrives ordered longest first (conftest); keep that order
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return TestbedTogetherLongestFirst(config, log)


def record_from_junit(junit_xml: str, measured_on: str = "") -> dict[str, Any]:
    """Per test file, the summed junit ``time`` of its test cases (seconds, 0.1 s);
    ``measured_on`` (the CPU and commit) goes into the record's ``about``."""
    per: Counter[str] = Counter()
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        module = (case.get("classname") or "").rsplit(".", 1)[-1]
        per[f"tests/{module}.py"] += float(case.get("time") or 0.0)
    about = ("seconds per test file (junit time: setup, call and teardown of its tests) in one suite"
             + (f", {measured_on}" if measured_on else "") + "; the order tests/suite_schedule.py runs files in")
    return {"about": about, "seconds": {k: round(v, 1) for k, v in sorted(per.items())}}


def _measured_on() -> str:
    """This machine's CPU model and core count, and the repository's commit (each if known)."""
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), "")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    return ", ".join(filter(None, [f"{cpu} {os.cpu_count()} cores" if cpu else "", f"commit {commit}" if commit else ""]))


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


if __name__ == "__main__":
    print(json.dumps(record_from_junit(sys.argv[1], _measured_on()), indent=1))
