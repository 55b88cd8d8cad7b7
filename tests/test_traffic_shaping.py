"""Real traffic shaping with cluster/shape-traffic.sh and cluster/entrypoint.sh.

Each test runs in a network namespace of its own (``unshare -n``, root only), so shaping
its loopback touches nothing else on the machine. The shaped test runs a real gloo dense
allreduce (``gtopk_lab.collectives.dense_allreduce``, 2 ranks) of a known size over the
shaped ``lo`` and checks that it takes at least the time the bandwidth implies.

On loopback both ranks share ONE shaped link (every packet leaves through ``lo``), so the
bound is computed from the bytes of both ranks together. Skipped with a reason where
``unshare``, ``tc`` or the tbf qdisc are unavailable (CI installs iproute2 via .ci/run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHAPER = REPO / "cluster" / "shape-traffic.sh"
ENTRYPOINT = REPO / "cluster" / "entrypoint.sh"

RATE_BITS_PER_S = 200_000_000  # 200mbit, the tbf rate of the shaped test
NUMEL = 2_000_000  # fp32 elements: 8 MB per rank


def _netns_problem() -> str | None:
    """Why shaping in a private network namespace cannot run here, or None if it can."""
    if sys.platform != "linux":
        return "traffic shaping needs Linux"
    if os.geteuid() != 0:
        return "unshare -n and tc need root"
    for tool in ("unshare", "tc", "ip", "bash"):
        if shutil.which(tool) is None:
            return f"'{tool}' not found (install iproute2 / util-linux)"
    probe = ("ip link set lo up && tc qdisc add dev lo root tbf rate 200mbit burst 256kb "
             "latency 1000ms && tc qdisc show dev lo")
    try:
        res = subprocess.run(["unshare", "-n", "bash", "-c", probe], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare -n failed: {exc}"
    if res.returncode != 0 or "tbf" not in res.stdout:
        return f"cannot add a tbf qdisc in a new network namespace: {res.stderr.strip()[:200]}"
    return None


@pytest.fixture(scope="session")
def netns() -> None:
    """Skip (with the reason) unless a private network namespace with tbf is available.

    A fixture rather than a module-level probe: the spawned gloo ranks import this file,
    and they must not start probes of their own.
    """
    problem = _netns_problem()
    if problem is not None:
        pytest.skip(problem)


needs_netns = pytest.mark.usefixtures("netns")


def _run_in_netns(script: str, env: dict[str, str] | None = None,
                  timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a bash script in a fresh network namespace (loopback up); kill it on timeout."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(["unshare", "-n", "bash", "-c", "set -e; ip link set lo up; " + script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, cwd=REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"namespace script timed out after {timeout_s}s\nstdout:{out}\nstderr:{err}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# --- pure argument handling (no root needed) ----------------------------------------------

@pytest.mark.timeout(30)
@pytest.mark.parametrize("bandwidth, bits", [("200mbit", 200_000_000), ("1Gbps", 1_000_000_000),
                                             ("100Mbps", 100_000_000), ("1.5gbit", 1_500_000_000),
                                             ("10GbE", 10_000_000_000)])
def test_bandwidth_is_handed_to_tc_in_bits(bandwidth: str, bits: int) -> None:
    res = subprocess.run(["bash", str(SHAPER), "--dry-run", bandwidth],
                         env={**os.environ, "GTOPK_SHAPE_IFACE": "eth9"},
                         capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, res.stderr
    assert f"tc qdisc add dev eth9 root handle 1: tbf rate {bits}bit" in res.stdout


@pytest.mark.timeout(30)
def test_delay_puts_netem_in_front_of_tbf() -> None:
    res = subprocess.run(["bash", str(SHAPER), "--dry-run", "1gbit", "0.5ms"],
                         env={**os.environ, "GTOPK_SHAPE_IFACE": "eth0"},
                         capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "tc qdisc add dev eth0 root handle 1: netem delay 500us" in lines
    assert any(line.startswith("tc qdisc add dev eth0 parent 1:1 handle 10: tbf rate 1000000000bit")
               for line in lines)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args, fragment", [
    (["1mbs"], "bandwidth='1mbs' is invalid"),
    (["fast"], "bandwidth='fast' is invalid"),
    (["1kbit"], "bandwidth='1kbit' is invalid"),  # below tbf's useful range
    (["1gbit", "5"], "delay='5' is invalid"),
    ([], "BANDWIDTH is missing"),
])
def test_bad_settings_fail_with_a_message(args: list[str], fragment: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GTOPK_SHAPE_")}
    res = subprocess.run(["bash", str(SHAPER), "--dry-run", *args], env=env,
                         capture_output=True, text=True, timeout=20)
    assert res.returncode == 2
    assert fragment in res.stderr


@pytest.mark.timeout(30)
def test_entrypoint_without_shaping_just_runs_the_command() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GTOPK_SHAPE_", "NCCL_", "GLOO_"))}
    res = subprocess.run(["bash", str(ENTRYPOINT), "env"], env=env, capture_output=True, text=True,
                         timeout=20)
    assert res.returncode == 0, res.stderr
    assert "NCCL_SOCKET_IFNAME" not in res.stdout
    res = subprocess.run(["bash", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=20)
    assert res.returncode == 2 and "no command given" in res.stderr


# --- real shaping in a private network namespace --------------------------------------------

@needs_netns
@pytest.mark.timeout(60)
def test_entrypoint_shapes_the_interface_and_pins_collectives_to_it() -> None:
    res = _run_in_netns(f"bash {ENTRYPOINT} bash -c 'tc qdisc show dev lo; env'",
                        env={"GTOPK_SHAPE_BANDWIDTH": "200mbit", "GTOPK_SHAPE_IFACE": "lo",
                             "GTOPK_SHAPE_DELAY": "", "GTOPK_SHAPE_BURST": "256kb"})
    assert res.returncode == 0, res.stderr
    assert "qdisc tbf 1: root" in res.stdout and "rate 200Mbit" in res.stdout
    env_lines = set(res.stdout.splitlines())
    for line in ("GLOO_SOCKET_IFNAME=lo", "NCCL_SOCKET_IFNAME=lo", "NCCL_IB_DISABLE=1",
                 "NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1"):
        assert line in env_lines


@needs_netns
@pytest.mark.timeout(60)
def test_delay_without_netem_fails_loudly_instead_of_running_unshaped() -> None:
    probe = _run_in_netns("tc qdisc add dev lo root netem delay 1ms")
    if probe.returncode == 0:
        pytest.skip("this kernel has sch_netem: the failure path cannot be exercised")
    res = _run_in_netns(f"bash {SHAPER} 200mbit 1ms", env={"GTOPK_SHAPE_IFACE": "lo"})
    assert res.returncode == 2
    assert "lacks sch_netem" in res.stderr


def _allreduce_rank(rank: int, world_size: int, numel: int, repeats: int) -> dict[str, float]:
    """One rank: warm up, then time ``repeats`` dense allreduces of ``numel`` fp32 elements."""
    import torch
    import torch.distributed as dist

    from gtopk_lab.collectives import dense_allreduce

    dense_allreduce(torch.ones(1024))  # connections and buffers set up outside the timing
    tensor = torch.full((numel,), float(rank + 1))
    dist.barrier()
    start = time.perf_counter()
    bytes_sent = 0
    for _ in range(repeats):
        tensor.fill_(float(rank + 1))
        result = dense_allreduce(tensor)
        bytes_sent += result.stats.bytes_sent
    elapsed_s = time.perf_counter() - start
    expected = float(sum(range(1, world_size + 1)))
    if not torch.all(result.values == expected):
        raise AssertionError(f"allreduce gave {result.values[:4]} instead of {expected}")
    return {"elapsed_s": elapsed_s, "bytes_sent": float(bytes_sent)}


def _child_main(numel: int, repeats: int) -> None:
    """Entry inside the namespace: run the 2-rank allreduce, print one JSON line."""
    sys.path.insert(0, str(REPO))
    from gtopk_lab.comm.launch import run_gloo

    results = run_gloo(_allreduce_rank, 2, numel, repeats, timeout_s=60)
    print(json.dumps({"elapsed_s": max(r["elapsed_s"] for r in results),
                      "bytes_sent_all_ranks": sum(r["bytes_sent"] for r in results)}))


@needs_netns
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_shaped_loopback_slows_a_real_allreduce_to_the_configured_rate() -> None:
    """2-rank gloo allreduce of 8 MB per rank over lo shaped to 200 Mbit/s.

    The ring sends 2 (P-1)/P * 8 MB = 8 MB per rank, 16 MB in all through the one shaped
    link: 0.64 s at 200 Mbit/s. Whatever algorithm gloo picks, each rank must ship at
    least half of its buffer, so the allreduce cannot beat half of that; we assert that.
    Unshaped, the same allreduce takes about 10 ms on this 2-core machine.
    """
    child = f"{sys.executable} {Path(__file__).resolve()} --child {NUMEL} 1"
    shaped = _run_in_netns(f"bash {SHAPER} 200mbit && {child}",
                           env={"GTOPK_SHAPE_IFACE": "lo", "GTOPK_SHAPE_BURST": "256kb",
                                "GTOPK_SHAPE_QUEUE_LATENCY": "1000ms", "GTOPK_SHAPE_DELAY": ""},
                           timeout_s=120)
    assert shaped.returncode == 0, shaped.stderr[-3000:]
    measured = json.loads(shaped.stdout.strip().splitlines()[-1])
    total_bytes = measured["bytes_sent_all_ranks"]
    assert total_bytes == pytest.approx(2 * NUMEL * 4, rel=0.01)  # ring estimate, both ranks
    ideal_s = total_bytes * 8 / RATE_BITS_PER_S
    print(f"shaped allreduce: {measured['elapsed_s']:.3f} s, ideal {ideal_s:.3f} s at 200 Mbit/s "
          f"-> effective {total_bytes * 8 / measured['elapsed_s'] / 1e6:.0f} Mbit/s")
    assert measured["elapsed_s"] >= 0.5 * ideal_s


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child_main(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit("usage: test_traffic_shaping.py --child NUMEL REPEATS")
