"""The one transport interface and the one recorder (gtopk_lab.comm.transport, recorder, wire,
dist_transport): a plugin's ring is charged what its formula says, every message is one
buffer on real gloo ranks (also larger than a receive's capacity, and with the length-first
framing NCCL needs), and real ranks equal the in-process transport bitwise."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gtopk_lab.comm.dist_transport import DistTransport
from gtopk_lab.comm.inprocess import sim_gtopk_allreduce
from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.comm.recorder import Recorder, route
from gtopk_lab.comm.tensor_programs import simulate_tensor_programs
from gtopk_lab.comm.transport import drive
from gtopk_lab.comm.wire import EAGER_BYTES, TENSORS
from gtopk_lab.methods import CommCall, Contribution, unregister_method
from gtopk_lab.network.clock import VirtualClock
from gtopk_lab.network.model import NetworkModel

ROOT = Path(__file__).resolve().parents[1]


def _docs_example(tmp_path: Path):
    """docs/extending.md's worked example, imported as a user's plugin module."""
    text = (ROOT / "docs" / "extending.md").read_text()
    code = next(b.split("```", 1)[0] for b in text.split("```python\n")[1:] if b.startswith("# my_methods.py"))
    path = tmp_path / "my_methods_transport.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("my_methods_transport", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def _legacy_ring(rank, world, contribution, call):
    """The same ring as one send per tensor and one receive per tensor: four requests a step."""
    mine = (contribution.values, contribution.indices.to(torch.int32))
    parts = {rank: mine}
    v, i = mine
    for step in range(1, world):
        yield ("send", (rank + 1) % world, v)
        yield ("send", (rank + 1) % world, i)
        v, i = (yield ("recv", (rank - 1) % world, None)), (yield ("recv", (rank - 1) % world, None))
        parts[(rank - step) % world] = (v, i)
    return torch.cat([parts[r][0] for r in range(world)]), torch.cat([parts[r][1] for r in range(world)])


@pytest.mark.timeout(60)
def test_a_plugins_ring_is_charged_what_its_formula_says(tmp_path: Path) -> None:
    """P = 8 on 1GbE: the docs' ring (one sendrecv a step) is 7 rounds, and the virtual clock
    advances by exactly its own formula; the same ring as send, send, recv, recv is 28."""
    module = _docs_example(tmp_path)
    try:
        from gtopk_lab.methods import get_method

        method = get_method("ring-topk")
        p, numel, k = 8, 100_000, 1000
        net = NetworkModel.from_strings("1GbE")
        gen = torch.Generator().manual_seed(0)
        contributions = []
        for _ in range(p):
            acc = torch.randn(numel, generator=gen)
            values, indices = module.top_half_k(acc, k)
            contributions.append(Contribution(gradient=acc, acc=acc, values=values, indices=indices))
        call = CommCall(numel=numel, k=k, exact_k=True)
        results = method.comm.simulate(contributions, call)
        assert all(r.stats.rounds == p - 1 for r in results)
        clock = VirtualClock(net)
        charged = clock.simulate_collective([0.0] * p, results)
        formula = method.predicted_time_s(net, numel, k, p)
        # hand-computed: 7 (alpha + beta (32 + 8k)) with the paper's 1 GbE alpha = 0.436 ms and
        # beta = 9e-9 s per byte: 3.56 ms
        assert formula == pytest.approx(7 * (0.436e-3 + 9e-9 * (32 + 8 * k)), rel=1e-9)
        assert charged == pytest.approx(formula, rel=1e-12)
        total = torch.zeros(numel).index_add_(0, torch.cat([c.indices for c in contributions]).long(),
                                              torch.cat([c.values for c in contributions]))
        assert torch.allclose(torch.zeros(numel).index_add_(0, results[0].indices.long(), results[0].values),
                              total, atol=1e-5)
        legacy = simulate_tensor_programs(lambda r, w: _legacy_ring(r, w, contributions[r], call), "legacy", p)
        assert all(r.stats.rounds == 4 * (p - 1) for r in legacy)
        assert [r.stats.bytes_sent for r in legacy] == [r.stats.bytes_sent for r in results]
        assert VirtualClock(net).simulate_collective([0.0] * p, legacy) > 1.9 * charged
    finally:
        unregister_method("ring-topk")
        sys.modules.pop("my_methods_transport", None)


@pytest.mark.timeout(30)
def test_requests_are_checked_before_anything_is_sent() -> None:
    assert route(("sendrecv", (1, 2), "x"), 0, 3) == (1, 2, "x", "")
    assert route(("exchange", 2, "x", "phase"), 0, 3) == (2, 2, "x", "phase")
    assert route(("recv", 1, None), 0, 3) == (None, 1, None, "")
    with pytest.raises(ValueError, match="op='scatter' is invalid"):
        route(("scatter", 1, None), 0, 3)
    with pytest.raises(ValueError, match="peer=0 is invalid"):
        route(("send", 0, None), 0, 3)
    with pytest.raises(ValueError, match=r"peer=3 is invalid: expected a rank in \[0, 3\)"):
        route(("sendrecv", (1, 3), None), 0, 3)

    def bad():
        yield ("send", 1, [1, 2])

    with pytest.raises(TypeError, match="a message carries list"):
        simulate_tensor_programs(lambda r, w: bad(), "bad", 2)


# --------------------------------------------------------------------------- real gloo ranks
BIG = EAGER_BYTES // 4 + 1000  # fp32 elements: a message above one receive buffer's capacity


def _mixed(rank: int, world: int):
    """Tuples of mixed dtypes (misaligned views), an empty tensor, a message larger than a
    receive's capacity, sendrecv with two peers, and the plain send / recv / exchange."""
    gen = torch.Generator().manual_seed(rank)
    right, left = (rank + 1) % world, (rank - 1) % world
    got = []
    got.append((yield ("sendrecv", (right, left), (torch.arange(3, dtype=torch.int8) + rank,
                                                  torch.randn(5, generator=gen),
                                                  torch.arange(7, dtype=torch.int64) * rank))))
    got.append((yield ("sendrecv", (right, left), torch.empty(0))))
    got.append((yield ("sendrecv", (right, left), torch.randn(BIG, generator=gen))))
    if rank == 0:
        yield ("send", 1, torch.full((4,), 7.0))
    elif rank == 1:
        got.append((yield ("recv", 0, None)))
    if rank < 2:
        got.append((yield ("exchange", 1 - rank, torch.tensor([rank], dtype=torch.float64))))
    return torch.cat([t.double().reshape(-1) for g in got for t in (g if isinstance(g, tuple) else (g,))])


def _selection(rank: int, n: int, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    idx = torch.randperm(numel, generator=gen)[:n]
    return torch.randn(n, generator=gen), idx.to(torch.int32)


def _job(rank: int, world: int) -> dict:
    out = {}
    for eager in (True, False):  # False: the length-first framing of a backend without eager receives
        rec = Recorder(TENSORS, rank, world)
        value = drive(rec.wrap(_mixed(rank, world)), DistTransport(None, torch.device("cpu"), TENSORS, eager=eager))
        out[eager] = (value, rec.steps, rec.messages)
    # gTop-k without exact-k: the first round carries 150k pairs (1.2 MB), beyond the buffer
    from gtopk_lab.collectives import gtopk_allreduce

    v, i = _selection(rank, 150_000, 400_000)
    out["gtopk"] = gtopk_allreduce(v, i, 400_000, 1000, algorithm="butterfly")
    dist.barrier()
    return out


@functools.lru_cache(maxsize=1)
def _real() -> list[dict]:
    return run_gloo(_job, 3, timeout_s=120)


@pytest.mark.timeout(180)
def test_real_ranks_carry_every_message_as_the_in_process_transport_does() -> None:
    real = _real()
    world = 3
    recs = [Recorder(TENSORS, r, world) for r in range(world)]
    from gtopk_lab.comm.transport import run_programs

    sim = run_programs([rec.wrap(_mixed(r, world)) for r, rec in enumerate(recs)])
    for r in range(world):
        for eager in (True, False):
            value, steps, messages = real[r][eager]
            assert torch.equal(value, sim[r])
            assert steps == recs[r].steps and messages == recs[r].messages
    # the recorded bytes: 16 per tensor plus the data
    assert recs[0].steps[0] == (3 * 16 + 3 + 20 + 56, 3 * 16 + 3 + 20 + 56)
    assert recs[0].steps[2] == (16 + 4 * BIG,) * 2
    sims = sim_gtopk_allreduce(*zip(*[_selection(r, 150_000, 400_000) for r in range(world)]), 400_000, 1000)
    for r in range(world):
        got = real[r]["gtopk"]
        assert torch.equal(got.values, sims[r].values) and torch.equal(got.indices, sims[r].indices)
        assert got.stats.steps == sims[r].stats.steps
    assert max(s for s, _ in sims[2].stats.steps) == 8 + 8 * 150_000  # the rank that folds in
