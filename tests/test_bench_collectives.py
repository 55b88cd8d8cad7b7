"""`gtopk-lab bench collectives`: real gloo ranks, paced rounds, alpha-beta(-gamma) columns."""

from __future__ import annotations

import json

import pytest

from gtopk_lab.cli import main


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_throttled_bench_reports_both_models(capsys) -> None:
    rc = main(["bench", "collectives", "--workers", "2", "--numel", "200K", "--density", "0.01",
               "--repeats", "1", "--bandwidth", "10Mbps", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    probe = report["host_exchange_probe"]  # the host's stalls, measured before the table
    assert probe["mode"] == "isend/irecv" and probe["bytes"] == 200_000 and probe["calls"] == 20
    assert 0 <= probe["stall_share"] <= 1 and 0 < probe["p10_s"] <= probe["median_s"] <= probe["p90_s"]
    rows = report["collectives"]
    names = [(r["collective"], r["algorithm"]) for r in rows]
    assert names == [("dense_allreduce", "ring"), ("topk_allgather", "ring"),
                     ("gtopk_allreduce", "butterfly"), ("gtopk_allreduce", "tree")]
    for r in rows:
        assert r["median_s"] >= r["model_s"] > 0  # paced: never faster than the link
        assert r["model_abg_s"] >= r["model_abg_core_per_rank_s"] >= r["model_s"]
        assert r["gamma_loaded_s_per_element"] > 0 and r["gamma_idle_s_per_element"] > 0
        assert r["late_starts"] >= 0 and r["host_cores"] >= 1
        if r["collective"] == "dense_allreduce":  # no merges: no gamma
            assert r["gamma_s_per_element"] is None and r["model_abg_s"] == r["model_s"]
        else:  # gamma from the collective's own untimed calls
            assert r["gamma_s_per_element"] == r["gamma_in_collective_s_per_element"] > 0
    assert rows[1]["bytes_sent_per_rank"] == 2000 * 8  # exact count: no count allgather
    dense = rows[0]
    assert dense["model_s"] == pytest.approx(2 * 800_000 / 2 * 8 / 10e6)  # ring: 2 (P-1)/P * bytes


@pytest.mark.timeout(30)
def test_bench_rejects_bad_input(capsys) -> None:
    assert main(["bench", "collectives", "--gamma", "fast", "--bandwidth", "1Gbps"]) == 2
    assert "--gamma='fast' is invalid" in capsys.readouterr().err
    assert main(["bench", "collectives", "--latency", "1ms"]) == 2
    assert main(["bench", "collectives", "--workers", "0"]) == 2


@pytest.mark.timeout(60)
def test_exchange_probe_refuses_bad_arguments() -> None:
    from gtopk_lab.bench.stalls import exchange_times_rank, probe_exchange_stalls

    with pytest.raises(ValueError, match="calls=1"):
        probe_exchange_stalls(calls=1)
    with pytest.raises(ValueError, match="world_size=3"):
        exchange_times_rank(0, 3, [10], [0.0], 2)
