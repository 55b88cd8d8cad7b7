"""The suite's file schedule (tests/suite_schedule.py): the testbed files share one xdist
work unit, units run longest first, and each unit's tests keep their order. The oracle is
written out by hand for a small collection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import suite_schedule as sched

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(10)
def test_units_run_longest_first_with_the_testbed_files_in_one_unit() -> None:
    ids = ["tests/test_a.py::x", "tests/test_a.py::y", "tests/test_network_faults.py::down",
           "tests/test_b.py::z", "tests/test_testbed.py::up", "tests/test_testbed.py::p4",
           "tests/test_new.py::w", "tests/test_b.py::v"]
    seconds = {"tests/test_a.py": 5.0, "tests/test_b.py": 30.0, "tests/test_network_faults.py": 20.0,
               "tests/test_testbed.py": 15.0}
    order = [ids[i] for i in sched.longest_first(ids, seconds)]
    # testbed 20 + 15 = 35 s, then b 30 s, then a 5 s, then the unrecorded file
    assert order == ["tests/test_network_faults.py::down", "tests/test_testbed.py::up", "tests/test_testbed.py::p4",
                     "tests/test_b.py::z", "tests/test_b.py::v", "tests/test_a.py::x", "tests/test_a.py::y",
                     "tests/test_new.py::w"]
    assert sched.scope_of("tests/test_testbed.py::p4[x::y]") == sched.scope_of("tests/test_network_faults.py::down")
    assert sched.scope_of("tests/test_b.py::z[a]") == "tests/test_b.py"
    # without a record: collection order, units still contiguous
    assert [ids[i] for i in sched.longest_first(ids, {})][:3] == ["tests/test_a.py::x", "tests/test_a.py::y",
                                                                  "tests/test_network_faults.py::down"]


@pytest.mark.timeout(10)
def test_the_record_names_existing_files_and_every_shared_file_exists(tmp_path: Path) -> None:
    for path in sched.SHARED_SCOPES:
        assert (ROOT / path).is_file(), path
    seconds = sched.recorded_seconds()
    assert seconds and all((ROOT / path).is_file() for path in seconds), sorted(p for p in seconds
                                                                               if not (ROOT / p).is_file())
    assert sched.recorded_seconds(tmp_path / "missing.json") == {}
    junit = tmp_path / "j.xml"
    junit.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="x" time="1.25"/>'
                     '<testcase classname="tests.test_a" name="y" time="2"/>'
                     '<testcase classname="tests.test_b" name="z" time="0.5"/></testsuite></testsuites>')
    record = sched.record_from_junit(str(junit))
    assert record["seconds"] == {"tests/test_a.py": 3.2, "tests/test_b.py": 0.5}
    (tmp_path / "r.json").write_text(json.dumps(record))
    assert sched.recorded_seconds(tmp_path / "r.json") == {"tests/test_a.py": 3.2, "tests/test_b.py": 0.5}
