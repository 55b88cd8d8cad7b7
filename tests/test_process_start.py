"""Worker processes fork from a preloaded forkserver (gtopk_lab.comm.process_start) yet see
what a spawned process would: the caller's current environment and working directory,
for gloo ranks (run_gloo) and for the embedded LocalCluster's Dask workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from gtopk_lab.comm import launch, process_start
from gtopk_lab.comm.launch import LOCALHOST

SCRIPT = textwrap.dedent('''
    import json, os, sys
    from gtopk_lab.comm.launch import run_gloo
    from gtopk_lab.comm.process_start import process_context, start_method

    def probe(*_):
        return {"stale": os.environ.get("PROBE_STALE"), "fresh": os.environ.get("PROBE_FRESH"),
                "cwd": os.getcwd(), "omp": os.environ.get("OMP_NUM_THREADS")}

    if __name__ == "__main__":
        os.environ["PROBE_STALE"] = "set when the server started"
        process_context()
        del os.environ["PROBE_STALE"]
        os.environ["PROBE_FRESH"] = "set later"
        os.chdir(sys.argv[1])
        from gtopk_lab.orchestration import Lab
        ranks = run_gloo(probe, 2, timeout_s=60)
        with Lab(n_workers=1, progress=False) as lab:
            worker = lab.client.submit(probe, 0, pure=False).result(timeout=60)
        print(json.dumps({"method": start_method(), "ranks": ranks, "worker": worker}))
''')


@pytest.mark.timeout(120)
def test_forked_ranks_and_workers_see_the_callers_current_env_and_cwd(tmp_path: Path) -> None:
    script = tmp_path / "probe_start.py"
    script.write_text(SCRIPT)
    here = tmp_path / "here"
    here.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run([sys.executable, str(script), str(here)], capture_output=True, text=True,
                          timeout=110, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["method"] == "forkserver"
    for seen in [*out["ranks"], out["worker"]]:
        assert seen["stale"] is None and seen["fresh"] == "set later"
        assert Path(seen["cwd"]).resolve() == here.resolve()
    assert out["worker"]["omp"] == "1"  # Dask's pre-spawn variable still applies


def test_start_method_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTOPK_LAB_START_METHOD", "spawn")
    assert process_start.start_method() == "spawn"
    monkeypatch.setenv("GTOPK_LAB_START_METHOD", "fork")
    with pytest.raises(ValueError, match="GTOPK_LAB_START_METHOD"):
        process_start.start_method()
    monkeypatch.delenv("GTOPK_LAB_START_METHOD")
    assert process_start.start_method() == "forkserver"  # Linux has one


class _SlowToJoinStore(dist.Store):
    """A rank's rendezvous store whose first read of the others' keys waits ``delay_s``,
    as a rank descheduled on a loaded machine would: its peers must wait for it."""

    def __init__(self, inner: dist.Store, delay_s: float) -> None:
        super().__init__()
        self.inner, self.delay_s, self.delay_ended = inner, delay_s, None

    def _late(self) -> None:
        if self.delay_ended is None:
            time.sleep(self.delay_s)
            self.delay_ended = time.monotonic()

    def get(self, key):
        self._late()
        return self.inner.get(key)

    def wait(self, keys, timeout=None):
        self._late()
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def set(self, key, value):
        self.inner.set(key, value)

    def add(self, key, amount):
        return self.inner.add(key, amount)

    def check(self, keys):
        return self.inner.check(keys)

    def compare_set(self, key, expected, desired):
        return self.inner.compare_set(key, expected, desired)

    def delete_key(self, key):
        return self.inner.delete_key(key)

    def num_keys(self):
        return self.inner.num_keys()

    def set_timeout(self, timeout):
        return self.inner.set_timeout(timeout)


def _join_rank(rank: int, world_size: int, port: int, late_rank: int, delay_s: float, results) -> None:
    """One rank of the join test: rendezvous through run_gloo's join, report when it returned."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        timeout = timedelta(seconds=30)
        inner = dist.TCPStore(LOCALHOST, port, world_size, is_master=False, timeout=timeout)
        store = _SlowToJoinStore(inner, delay_s) if rank == late_rank else inner
        launch._join_process_group(store, rank, world_size, timeout)
        left = time.monotonic()
        dist.destroy_process_group()  # at once, as a rank that does not communicate would
        results.put((rank, left, getattr(store, "delay_ended", None)))
    except BaseException as exc:  # noqa: BLE001 - the test reports it
        results.put((rank, None, repr(exc)))


@pytest.mark.timeout(90)
def test_no_rank_leaves_the_rendezvous_before_a_late_rank_has_joined() -> None:
    """The load flake of run_gloo ("Gloo connectFullMesh failed ... Connection closed by
    peer"): a rank that connected to a slower peer could leave init_process_group, close its
    sockets and so break the peer's connect. Rank 0 here is late by 1 s (its store delays
    its first read of the others' addresses); with three prompt ranks, at least one connects
    to it as gloo's initiator in 7 of 8 starts and, without the join barrier, left at once.
    Every rank must leave only after rank 0 got past its delay, and all must succeed."""
    world_size, delay_s = 4, 1.0
    ctx = process_start.process_context()
    store = launch.master_store(LOCALHOST, None, timedelta(seconds=30))
    results = ctx.Queue()
    procs = [ctx.Process(target=_join_rank, args=(r, world_size, store.port, 0, delay_s, results), daemon=True)
             for r in range(world_size)]
    try:
        for p in procs:
            p.start()
        seen = {}
        for _ in range(world_size):
            rank, left, detail = results.get(timeout=60)
            seen[rank] = (left, detail)
        assert all(left is not None for left, _ in seen.values()), seen
        late_joined = seen[0][1]
        assert all(left >= late_joined for left, _ in seen.values()), seen
    finally:
        launch._stop(procs)
