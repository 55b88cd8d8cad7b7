"""NetworkModel: parsing, presets, steps_time_s and the closed-form collective times."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from gtopk_lab.analysis.predict import collective_time_s
from gtopk_lab.analysis.predict import parse_count, parse_workers, predict_scaling
from gtopk_lab.network.formulas import SPARSE_HEADER_BYTES
from gtopk_lab.network.model import (
    PRESETS, NetworkModel, parse_bandwidth_bps, parse_latency_s,
)

GBPS = 1e9


# --- parsing -----------------------------------------------------------------------------
@pytest.mark.parametrize("text, bps", [
    ("1Gbps", 1e9), ("100Mbps", 1e8), ("2.5 Gbit/s", 2.5e9), ("10 kbps", 1e4),
    ("125MB/s", 1e9), ("1e9bps", 1e9), ("40gbit/s", 40e9),
])
def test_parse_bandwidth_rates(text: str, bps: float) -> None:
    assert parse_bandwidth_bps(text) == pytest.approx(bps, rel=1e-12)


@pytest.mark.parametrize("text, seconds", [
    ("0.5ms", 0.5e-3), ("50us", 50e-6), ("1e-4s", 1e-4), ("200ns", 200e-9), ("0", 0.0), ("2 s", 2.0),
    ("7µs", 7e-6),
])
def test_parse_latency(text: str, seconds: float) -> None:
    assert parse_latency_s(text) == pytest.approx(seconds, rel=1e-12)


def test_presets_use_documented_constants() -> None:
    gbe = NetworkModel.from_strings("1GbE")
    assert gbe.latency_s == pytest.approx(0.436e-3)
    assert gbe.beta_s_per_byte == pytest.approx(9e-9)  # 9e-6 ms/byte
    assert NetworkModel.from_strings("10GbE").bandwidth_bps > 9 * GBPS
    assert NetworkModel.from_strings("25GbE").bandwidth_bps > 20 * GBPS
    ib = NetworkModel.from_strings("100G-IB")
    assert ib.bandwidth_bps > 90 * GBPS and ib.latency_s < 10e-6
    for text in ("none", "unthrottled", "NONE"):
        m = NetworkModel.from_strings(text)
        assert m.unthrottled and m.beta_s_per_byte == 0.0 and m.steps_time_s([(10**9, 10**9)]) == 0.0
    assert set(PRESETS) == {"1GbE", "10GbE", "25GbE", "100G-IB", "none"}


def test_latency_overrides_preset_and_bare_rate_has_zero_latency() -> None:
    assert NetworkModel.from_strings("1Gbps").latency_s == 0.0
    assert NetworkModel.from_strings("1Gbps", "50us").latency_s == pytest.approx(50e-6)
    m = NetworkModel.from_strings("1GbE", "1ms")
    assert m.latency_s == pytest.approx(1e-3) and m.beta_s_per_byte == pytest.approx(9e-9)


@pytest.mark.parametrize("bandwidth, latency", [
    ("1GbE", None), ("1Gbps", "0.5ms"), ("2.5 Gbit/s", "50us"), ("none", None), ("100G-IB", "3us"),
    ("333Mbps", "1e-4s"),
])
def test_round_trips(bandwidth: str, latency: str | None) -> None:
    m = NetworkModel.from_strings(bandwidth, latency)
    assert NetworkModel.from_strings(*m.to_strings()) == m
    d = m.to_dict()
    assert NetworkModel.from_dict(json.loads(json.dumps(d))) == m
    assert NetworkModel.from_dict(d).name == m.name
    assert isinstance(str(m), str) and str(m)


@pytest.mark.parametrize("bandwidth, latency", [
    ("fast", None), ("", None), ("1 Gbpsx", None), ("-1Gbps", None), ("0Gbps", None),
    ("1GbE", "soon"), ("1Gbps", "5"), ("1Gbps", "-1ms"), ("missing_calibration.json", None),
])
def test_rejects_garbage_with_accepted_forms(bandwidth: str, latency: str | None) -> None:
    with pytest.raises(ValueError) as err:
        NetworkModel.from_strings(bandwidth, latency)
    msg = str(err.value)
    assert ("bandwidth=" in msg and "1GbE" in msg) or ("latency=" in msg and "ms" in msg)


def test_rejects_wrong_types() -> None:
    with pytest.raises(TypeError, match="bandwidth"):
        NetworkModel.from_strings(1e9)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="latency"):
        NetworkModel.from_strings("1Gbps", 0.001)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="latency_s"):
        NetworkModel(latency_s=-1.0, bandwidth_bps=1e9)
    with pytest.raises(ValueError, match="bandwidth_bps"):
        NetworkModel(latency_s=0.0, bandwidth_bps=0.0)


def test_calibration_json_is_a_preset(tmp_path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"alpha_s": 5e-5, "beta_s_per_byte": 1e-10, "backend": "gloo"}))
    m = NetworkModel.from_strings(str(path))
    assert m.latency_s == pytest.approx(5e-5) and m.beta_s_per_byte == pytest.approx(1e-10)
    assert m.name.startswith("calibrated")
    assert NetworkModel.from_strings(str(path), "1ms").latency_s == pytest.approx(1e-3)
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="bandwidth="):
        NetworkModel.from_strings(str(bad))


def test_config_accepts_network_strings() -> None:
    from gtopk_lab.config import RunConfig

    RunConfig(bandwidth="10GbE", latency="20us")
    with pytest.raises(ValueError, match="bandwidth"):
        RunConfig(bandwidth="10 GbE please")


# --- times -------------------------------------------------------------------------------------
def test_steps_time_is_alpha_plus_beta_max_direction() -> None:
    m = NetworkModel(latency_s=1e-3, bandwidth_bps=8e6)  # beta = 1 us per byte
    assert m.steps_time_s([]) == 0.0
    assert m.steps_time_s([(1000, 0)]) == pytest.approx(1e-3 + 1e-3)
    assert m.steps_time_s([(1000, 3000), (0, 0)]) == pytest.approx(2e-3 + 3e-3)


def _schedule_steps(algorithm: str, world: int, k: int) -> list[list[tuple[int, int]]]:
    """Per-rank steps implied by the project's schedule when every message holds k pairs."""
    from gtopk_lab.comm.schedules import sparse_schedule

    msg = SPARSE_HEADER_BYTES + 8 * k
    out = []
    for rank in range(world):
        steps = []
        for st in sparse_schedule(algorithm, rank, world):
            steps.append({"send": (msg, 0), "recv": (0, msg), "exchange": (msg, msg)}[st.op])
        out.append(steps)
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 33])
@pytest.mark.parametrize("algorithm", ["butterfly", "tree"])
def test_gtopk_formula_equals_schedule(world: int, algorithm: str) -> None:
    net = NetworkModel.from_strings("1GbE")
    k, numel = 1000, 100_000
    per_rank = _schedule_steps(algorithm, world, k)
    expected = max(net.steps_time_s(s) for s in per_rank)
    assert collective_time_s(net, "gtopk_allreduce", numel, k, world, algorithm) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 8])
def test_ring_formulas_equal_schedules(world: int) -> None:
    from gtopk_lab.comm.schedules import ring_allgather_steps, ring_allreduce_steps

    net = NetworkModel.from_strings("10GbE")
    numel, k = 1_000_003, 1000
    dense = net.steps_time_s(ring_allreduce_steps(4 * numel, world))
    assert collective_time_s(net, "dense", numel, k, world) == pytest.approx(dense, rel=1e-12)
    topk = net.steps_time_s(ring_allgather_steps(SPARSE_HEADER_BYTES, world)
                            + ring_allgather_steps(8 * k, world))
    assert collective_time_s(net, "topk_allgather", numel, k, world) == pytest.approx(topk, rel=1e-12)


def test_textbook_formulas_and_orderings() -> None:
    net = NetworkModel.from_strings("1GbE")
    a, b = net.alpha_s, net.beta_s_per_byte
    d, k, p = 25_000_000, 25_000, 8
    assert collective_time_s(net, "dense", d, k, p) == pytest.approx(2 * (p - 1) * (a + b * 4 * d / p))
    assert collective_time_s(net, "oktopk_paper_bound", d, k, p) == pytest.approx(
        (2 * p + 2 * math.log2(p)) * a + 6 * k * (p - 1) / p * 8 * b)
    # as implemented: within the paper's bound, above the bandwidth lower bound
    assert (collective_time_s(net, "lower_bound", d, k, p) < collective_time_s(net, "oktopk", d, k, p)
            <= collective_time_s(net, "oktopk_paper_bound", d, k, p))
    assert collective_time_s(net, "lower_bound", d, k, p) == pytest.approx(2 * k * (p - 1) / p * 8 * b)
    # gamma adds merge compute on the critical path: log2(P) merges of 2k for the butterfly
    g = 1e-9
    extra = collective_time_s(net, "gtopk_allreduce", d, k, p, "butterfly", g) - collective_time_s(net, "gtopk_allreduce", d, k, p)
    assert extra == pytest.approx(3 * 2 * k * g)
    # the target: butterfly gTop-k >= 30x faster than dense at 25M/0.001/P=8 on 1 Gbps
    gbps = NetworkModel.from_strings("1Gbps")
    assert collective_time_s(gbps, "dense", d, k, 8) >= 30 * collective_time_s(gbps, "gtopk_allreduce", d, k, 8)
    for w in (2, 4, 8, 16):
        assert (collective_time_s(net, "lower_bound", d, k, w) <= collective_time_s(net, "gtopk_allreduce", d, k, w)
                <= collective_time_s(net, "gtopk_allreduce", d, k, w, "tree"))


def test_collective_time_rejects_bad_input() -> None:
    net = NetworkModel.from_strings("1GbE")
    with pytest.raises(ValueError, match="collective="):
        collective_time_s(net, "allreduce-ish", 10, 1, 2)
    with pytest.raises(ValueError, match="algorithm="):
        collective_time_s(net, "gtopk_allreduce", 10, 1, 2, "ring")
    with pytest.raises(ValueError, match="k="):
        collective_time_s(net, "gtopk_allreduce", 10, 11, 2)
    with pytest.raises(ValueError, match="workers="):
        collective_time_s(net, "dense", 10, 1, 0)


# --- formula == measured CommStats.steps on real gloo ranks ---------------------------------------
def _measure_steps(rank: int, world: int, numel: int, k: int) -> dict[str, list[tuple[int, int]]]:
    import torch

    from gtopk_lab.collectives import dense_allreduce, gtopk_allreduce, topk_allgather

    gen = torch.Generator().manual_seed(1234 + rank)
    idx = torch.randperm(numel, generator=gen)[:k].sort().values.to(torch.int32)
    vals = torch.randn(k, generator=gen)
    out = {"dense": dense_allreduce(torch.ones(numel)).stats.steps,
           "topk": topk_allgather(vals, idx, numel).stats.steps}
    for algorithm in ("butterfly", "tree"):
        out[algorithm] = gtopk_allreduce(vals, idx, numel, k, algorithm=algorithm).stats.steps
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_formulas_match_measured_steps_on_gloo() -> None:
    from gtopk_lab.collectives import HEADER_BYTES
    from gtopk_lab.comm.launch import run_gloo

    assert HEADER_BYTES == SPARSE_HEADER_BYTES
    world, numel, k = 3, 6000, 200  # P = 3 exercises fold/unfold and a partial tree
    per_rank = run_gloo(_measure_steps, world, numel, k, timeout_s=60)
    net = NetworkModel.from_strings("1GbE")
    for name, collective, algorithm in (("dense", "dense", None), ("topk", "topk_allgather", None),
                                        ("butterfly", "gtopk_allreduce", "butterfly"),
                                        ("tree", "gtopk_allreduce", "tree")):
        measured = max(net.steps_time_s(r[name]) for r in per_rank)
        assert collective_time_s(net, collective, numel, k, world, algorithm) == pytest.approx(measured, rel=1e-12), name


# --- scaling predictions ------------------------------------------------------------------------
def test_parse_workers_and_counts() -> None:
    assert parse_workers("1,2,4,...,64") == [1, 2, 4, 8, 16, 32, 64]
    assert parse_workers("3, 1,2") == [1, 2, 3]
    assert parse_count("25M") == 25_000_000 and parse_count("1.5k") == 1500 and parse_count("270000") == 270000
    for bad in ("", "1,...", "0,2", "a"):
        with pytest.raises(ValueError, match="workers="):
            parse_workers(bad)
    with pytest.raises(ValueError, match="model_size="):
        parse_count("lots")


def test_predict_scaling_rows() -> None:
    rows = predict_scaling(25_000_000, 0.001, 0.15, NetworkModel.from_strings("1GbE"), [1, 2, 8, 32])
    by = {(r["method"], r["workers"]): r for r in rows}
    assert {r["method"] for r in rows} >= {"dense", "topk", "gtopk-butterfly", "gtopk-tree", "oktopk", "lower-bound"}
    for method in ("dense", "topk", "gtopk-butterfly"):
        assert by[(method, 1)]["scaling_efficiency"] == 1.0
    assert by[("dense", 32)]["scaling_efficiency"] < by[("topk", 32)]["scaling_efficiency"] \
        < by[("gtopk-butterfly", 32)]["scaling_efficiency"] <= by[("lower-bound", 32)]["scaling_efficiency"]
    r = by[("gtopk-tree", 8)]
    assert r["iteration_s"] == pytest.approx(r["compute_s"] + r["comm_s"])
    assert r["throughput_ratio"] == pytest.approx(8 * r["scaling_efficiency"])


@pytest.mark.timeout(60)
def test_model_scaling_cli() -> None:
    from gtopk_lab.cli import main

    cmd = [sys.executable, "-m", "gtopk_lab.cli", "model", "scaling", "--model-size", "25M", "--density",
           "0.001", "--compute-time", "0.15", "--bandwidth", "1GbE", "--workers", "1,2,4,...,32", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {r["workers"] for r in data["rows"]} == {1, 2, 4, 8, 16, 32}
    assert main(["model", "scaling", "--bandwidth", "warp-speed"]) == 2
    assert main(["model", "scaling", "--density", "0"]) == 2
    assert main(["model", "scaling", "--workers", "1,2"]) == 0


def test_inline_model_round_trips_and_labels() -> None:
    from gtopk_lab.network.model import bandwidth_label, portable_bandwidth

    model = NetworkModel(latency_s=4.5e-5, bandwidth_bps=14.5e9, name="calibrated:cal.json",
                         gamma_s_per_element=3e-8)
    text = model.to_inline()
    assert NetworkModel.from_strings(text) == model
    assert NetworkModel.from_strings(text, "1ms").latency_s == 1e-3
    assert NetworkModel.from_strings(NetworkModel.from_strings("none").to_inline()).unthrottled
    assert bandwidth_label(text) == "calibrated:cal.json" and bandwidth_label("1Gbps") == "1Gbps"
    assert portable_bandwidth("10GbE") == "10GbE" and portable_bandwidth(text) == text
    for bad in ("{bad", '{"x": 1}'):
        with pytest.raises(ValueError, match="bandwidth="):
            NetworkModel.from_strings(bad)


def test_portable_bandwidth_reads_a_calibration_file(tmp_path) -> None:
    from gtopk_lab.network.model import portable_bandwidth

    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"model": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9}}))
    inline = portable_bandwidth(str(cal))
    assert inline.startswith("{") and NetworkModel.from_strings(inline) == NetworkModel.from_json(cal)
    with pytest.raises(ValueError, match="no such calibration file"):
        portable_bandwidth(str(tmp_path / "missing.json"))


@pytest.mark.timeout(10)
def test_host_cores_time_share_concurrent_merges_only() -> None:
    from gtopk_lab.network.formulas import merge_contention, tree_mergers as _tree_mergers

    assert merge_contention(8, None) == 1.0 and merge_contention(2, 2) == 1.0
    assert merge_contention(8, 2) == 4.0
    assert [_tree_mergers(8, j) for j in (1, 2, 3)] == [4, 2, 1]
    assert [_tree_mergers(6, j) for j in (1, 2, 3)] == [3, 1, 1]
    net = NetworkModel.from_strings("1Gbps")
    d, k, g = 25_000_000, 25_000, 5e-8
    merge = g * 2 * k

    def t(coll: str, p: int, algo: str | None = None, cores: int | None = None) -> float:
        coll = {"gtopk": "gtopk_allreduce", "topk": "topk_allgather"}.get(coll, coll)  # counted calls
        return collective_time_s(net, coll, d, k, p, algo, g, host_cores=cores)

    # butterfly: every rank merges in each of log2 P rounds
    assert t("gtopk", 4, "butterfly", 2) == pytest.approx(t("gtopk", 4, "butterfly") + 2 * merge * (2 - 1))
    assert t("gtopk", 4, "butterfly", 4) == t("gtopk", 4, "butterfly")
    # tree: P/2, P/4, .. ranks merge per level
    assert t("gtopk", 4, "tree", 2) == t("gtopk", 4, "tree")
    assert t("gtopk", 8, "tree", 2) == pytest.approx(t("gtopk", 8, "tree") + merge * (2 - 1))
    # allgather: all P ranks sum P k entries at once
    assert t("topk", 4, None, 2) == pytest.approx(t("topk", 4) + g * 4 * k * (2 - 1))
    assert t("dense", 8, None, 1) == t("dense", 8)
    with pytest.raises(ValueError, match="host_cores=0"):
        t("gtopk", 4, "butterfly", 0)


@pytest.mark.timeout(10)
def test_exact_k_drops_headers_and_the_count_allgather() -> None:
    net = NetworkModel(latency_s=1e-4, bandwidth_bps=1e9)
    d, k, p = 1_000_000, 1000, 8
    a, b = net.latency_s, net.beta_s_per_byte
    assert (collective_time_s(net, "topk_allgather", d, k, p) - collective_time_s(net, "topk_allgather", d, k, p, exact_k=True)
            == pytest.approx((p - 1) * (a + 8 * b)))
    for algo, msgs in (("butterfly", 3), ("tree", 6)):
        assert (collective_time_s(net, "gtopk_allreduce", d, k, p, algo) - collective_time_s(net, "gtopk_allreduce", d, k, p, algo,
                                                                                        exact_k=True)
                == pytest.approx(msgs * 8 * b))
    with pytest.raises(TypeError, match="exact_k"):
        collective_time_s(net, "gtopk_allreduce", d, k, p, exact_k=1)
