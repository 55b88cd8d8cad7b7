"""The pieces of fault handling on their own (no cluster): the rank watchdog, failure
causes, the client's scheduler watch, lost-worker causes, restart bookkeeping of a
RunHandle, the failure-policy fields of RunConfig, and the ``__main__`` guard check (one
subprocess that runs an unguarded script)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from gtopk_lab.config import POLICY_FIELDS, RunConfig
from gtopk_lab.orchestration import faults
from gtopk_lab.orchestration.handle import RunHandle
from gtopk_lab.orchestration.results import config_hash
from gtopk_lab.orchestration.script_guard import guarded_spans
from gtopk_lab.worker.faults import (
    HARD_STOP_EXIT_CODE, SchedulerLost, SchedulerWatchdog, WorkerClosing, failure_cause,
    scheduler_contact)


class FakeComm:
    def __init__(self) -> None:
        self.is_closed = False

    def closed(self) -> bool:
        return self.is_closed


class FakeWorker:
    """What the watchdog reads of a distributed.Worker: status.value, batched_stream.comm."""

    def __init__(self) -> None:
        self.status = type("S", (), {"value": "running"})()
        self.batched_stream = type("B", (), {})()
        self.batched_stream.comm = FakeComm()

    def set_status(self, value: str) -> None:
        self.status = type("S", (), {"value": value})()


@pytest.mark.timeout(20)
def test_watchdog_stops_a_rank_whose_worker_closes_at_the_next_sink_call():
    worker = FakeWorker()
    dog = SchedulerWatchdog(worker, timeout_s=60, interval_s=0.05, label="rank 1").start()
    try:
        dog.check()  # all well: nothing raised
        assert scheduler_contact(worker) == ("ok", "")
        worker.set_status("closing")
        with pytest.raises(WorkerClosing, match=r"rank 1: its Dask worker is shutting down \(worker status closing\)"):
            dog.check()  # at once, not after timeout_s
        assert dog.tripped
    finally:
        dog.stop()


@pytest.mark.timeout(20)
def test_watchdog_trips_after_timeout_without_a_stream_and_forgives_a_short_gap():
    worker, now = FakeWorker(), [0.0]
    dog = SchedulerWatchdog(worker, timeout_s=10, interval_s=3600, clock=lambda: now[0])
    worker.batched_stream.comm.is_closed = True
    dog.check()
    now[0] = 9.0
    dog.check()  # 9 s < 10 s: still training
    worker.batched_stream.comm.is_closed = False
    dog.check()  # contact is back: the clock starts again
    worker.batched_stream.comm.is_closed = True
    now[0] = 15.0
    dog.check()
    now[0] = 25.5
    with pytest.raises(SchedulerLost, match=r"for 10 s >= scheduler_timeout_s=10"):
        dog.check()


@pytest.mark.timeout(20)
def test_watchdog_thread_trips_and_ends_a_stuck_rank_but_not_a_stopped_one():
    for stops in (False, True):
        worker, exits = FakeWorker(), []
        ended = threading.Event()

        def hard_stop(code: int) -> None:
            exits.append(code)
            ended.set()

        dog = SchedulerWatchdog(worker, timeout_s=60, interval_s=0.02, hard_stop_after_s=0.2,
                                hard_stop=hard_stop).start()
        worker.set_status("closed")
        deadline = time.monotonic() + 5
        while not dog.tripped and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dog.tripped  # the thread saw it without any sink call
        if stops:
            dog.stop()  # the rank ended in time
        dog.join(5)
        assert exits == ([] if stops else [HARD_STOP_EXIT_CODE])


def test_failure_causes_name_memory_peers_and_the_watchdog():
    assert failure_cause(MemoryError()) == "out of memory"
    assert failure_cause(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")) == "out of memory"
    assert failure_cause(RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: "
                                      "can't allocate memory: you tried to allocate 1073741824 bytes")) \
        == "out of memory"
    assert failure_cause(RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                                      "[127.0.0.1]:2967")) == "peer lost"
    assert failure_cause(SchedulerLost("x")) == "scheduler lost"
    assert failure_cause(WorkerClosing("x")) == "worker closing"
    assert failure_cause(FloatingPointError("nan")) == "error"


def test_scheduler_watch_waits_for_a_reconnect_then_gives_up_with_one_reason():
    client = type("C", (), {"status": "running", "scheduler": type("R", (), {"address": "tcp://h:1"})()})()
    now = [0.0]
    watch = faults.SchedulerWatch(client, timeout_s=60, clock=lambda: now[0])
    assert watch.address == "tcp://h:1" and watch.grace_s == faults.SCHEDULER_GRACE_S
    assert watch.check() is None and watch.connected
    client.status = "connecting"
    assert watch.check() is None and not watch.connected  # reconnecting: wait
    now[0] = 29.0
    assert watch.check() is None
    now[0] = 30.5
    assert watch.check() == "no reconnect within 30 s"
    client.status = "running"  # it came back
    assert watch.check() is None and watch.lost_for_s() == 0.0
    client.status = "closed"  # the client gave up on its own (its connect timeout)
    assert watch.check() == "the Dask client gave up reconnecting and is closed"
    config = RunConfig(method="dense", workers=2, checkpoint=True, run_id="r1")
    line = faults.unreachable_message("tcp://h:1", "x", config, "res")
    assert line.startswith("scheduler tcp://h:1 unreachable (x)") and "\n" not in line
    assert "epoch checkpoints in res/r1" in line and "gtopk-lab run --resume r1 --out res" in line


def test_lost_worker_cause_reads_the_scheduler_event_log():
    class Events:
        def __init__(self, log: dict) -> None:
            self.log = log

        def get_events(self, topic: str):
            return tuple(self.log.get(topic, ()))

    addr = "tcp://127.0.0.1:1"
    memory = Events({"worker-restart-memory": [(1.0, {"worker": addr, "rss": 3 * 2**30})]})
    assert faults.lost_worker_cause(memory, addr, None)[0] == "out of memory"
    left = Events({addr: [(1.0, {"action": "add-worker"}),
                          (2.0, {"action": "closing-worker", "reason": "signal-15"})]})
    cause, detail = faults.lost_worker_cause(left, addr, None)
    assert cause == "worker left" and "reason signal-15 (SIGTERM)" in detail
    info = {"metrics": {"memory": 900 * 2**20}, "memory_limit": 1000 * 2**20}
    cause, detail = faults.lost_worker_cause(Events({}), addr, info)
    assert cause == "killed" and "OOM killer" in detail and "900 MiB of its 1000 MiB" in detail


class _Owner:
    def _post(self, fn) -> None:
        fn()

    def _cancel(self, handle) -> None:
        pass


def test_a_restarted_handle_keeps_rows_before_its_checkpoint_and_drops_late_rows():
    """Rows before the checkpoint stay; those after it stay too until the next start sends
    its own (issue 30: nothing lost if that start fails first); the old start's late batches
    are dropped by their rendezvous key; a completed run keeps no row it did not redo."""
    handle = RunHandle(_Owner(), RunConfig(method="dense", workers=2, run_id="r", max_restarts=1), 10)
    handle.mark_started(["a", "b"])
    old_key = handle.rendezvous_key
    rows = [{"kind": "iter", "rank": r, "iteration": i, "start": 1} for r in (0, 1) for i in range(6)]
    handle.on_event((0.0, {"key": old_key, "rows": rows + [{"kind": "epoch", "rank": 0, "iteration": 4, "start": 1}]}))
    assert len(handle.metrics) == 13
    handle.prepare_restart(4)  # the checkpoint after iteration 4
    assert handle.resume and handle.summary_extra["restart_iterations"] == [4]
    assert len(handle.metrics) == 13  # nothing dropped yet

    def start_of(kind, rank, iteration):
        m = handle.metrics
        return int(m[(m["kind"] == kind) & (m["rank"] == rank) & (m["iteration"] == iteration)]["start"].iloc[0])

    handle.mark_started(["a", "c"])
    late = [{"kind": "iter", "rank": 1, "iteration": 5, "start": 1}]
    handle.on_event((0.0, {"key": old_key, "rows": late}))  # the old start's last batch: dropped
    assert len(handle.metrics) == 13 and start_of("iter", 1, 5) == 1
    redone = [{"kind": "iter", "rank": r, "iteration": i, "start": 2} for r in (0, 1) for i in (4, 5)]
    handle.on_event((0.0, {"key": handle.rendezvous_key, "rows": redone + [
        {"kind": "iter", "rank": 0, "iteration": 0, "start": 2}]}))  # a kept row is not replaced
    assert len(handle.metrics) == 13
    assert start_of("iter", 1, 5) == 2 and start_of("iter", 0, 4) == 2 and start_of("iter", 0, 0) == 1
    assert start_of("epoch", 0, 4) == 1  # the checkpointed epoch's own row is kept
    handle.prepare_restart(None)  # no checkpoint: from iteration 0, every row provisional
    assert not handle.resume and len(handle.metrics) == 13


def test_failure_policy_fields_are_validated_and_not_hashed():
    base = RunConfig(method="dense", workers=2)
    assert POLICY_FIELDS == ("max_restarts", "scheduler_timeout_s")
    assert config_hash(base) == config_hash(base.replace(max_restarts=3, scheduler_timeout_s=5.0))
    old_style = {k: v for k, v in base.to_dict().items() if k not in POLICY_FIELDS}
    assert config_hash(old_style) == config_hash(base)  # runs stored before the fields existed
    for field, value in (("max_restarts", -1), ("scheduler_timeout_s", 0.0),
                         ("scheduler_timeout_s", float("inf")), ("scheduler_timeout_s", float("nan"))):
        with pytest.raises(ValueError, match=rf"^{field}="):
            base.replace(**{field: value})
    with pytest.raises(TypeError, match=r"^max_restarts=1.5"):
        base.replace(max_restarts=1.5)


def test_guarded_spans_find_main_guards_in_any_form():
    source = ("import x\n"                                   # 1
              "try:\n"                                       # 2
              "    if __name__ == '__main__':\n"             # 3
              "        main()\n"                             # 4
              "except KeyboardInterrupt:\n"                  # 5
              "    pass\n"                                   # 6
              "if '__main__' == __name__ and True:\n"        # 7
              "    run()\n"                                  # 8
              "    more()\n"                                 # 9
              "if name == '__main__':\n"                     # 10: not the guard
              "    other()\n")
    assert guarded_spans(source) == [(4, 4), (8, 9)]


@pytest.mark.timeout(120)
def test_a_script_without_main_guard_ends_with_one_line(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("from gtopk_lab.orchestration import Lab\n\nlab = Lab(n_workers=1)\nprint('unreachable')\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=110,
                          cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("gtopk-lab: Lab() at line 3 of train.py runs again in every worker process")
    assert 'add `if __name__ == "__main__":`' in lines[0]


class _LateCancelSink:
    """An EventSink stand-in whose run's cancellation reaches this worker at its
    ``after_calls``-th look (never when None); counts the looks."""

    run_id, rank = "r1", 0

    def __init__(self, after_calls: int | None) -> None:
        self.after_calls, self.calls = after_calls, 0

    def cancelled(self) -> bool:
        self.calls += 1
        return self.after_calls is not None and self.calls >= self.after_calls


@pytest.mark.timeout(30)
def test_a_rank_whose_peer_left_a_cancelled_run_reports_the_cancellation() -> None:
    from gtopk_lab.worker.rank_task import CANCEL_GRACE_S, RunCancelled, _as_cancellation

    closed = RuntimeError("[pair.cc:534] Connection closed by peer [127.0.0.1]:4242")
    late = _LateCancelSink(after_calls=4)
    seen = _as_cancellation(closed, late)
    assert isinstance(seen, RunCancelled) and "Connection closed by peer" in str(seen)
    assert late.calls == 4  # it kept looking until the cancellation arrived, then stopped
    assert failure_cause(seen) == "cancelled"
    # a peer lost in a run nobody cancelled stays a peer failure, after the grace period
    started = time.monotonic()
    assert _as_cancellation(closed, _LateCancelSink(None)) is closed
    assert time.monotonic() - started >= CANCEL_GRACE_S
    # other errors are never waited on nor renamed: the sink is not even asked
    other, never = ValueError("bad"), _LateCancelSink(None)
    assert _as_cancellation(other, never) is other and never.calls == 0
    assert _as_cancellation(closed, None) is closed
