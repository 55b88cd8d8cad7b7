"""The shared-memory transport (gtopk_lab.comm.shm_ring, shm_links, links_transport,
transport_choice): on real gloo ranks of one host every point-to-point collective goes
through it, bitwise equal to the gloo path, to the project's own TCP links (the transport
between hosts, here on loopback) and to oracles written here; messages larger than a ring
stream through without deadlock; nothing is left in /dev/shm, also after a rank is killed; a
dead peer is an error naming it, not a hang. The TCP links' own failures: test_tcp_transport."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gtopk_lab.comm import shm_links as shm_links_mod
from gtopk_lab.comm.inprocess import sim_gtopk_allreduce
from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.comm.oktopk import OkTopkFaithfulState, sim_oktopk_allreduce, sim_oktopk_faithful_allreduce
from gtopk_lab.comm.shm_links import ShmLinks, shm_wanted
from gtopk_lab.comm.shm_ring import SEGMENT_PREFIX, SHM_DIR, Segment, shm_supported, sweep_stale_segments
from thread_ranks import swap_messages

pytestmark = pytest.mark.skipif(not shm_supported(), reason="shared memory rings need Linux x86-64 and /dev/shm")

NUMEL, K = 20_000, 200
BIG = 300_000  # float32 elements of a tensor-program message: 1.2 MB, larger than the 64 kB rings below


def _inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s dense buffer and its local top-k (values, int64 indices)."""
    acc = torch.randn(NUMEL, generator=torch.Generator().manual_seed(100 + rank))
    idx = acc.abs().topk(K).indices
    return acc, acc[idx], idx


def _ring_sum_program(rank: int, world: int, mine: torch.Tensor):
    """Every rank's tensor around the ring (one sendrecv a step); returns their sum."""
    total, passing = mine.clone(), mine
    for _ in range(world - 1):
        passing = yield ("sendrecv", ((rank + 1) % world, (rank - 1) % world), passing)
        total += passing
    return total


def _big(rank: int) -> torch.Tensor:
    return torch.randn(BIG, generator=torch.Generator().manual_seed(7 + rank))


def _collectives_job(rank: int, world: int, pid_file: str) -> dict:
    from gtopk_lab.comm.oktopk import oktopk_allreduce, oktopk_faithful_allreduce
    from gtopk_lab.comm.tensor_programs import run_tensor_program
    from gtopk_lab.comm.torch_dist import gtopk_allreduce, topk_allgather
    from gtopk_lab.comm.transport_choice import transport_kind

    Path(pid_file + f".{rank}").write_text(str(os.getpid()))
    acc, v, i = _inputs(rank)
    out: dict = {"kind": transport_kind()}
    for algorithm in ("butterfly", "tree"):
        for exact_k in (False, True):
            r = gtopk_allreduce(v, i, NUMEL, K, algorithm=algorithm, exact_k=exact_k)
            out[f"gtopk/{algorithm}/{exact_k}"] = (r.values, r.indices, r.stats.steps)
    state = OkTopkFaithfulState(tau=2, tau_r=2, warmup=1)
    for call in range(3):  # warm-up (dense messages), re-evaluation, reuse
        r, _sel = oktopk_faithful_allreduce(acc * (1 + call), K, state=state)
        out[f"oktopk/{call}"] = (r.values, r.indices, r.stats.steps)
    r = oktopk_allreduce(v, i, NUMEL, K)
    out["oktopk-exact"] = (r.values, r.indices, r.stats.steps)
    r = run_tensor_program(lambda rk, w: _ring_sum_program(rk, w, _big(rk)), "ring-sum")
    out["ring"] = r.values if hasattr(r, "values") else r
    # Top-k's allgather: exact count; counted with a different count per rank; and every
    # entry (160 kB a block, more than a 64 kB ring, all ranks sending at once)
    for key, (vals, idx, exact) in {"allgather/exact": (v, i, K), "allgather/counted": (v[rank:], i[rank:], None),
                                    "allgather/all": (acc, torch.arange(NUMEL), None)}.items():
        r = topk_allgather(vals, idx, NUMEL, exact_count=exact)
        out[key] = (r.values, r.indices, r.stats.steps)
        out[key + "/peers"] = r.stats.peers
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def _assert_same(a, b, what: str) -> None:
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(_bits(x), _bits(y)), what
        else:
            assert x == y, what


def _leftovers(pids: list[int]) -> list[str]:
    names = [p.name for p in SHM_DIR.iterdir() if p.name.startswith(SEGMENT_PREFIX)]
    return [n for n in names if any(f"_{pid}_" in n for pid in pids)]


def _pids(pid_file: Path, world: int) -> list[int]:
    return [int(Path(f"{pid_file}.{r}").read_text()) for r in range(world)]


#: the three transports a real rank's point-to-point rounds may take: (GTOPK_LAB_SHM, GTOPK_LAB_TCP)
MODES = {"gloo": ("0", "0"), "tcp": ("0", "1"), "shm": ("1", "1")}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_point_to_point_collective_is_bitwise_the_gloo_paths_and_the_oracles(
        world: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gTop-k (butterfly, tree; counted and exact-k), Ok-Topk (warm-up, re-evaluation, reuse),
    Ok-Topk exact, Top-k's allgather (exact, counted, 160 kB blocks) and a tensor program whose 1.2 MB messages stream through 64 kB rings (and
    fill the TCP sockets' buffers while both ends send): the shm run and the run over the
    project's own TCP links equal the gloo run bitwise (values, indices, recorded rounds) and
    the oracles (the in-process drivers; the dense sum; at P = 2 the top-k of the two inputs'
    sum); afterwards no segment of these ranks is left in /dev/shm."""
    monkeypatch.setenv("GTOPK_LAB_SHM_RING_BYTES", str(64 << 10))
    runs = {}
    for mode, (shm, tcp) in MODES.items():
        monkeypatch.setenv("GTOPK_LAB_SHM", shm)
        monkeypatch.setenv("GTOPK_LAB_TCP", tcp)
        pid_file = tmp_path / f"pids-{mode}"
        runs[mode] = run_gloo(_collectives_job, world, str(pid_file), timeout_s=120.0)
        assert _leftovers(_pids(pid_file, world)) == []
        assert [r["kind"] for r in runs[mode]] == [mode] * world
    for mode in ("tcp", "shm"):
        for rank in range(world):
            # the links carry the allgather as a ring (right out, left in); gloo's peers are unknown
            assert runs["gloo"][rank]["allgather/all/peers"] == []
            assert runs[mode][rank]["allgather/all/peers"] == [((rank + 1) % world, (rank - 1) % world)] * (
                2 * (world - 1))
            for key, gloo in runs["gloo"][rank].items():
                if key != "kind" and not key.endswith("/peers"):
                    _assert_same(gloo if isinstance(gloo, tuple) else (gloo,),
                                 runs[mode][rank][key] if isinstance(gloo, tuple) else (runs[mode][rank][key],),
                                 f"{mode}: rank {rank} {key}")
    runs["1"] = runs["shm"]
    inputs = [_inputs(r) for r in range(world)]
    for algorithm in ("butterfly", "tree"):
        for exact_k in (False, True):
            sims = sim_gtopk_allreduce([v for _, v, _ in inputs], [i for _, _, i in inputs], NUMEL, K,
                                       algorithm=algorithm, exact_k=exact_k)
            for rank, sim in enumerate(sims):
                _assert_same((sim.values, sim.indices, sim.stats.steps),
                             runs["1"][rank][f"gtopk/{algorithm}/{exact_k}"], f"sim {algorithm} {exact_k}")
    state = OkTopkFaithfulState(tau=2, tau_r=2, warmup=1)
    for call in range(3):
        sims = sim_oktopk_faithful_allreduce([acc * (1 + call) for acc, _, _ in inputs], K, state=state)
        for rank, (sim, _sel) in enumerate(sims):
            got = runs["1"][rank][f"oktopk/{call}"]
            assert (sim.indices is None) == (got[1] is None)
            _assert_same((sim.values, sim.stats.steps), (got[0], got[2]), f"oktopk call {call}")
    sims = sim_oktopk_allreduce([v for _, v, _ in inputs], [i for _, _, i in inputs], NUMEL, K)
    for rank, sim in enumerate(sims):
        _assert_same((sim.values, sim.indices, sim.stats.steps), runs["1"][rank]["oktopk-exact"], "oktopk-exact")
    for key, take in {"allgather/exact": 0, "allgather/counted": 1}.items():  # the sum of every selection
        total = torch.zeros(NUMEL)
        for r, (_, v, i) in enumerate(inputs):
            total.index_add_(0, i[r * take:], v[r * take:])
        for rank in range(world):
            values, indices, _ = runs["1"][rank][key]
            assert torch.equal(torch.zeros(NUMEL).index_add_(0, indices.long(), values), total), (key, rank)
    dense = sum(acc for acc, _, _ in inputs)
    for rank in range(world):
        values, indices, _ = runs["1"][rank]["allgather/all"]
        assert torch.equal(indices.long(), torch.arange(NUMEL)) and torch.allclose(values, dense, atol=1e-5)
    expected = [_big(rank).clone() for rank in range(world)]  # the ring's order of additions
    for rank in range(world):
        for step in range(1, world):
            expected[rank] += _big((rank - step) % world)
        assert torch.equal(runs["1"][rank]["ring"], expected[rank])
    if world == 2:  # one merge: the top-k by magnitude of the two sparse inputs' sum
        total = torch.zeros(NUMEL)
        for _, v, i in inputs:
            total.index_add_(0, i, v)
        top = total.abs().topk(K).indices.sort().values
        for rank in range(world):
            for algorithm in ("butterfly", "tree"):
                values, indices, _ = runs["1"][rank][f"gtopk/{algorithm}/True"]
                assert torch.equal(indices.long(), top) and torch.equal(values, total[top])


def _other_host_job(rank: int, world: int) -> str:
    from gtopk_lab.comm.torch_dist import gtopk_allreduce
    from gtopk_lab.comm.transport_choice import transport_kind

    if rank == 1:  # this rank claims another host: every rank must fall back to gloo
        shm_links_mod.host_identity = lambda: "another-host"  # type: ignore[assignment]
    _acc, v, i = _inputs(rank)
    gtopk_allreduce(v, i, NUMEL, K)
    return transport_kind()


@pytest.mark.timeout(120)
def test_ranks_on_different_hosts_use_tcp_links_or_gloo_when_those_are_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_gloo(_other_host_job, 2, timeout_s=60.0) == ["tcp", "tcp"]
    monkeypatch.setenv("GTOPK_LAB_TCP", "0")
    assert run_gloo(_other_host_job, 2, timeout_s=60.0) == ["gloo", "gloo"]


def _killed_job(rank: int, world: int, pid_file: str) -> None:
    from gtopk_lab.comm.torch_dist import gtopk_allreduce

    Path(pid_file + f".{rank}").write_text(str(os.getpid()))
    _acc, v, i = _inputs(rank)
    gtopk_allreduce(v, i, NUMEL, K)  # the handshake is done
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    gtopk_allreduce(v, i, NUMEL, K, algorithm="tree")  # rank 0 waits for a dead peer


@pytest.mark.timeout(120)
def test_a_killed_rank_leaves_nothing_in_dev_shm(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    with pytest.raises(RuntimeError, match="rank 1 .*died|died"):
        run_gloo(_killed_job, 2, str(pid_file), timeout_s=60.0)
    assert _leftovers(_pids(pid_file, 2)) == []


def _pair(tmp_path: Path, pids: list[int], capacity: int, timeout_s: float = 60.0) -> tuple[ShmLinks, ShmLinks]:
    """Both ends of a P = 2 group in this process, on segment files in ``tmp_path``."""
    size = shm_links_mod._segment_bytes(2, capacity)
    segs = [Segment(tmp_path / f"seg{r}", size) for r in range(2)]
    return tuple(ShmLinks(r, 2, segs[r], {1 - r: Segment(tmp_path / f"seg{1 - r}")}, [capacity] * 2, pids,
                          timeout_s) for r in range(2))  # type: ignore[return-value]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.timeout(60)
def test_an_exchange_of_messages_larger_than_the_rings_streams_through(tmp_path: Path) -> None:
    """Both ends post 1 MB to each other before receiving, through 4 kB rings (threads as ranks)."""
    swap_messages(_pair(tmp_path, [os.getpid()] * 2, 4096), 1 << 20, repeats=3)


@pytest.mark.timeout(60)
def test_a_dead_peer_or_a_silent_one_is_an_error_not_a_hang(tmp_path: Path) -> None:
    dead = _dead_pid()
    (tmp_path / "a").mkdir()
    mine, _ = _pair(tmp_path / "a", [os.getpid(), dead], 4096)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"rank 1 \(pid {dead}\) of 2 died while rank 0 waited"):
        mine.receive(1)
    assert time.monotonic() - t0 < 5.0
    (tmp_path / "b").mkdir()
    mine, _ = _pair(tmp_path / "b", [os.getpid()] * 2, 4096, timeout_s=0.2)
    with pytest.raises(RuntimeError, match="waited .*the group's timeout"):
        mine.receive(1)


@pytest.mark.timeout(30)
def test_segments_of_dead_creators_are_swept_live_ones_kept(tmp_path: Path) -> None:
    ns = os.stat("/proc/self/ns/pid").st_ino
    dead, live = f"{SEGMENT_PREFIX}{ns}_{_dead_pid()}_abc", f"{SEGMENT_PREFIX}{ns}_{os.getpid()}_abc"
    for name in (dead, live, "unrelated"):
        (tmp_path / name).write_bytes(b"x")
    assert sweep_stale_segments(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live, "unrelated"])


@pytest.mark.timeout(30)
def test_the_switch_takes_0_or_1_and_names_itself_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    for text, want in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("GTOPK_LAB_SHM", text)
        assert shm_wanted() is want
    monkeypatch.setenv("GTOPK_LAB_SHM", "maybe")
    with pytest.raises(ValueError, match="GTOPK_LAB_SHM='maybe' is invalid"):
        shm_wanted()


def _bad_setting_job(rank: int, world: int, variable: str, text: str) -> tuple[str, float]:
    from gtopk_lab.comm.torch_dist import gtopk_allreduce

    if variable == "GTOPK_LAB_TCP":  # the TCP links' handshake runs where shared memory does not
        os.environ["GTOPK_LAB_SHM"] = "0"
    if rank == world - 1:  # only the last rank's environment is wrong
        os.environ[variable] = text
    _acc, v, i = _inputs(rank)
    t0 = time.monotonic()
    try:
        gtopk_allreduce(v, i, NUMEL, K)
    except ValueError as exc:
        return str(exc), time.monotonic() - t0
    return "no error", time.monotonic() - t0


@pytest.mark.timeout(240)
@pytest.mark.parametrize("variable,text", [("GTOPK_LAB_SHM", "maybe"), ("GTOPK_LAB_SHM_SPIN_US", "-3"),
                                           ("GTOPK_LAB_TCP", "maybe")])
def test_an_invalid_setting_on_one_rank_is_the_same_one_line_error_on_every_rank(variable: str, text: str) -> None:
    """The group's timeout is 100 s: a rank left waiting for the one that gave up would take
    that long; every rank instead raises at the handshake, with the same message."""
    got = run_gloo(_bad_setting_job, 3, variable, text, timeout_s=100.0)
    want = f"{variable}='{text}' is invalid"
    messages = {m for m, _ in got}
    assert len(messages) == 1, messages
    message = messages.pop()
    assert message.startswith(want) and "rank 2 of 3" in message and "\n" not in message
    assert max(s for _, s in got) < 50.0


@pytest.mark.timeout(60)
def test_whole_messages_of_several_parts_wrap_around_the_ring_intact(tmp_path: Path) -> None:
    """Messages of 1-3 parts, 1 to 3000 bytes, through a 4 kB ring, so that lengths and bytes
    straddle its end; the oracle is the concatenation of the parts, in order."""
    a, b = _pair(tmp_path, [os.getpid()] * 2, 4096)
    gen = torch.Generator().manual_seed(7)
    for n in range(60):
        sizes = [int(x) for x in torch.randint(0, 1000, (1 + n % 3,), generator=gen)]
        sizes[0] += 1
        parts = [torch.randint(0, 256, (s,), dtype=torch.uint8, generator=gen) for s in sizes]
        a.send(1, parts)
        got = b.receive(0)
        assert torch.equal(got, torch.cat(parts)), n
    assert not any(a.pending.values())
