"""The TCP terms hooked into the model: fit, prediction, NetworkModel.tcp, formulas, clock, CLI.

Oracles: hand-computed alpha-beta sums with each term written out here; synthetic calls
built from known constants (the fit must give them back); the plain model's own numbers
(a model without terms must price everything exactly as before).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gtopk_lab.analysis.predict import collective_time_s
from gtopk_lab.cli.main import main as cli_main
from gtopk_lab.network.clock import VirtualClock
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.network.tcp_fit import fit_tcp_constants, fit_terms, predict_call
from gtopk_lab.network.tcp_terms import TcpTerms
from peer_pairs import sends_and_receives

pytestmark = pytest.mark.timeout(60)
ALPHA, RATE = 1e-4, 200e6
BETA = 8.0 / RATE
TERMS = TcpTerms(cpu_s_per_message=2e-4, duplex_beta_fraction=0.25, incast_s_per_sender=1e-3)


def test_fit_recovers_known_constants_from_synthetic_calls() -> None:
    points = []
    for i, (rounds, duplex_s, senders) in enumerate([(2, 0.01, 1), (6, 0.0, 1), (4, 0.05, 1), (1, 0.0, 3),
                                                     (3, 0.2, 1), (1, 0.0, 7), (10, 0.3, 1)]):
        base = 0.001 * (i + 1)
        measured = base + 2e-4 * rounds + 0.25 * duplex_s + 1e-3 * (senders - 1)
        points.append({"measured_s": measured, "base_s": base, "message_units": rounds,
                       "duplex_units": duplex_s, "incast_units": senders - 1})
    fit = fit_tcp_constants(points)
    assert fit["cpu_s_per_message"] == pytest.approx(2e-4, rel=1e-6)
    assert fit["duplex_beta_fraction"] == pytest.approx(0.25, rel=1e-6)
    assert fit["incast_s_per_sender"] == pytest.approx(1e-3, rel=1e-6)


def test_a_busy_ports_fraction_of_beta_comes_back_from_incast_calls_and_stays_below_one() -> None:
    """Incast rows built here: rank 0 receives from P - 1 senders at once and its bytes past the
    3,000 B burst drain at 0.88 of one flow's beta (a port several flows keep busy); one-sender
    rows (P = 2) drain at beta. The fit gives 0.12 back, the other constants 0; a busy port
    the calls cannot pay for (a "fraction" >= 1) is never kept."""
    net = NetworkModel(latency_s=ALPHA, bandwidth_bps=RATE, tcp=TcpTerms(burst_bytes=3000.0))
    rows = []
    for p, n_bytes in ((2, 80_000), (2, 2_000_000), (4, 80_000), (4, 2_000_000), (3, 400_000)):
        recv = (p - 1) * n_bytes
        steps = [[[0, recv]]] + [[[n_bytes, 0]]] * (p - 1)
        past = recv - 3000
        wire = ALPHA + BETA * past * (0.88 if p > 2 else 1.0)
        rows.append({"collective": "incast", "workers": p, "cores": 8.0, "steps": steps,
                     "cpu_s": [0.0] * p, "median_s": wire})
    terms = fit_terms(net, rows, host_cores=8.0)
    assert terms.incast_beta_fraction == pytest.approx(0.12, rel=1e-6)
    assert terms.cpu_s_per_message == terms.duplex_beta_fraction == terms.incast_s_per_sender == 0
    # rank 0's 3-sender round by hand with the fitted terms: alpha + 0.88 beta (recv - B)
    pred = predict_call(net, terms, rows[2]["steps"], [0.0] * 4, ranks=4, cores=8.0, senders_per_rank=[3, 1, 1, 1])
    assert pred.all_terms_s == pytest.approx(ALPHA + BETA * (240_000 - 3000) * 0.88, rel=1e-9)
    # a call two thirds under its base would need a fraction of 1.5 (more than the bytes'
    # whole time): refused, the constant stays 0
    way_faster = [{"measured_s": 1.0, "base_s": 3.0, "incast_beta_units": -1.33}]
    assert fit_tcp_constants(way_faster)["incast_beta_fraction"] == 0.0


def test_fit_terms_keeps_the_links_burst_and_fits_on_top_of_it() -> None:
    """Calls built here from a link with a 3,000 B burst plus 150 us of CPU per message: fitted
    on a model that carries the burst (``net.tcp``), the per-message CPU comes back and the
    burst is kept; the other two constants stay 0."""
    net = NetworkModel(latency_s=ALPHA, bandwidth_bps=RATE, tcp=TcpTerms(burst_bytes=3000.0))
    rows = []
    for n_bytes, rounds in ((1000, 1), (8000, 2), (40_000, 3), (4000, 1), (200_000, 2)):
        steps = [[n_bytes, 0]] * rounds  # one-way rounds: no duplex
        wire = sum(ALPHA + BETA * max(0, n_bytes - 3000) for _ in range(rounds))
        rows.append({"collective": "gtopk_tree", "workers": 2, "cores": 2.0, "steps": [steps, steps],
                     "cpu_s": [1e-4, 1e-4], "median_s": wire + 1e-4 + 1.5e-4 * rounds})
    terms = fit_terms(net, rows, host_cores=2.0)
    assert terms.burst_bytes == 3000.0
    assert terms.cpu_s_per_message == pytest.approx(1.5e-4, rel=1e-6)
    assert terms.duplex_beta_fraction == 0 and terms.incast_s_per_sender == 0


def test_fit_is_never_negative_and_refuses_bad_points() -> None:
    faster = [{"measured_s": 1.0, "base_s": 2.0, "message_units": 3, "duplex_units": 0.1, "incast_units": 0}]
    assert fit_tcp_constants(faster) == {"cpu_s_per_message": 0.0, "incast_s_per_sender": 0.0,
                                         "duplex_beta_fraction": 0.0, "incast_beta_fraction": 0.0}
    with pytest.raises(ValueError, match="measured_s"):
        fit_tcp_constants([{"measured_s": 0.0, "base_s": 1.0}])
    with pytest.raises(ValueError, match="points"):
        fit_tcp_constants([])


def test_predict_call_by_hand() -> None:
    net = NetworkModel(ALPHA, RATE)
    steps = [[(1000, 1000), (0, 5000)], [(2000, 0)]]
    # 4 ranks on 2 cores: contention s = 2 on the per-message CPU. The off-wire CPU: the two
    # ranks not listed count as busy as rank 0, rank 1 has none, so three ranks share the two
    # cores while rank 0 does its 1 ms: 1.5 ms of wall time
    pred = predict_call(net, TERMS, steps, [1e-3, 0.0], ranks=4, cores=2.0)
    rank0_ab = 2 * ALPHA + BETA * 1000 + BETA * 5000
    rank0 = rank0_ab + 1.5e-3 + 2 * (2 * 2e-4) + 0.25 * BETA * 1000
    rank1 = ALPHA + BETA * 2000 + 2 * 2e-4
    assert pred.ab_s == pytest.approx(max(rank0_ab, ALPHA + BETA * 2000))
    assert pred.ab_cpu_s == pytest.approx(rank0_ab + 1.5e-3)
    assert pred.all_terms_s == pytest.approx(max(rank0, rank1))
    assert (pred.rounds, pred.senders) == (2, 1)


def test_another_job_on_the_cores_slows_the_off_wire_cpu_by_its_share_of_a_core() -> None:
    """Two P = 2 jobs on 2 cores: one round of 8 kB (wire w = alpha + 8000 beta) and 1 ms of CPU
    per rank. Alone s = 1; with the other job's 2 ranks, s = (2 + 2u) / 2 = 1 + u, u = s c /
    (w + s c), so c s**2 + (w - 2c) s - w = 0, whose positive root is the oracle."""
    net = NetworkModel(ALPHA, RATE)
    steps, cpu = [[(8000, 8000)], [(8000, 8000)]], 1e-3
    wire = ALPHA + BETA * 8000
    alone = predict_call(net, TcpTerms(), steps, [cpu, cpu], ranks=2, cores=2.0)
    assert alone.ab_cpu_s == pytest.approx(wire + cpu)
    shared = predict_call(net, TcpTerms(), steps, [cpu, cpu], ranks=2, cores=2.0, other_ranks=2)
    s = (2 * cpu - wire + ((wire - 2 * cpu) ** 2 + 4 * cpu * wire) ** 0.5) / (2 * cpu)
    assert 1.0 < s < 2.0
    assert shared.ab_cpu_s == pytest.approx(wire + cpu * s)


def test_link_io_stretched_past_the_wire_is_exposed_and_hidden_under_a_longer_wire() -> None:
    """8 ranks on 2 cores (s = 4), 0.5 ms of I/O inside the links per call: one 8 kB round
    (wire w = alpha + 8000 beta = 0.42 ms) exposes 4 * 0.5 - w; a 2 MB round (wire 84 ms) hides
    it; one rank per core (s = 1) hides it under a wire longer than the I/O."""
    net = NetworkModel(ALPHA, RATE)
    for nbytes, ranks, cores in ((8000, 8, 2.0), (2_000_000, 8, 2.0), (8000, 2, 2.0)):
        steps = [[(nbytes, nbytes)]] * 2
        wire = ALPHA + BETA * nbytes
        s = max(1.0, ranks / cores)
        pred = predict_call(net, TcpTerms(), steps, [0.0, 0.0], ranks=ranks, cores=cores, io_s_per_rank=[5e-4, 5e-4])
        assert pred.ab_cpu_s == pytest.approx(wire + max(0.0, 5e-4 * s - wire))
        assert pred.all_terms_s == pytest.approx(pred.ab_cpu_s)
    assert predict_call(net, TcpTerms(), [[(8000, 8000)]], [0.0], ranks=8, cores=2.0,
                        io_s_per_rank=[5e-4]).ab_cpu_s == pytest.approx(2e-3)


def test_serial_io_of_short_messages_is_stretched_by_the_ranks_exchanging_at_once() -> None:
    """0.5 ms of I/O a rank, F = 14480 B. A butterfly of 4 ranks on 2 cores, two rounds of 8 kB
    each way: every byte is within F, all 4 ranks exchange in both rounds, so the serial I/O
    takes 2x: 0.5 ms more than the wire. A tree's rank 0 exchanges in 4 rounds and its leaves
    in 2 (a / P = 12 / 16): 1.5x, 0.25 ms more. 2 MB messages: only 2 x 14480 of the 4 MB a
    round moves are serial; the rest (0.5 ms x 2) hides under their 84 ms wire. One rank per
    core: no stretch."""
    net = NetworkModel(ALPHA, RATE)
    terms, io = TcpTerms(serial_io_bytes=14480.0), 5e-4
    small = [(8000, 8000)] * 2
    wire = 2 * (ALPHA + BETA * 8000)
    butterfly = predict_call(net, terms, [small] * 4, [0.0] * 4, ranks=4, cores=2.0, io_s_per_rank=[io] * 4)
    assert butterfly.all_terms_s == pytest.approx(wire + io)
    assert predict_call(net, TcpTerms(), [small] * 4, [0.0] * 4, ranks=4, cores=2.0,
                        io_s_per_rank=[io] * 4).all_terms_s == pytest.approx(wire + max(0.0, 2 * io - wire))
    tree = [[(0, 8000)] * 2 + [(8000, 0)] * 2, [(8000, 0), (0, 8000)]] * 2
    tree_wire = 4 * (ALPHA + BETA * 8000)
    pred = predict_call(net, terms, tree, [0.0] * 4, ranks=4, cores=2.0, io_s_per_rank=[io] * 4)
    assert pred.all_terms_s == pytest.approx(tree_wire + 0.5 * io)
    big = [(2_000_000, 2_000_000)]
    serial = io * 2 * 14480 / 4_000_000
    pred = predict_call(net, terms, [big] * 4, [0.0] * 4, ranks=4, cores=2.0, io_s_per_rank=[io] * 4)
    assert pred.all_terms_s == pytest.approx(ALPHA + BETA * 2_000_000 + serial)
    assert predict_call(net, terms, [small] * 2, [0.0] * 2, ranks=2, cores=2.0,
                        io_s_per_rank=[io] * 2).all_terms_s == pytest.approx(wire)


def test_fit_terms_sets_the_serial_io_to_the_initial_window_where_io_was_measured() -> None:
    net = NetworkModel(ALPHA, RATE)
    row = {"collective": "gtopk_butterfly", "workers": 2, "cores": 2.0, "median_s": 1e-3,
           "steps": [[(8000, 8000)]] * 2, "cpu_s": [0.0, 0.0]}
    assert fit_terms(net, [{**row, "io_cpu_s": [3e-4, 3e-4]}], host_cores=2.0).serial_io_bytes == 14480.0
    assert fit_terms(net, [row], host_cores=2.0).serial_io_bytes == 0.0


def test_network_model_carries_terms_and_plain_models_are_unchanged() -> None:
    plain = NetworkModel(ALPHA, RATE, "link")
    assert "tcp" not in plain.to_dict() and plain.tcp is None
    net = NetworkModel(ALPHA, RATE, "link", tcp=TERMS)
    steps = [(1000, 3000), (8000, 0)]
    by_hand = (2 * ALPHA + BETA * 3000 + BETA * 8000 + 2 * 2e-4 + 0.25 * BETA * 1000)
    assert net.steps_time_s(steps) == pytest.approx(by_hand)
    assert net.ab_steps_time_s(steps) == plain.steps_time_s(steps)
    assert net.message_time_s(8000) == pytest.approx(ALPHA + BETA * 8000 + 2e-4)
    # the terms travel with the model: inline (to the workers), JSON files, from_strings
    assert NetworkModel.from_strings(net.to_inline()).tcp == TERMS
    assert "+ TCP terms" in str(net)
    with pytest.raises(TypeError, match="tcp="):
        NetworkModel(ALPHA, RATE, tcp={"cpu_s_per_message": 1.0})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'cpu_per_msg'"):
        TcpTerms.from_dict({"cpu_per_msg": 1.0})


def test_formulas_and_clock_charge_the_terms() -> None:
    plain, net = NetworkModel(ALPHA, RATE), NetworkModel(ALPHA, RATE, tcp=TERMS)
    numel, k, p = 1_000_000, 10_000, 4
    msg = 8 * k  # exact-k rounds: k (fp32, int32) pairs, no header
    # gTop-k butterfly, P = 4: 2 exchange rounds
    assert collective_time_s(plain, "gtopk_allreduce", numel, k, p, algorithm="butterfly", exact_k=True) \
        == 2 * (ALPHA + BETA * msg)
    assert collective_time_s(net, "gtopk_allreduce", numel, k, p, algorithm="butterfly", exact_k=True) \
        == pytest.approx(2 * (ALPHA + BETA * msg + 2e-4 + 0.25 * BETA * msg))
    # tree, P = 4: 4 one-way rounds (no duplex)
    assert collective_time_s(net, "gtopk_allreduce", numel, k, p, algorithm="tree", exact_k=True) \
        == pytest.approx(4 * (ALPHA + BETA * msg + 2e-4))
    # dense ring: 2 (P - 1) exchanges of 4 numel / P bytes
    chunk = 4 * numel // p
    assert collective_time_s(net, "dense", numel, k, p) == pytest.approx(
        2 * (p - 1) * (ALPHA + BETA * chunk + 2e-4 + 0.25 * BETA * chunk))
    # Ok-Topk's closed form gets the per-message CPU and duplex on every round: more than plain
    assert collective_time_s(net, "oktopk", numel, k, p) > collective_time_s(plain, "oktopk", numel, k, p)
    clock = VirtualClock(net)
    clock.simulate_collective([0.0], [[(msg, msg)]])
    assert clock.synced_time_s == pytest.approx(ALPHA + BETA * msg + 2e-4 + 0.25 * BETA * msg)


CLI = [sys.executable, "-m", "gtopk_lab.cli"]


def _cli_in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The CLI's own ``main`` in this process: its exit code and what it printed. A second
    interpreter's start would add only its imports (seconds each under load); the CLI tests
    check the process-level behaviour once for all commands."""
    capsys.readouterr()
    code = cli_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_calibrate_tcp_terms_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli_in_process(capsys, "calibrate", "--tcp-terms", "fit")
    assert code == 2 and err.count("\n") == 1 and "--scheduler" in err
    code, _, err = _cli_in_process(capsys, "calibrate", "--tcp-terms", str(tmp_path / "none.json"))
    assert code == 2 and err.count("\n") == 1 and "--tcp-terms" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tcp": {"cpu_s_per_message": -1.0}}))
    code, _, err = _cli_in_process(capsys, "calibrate", "--tcp-terms", str(bad))
    assert code == 2 and err.count("\n") == 1 and "cpu_s_per_message" in err


@pytest.mark.timeout(120)
def test_calibrate_stores_terms_that_gtopk_lab_model_charges(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    terms = tmp_path / "terms.json"
    terms.write_text(json.dumps({"tcp": TERMS.to_dict(), "fitted_on": "by hand"}))
    out = tmp_path / "cal.json"
    res = subprocess.run([*CLI, "calibrate", "--sizes", "1K,64K", "--repeats", "2", "--tcp-terms", str(terms),
                          "--out", str(out)], capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr
    assert "TCP terms: 200.0 us per message" in res.stdout
    saved = json.loads(out.read_text())
    assert TcpTerms.from_dict(saved["tcp"]) == TERMS
    model = NetworkModel.from_json(out)
    assert model.tcp == TERMS
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({k: v for k, v in saved.items() if k != "tcp"}))
    rows = {}
    for name, path in (("tcp", out), ("plain", plain)):
        code, out_text, err = _cli_in_process(capsys, "model", "scaling", "--bandwidth", str(path), "--workers", "4",
                                              "--json")
        assert code == 0, err
        rows[name] = {r["method"]: r["comm_s"] for r in json.loads(out_text)["rows"]}
    # dense's 6 rounds each gain 200 us of CPU and a quarter of their bytes' time
    d, p = 25_000_000, 4
    chunk = 4 * d // p
    extra = 2 * (p - 1) * (2e-4 + 0.25 * model.beta_s_per_byte * chunk)
    assert rows["tcp"]["dense"] - rows["plain"]["dense"] == pytest.approx(extra, rel=1e-6)


# --- a straggler's link: only the rounds that cross it (issue 28, item 3) -------------------
#: gTop-k's tree at P = 4 as the testbed recorded it (benchmarks/logs/2026-12-03-tcp-model.json):
#: per rank, (sent, recv) and (to, from) per round; rank 3 is the straggler's host
TREE_STEPS = [[(0, 8000), (0, 8000), (8000, 0), (8000, 0)], [(8000, 0), (0, 8000)],
              [(0, 8000), (8000, 0), (0, 8000), (8000, 0)], [(8000, 0), (0, 8000)]]
TREE_PEERS = [[(None, 1), (None, 2), (2, None), (1, None)], [(0, None), (None, 0)],
              [(None, 3), (0, None), (None, 0), (3, None)], [(2, None), (None, 2)]]


def test_a_straggler_slows_only_the_rounds_that_cross_its_link() -> None:
    net, slow = NetworkModel(ALPHA, RATE), NetworkModel(ALPHA, RATE / 4)
    pred = predict_call(net, TcpTerms(), TREE_STEPS, [0.0] * 4, ranks=4, cores=None, slow_net=slow,
                        slow_ranks={3}, peers_per_rank=TREE_PEERS)
    # the tree's critical path: 3 -> 2 and 2 -> 3 on the slow link, 2 -> 0 and 0 -> 2 not;
    # rank 2 makes all four rounds
    rank2 = 2 * (ALPHA + 4 * BETA * 8000) + 2 * (ALPHA + BETA * 8000)
    assert pred.all_terms_s == pytest.approx(rank2)
    assert pred.ab_s == pytest.approx(4 * (ALPHA + BETA * 8000))  # the other columns stay on net
    # peers unknown (a library ring: every round waits for the slowest link): all rounds slow
    ring = predict_call(net, TcpTerms(), TREE_STEPS, [0.0] * 4, ranks=4, cores=None, slow_net=slow,
                        slow_ranks={3})
    assert ring.all_terms_s == pytest.approx(4 * (ALPHA + 4 * BETA * 8000))
    with pytest.raises(ValueError, match="slow_ranks"):
        predict_call(net, TcpTerms(), TREE_STEPS, [0.0] * 4, ranks=4, cores=None, slow_net=slow)


@pytest.mark.parametrize("algorithm", ["tree", "butterfly"])
@pytest.mark.parametrize("world", [3, 4, 6])
def test_recorded_peers_pair_up_across_ranks(algorithm: str, world: int) -> None:
    """Every send a rank records is a receive of the same bytes its destination records from
    it, in the same order (both paths of the in-process gTop-k: the per-rank programs and the
    shared merges)."""
    import torch

    from gtopk_lab.comm.inprocess import sim_gtopk_allreduce

    numel, k = 400, 20
    gen = torch.Generator().manual_seed(world)
    values = [torch.randn(k, generator=gen) for _ in range(world)]
    indices = [torch.randperm(numel, generator=gen)[:k].sort().values for _ in range(world)]
    for programs in (True, False):
        stats = [r.stats for r in sim_gtopk_allreduce(values, indices, numel, k, algorithm, programs=programs)]
        for st in stats:
            assert len(st.peers) == len(st.steps) == st.rounds
            for (sent, recv), (dst, src) in zip(st.steps, st.peers):
                assert (dst is None) == (sent == 0) and (src is None) == (recv == 0)
        sends, recvs = sends_and_receives((st.steps, st.peers) for st in stats)
        assert sends == recvs, (programs, sends, recvs)
        assert any(sends.values())


@pytest.mark.timeout(60)
def test_a_saved_testbed_run_is_priced_again_with_the_current_model(tmp_path: Path) -> None:
    """benchmarks/tcp_model_reprice.py: a JSON log of benchmarks/tcp_model.py gives its error
    table again (every group and call counted) without a testbed; a run with its straggler's
    link calibrated is priced on that link (the same log without it, at the rates' ratio as
    older runs are, prices the straggler otherwise); no file is exit 2."""
    root = Path(__file__).resolve().parents[1]
    script = root / "benchmarks" / "tcp_model_reprice.py"
    calibrated = root / "benchmarks" / "logs" / "2026-12-07-tcp-model-straggler-link.json"
    run = json.loads(calibrated.read_text())
    assert "straggler_network" in run
    del run["straggler_network"]
    as_before = tmp_path / "ratio.json"
    as_before.write_text(json.dumps(run))
    done = subprocess.run([sys.executable, str(script), str(calibrated), str(as_before)], capture_output=True,
                          text=True, timeout=50, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    tables = done.stdout.split("# ")[1:]
    assert len(tables) == 2, done.stdout
    for table in tables:
        for group, calls in (("sweep, P = 2", 20), ("sweep, P = 4", 20), ("sweep, P = 8", 20), ("two jobs", 10),
                             ("straggler", 5)):
            assert f"| {group} | {calls} |" in table, table
    straggler = [next(line for line in t.splitlines() if line.startswith("| straggler |")) for t in tables]
    sweep = [next(line for line in t.splitlines() if line.startswith("| sweep, P = 8 |")) for t in tables]
    assert straggler[0] != straggler[1] and sweep[0] == sweep[1]
    assert subprocess.run([sys.executable, str(script)], capture_output=True, timeout=50, cwd=root).returncode == 2
