"""Worker processes fork from a preloaded forkserver (gtopk_lab.comm.process_start) yet see
what a spawned process would: the caller's current environment and working directory,
for gloo ranks (run_gloo) and for the embedded LocalCluster's Dask workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gtopk_lab.comm import process_start

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
