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
    rows = json.loads(capsys.readouterr().out)["collectives"]
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
