"""`gtopk-lab bench collectives`: real gloo ranks, paced rounds, alpha-beta(-gamma) columns."""

from __future__ import annotations

import json

import pytest

from gtopk_lab.cli import main
from gtopk_lab.network.cpu_contention import off_wire_cpu_s


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
        # the cores the ranks got (other jobs take the rest): never more than the host's
        assert 0 < r["available_cores"] <= r["host_cores"] and r["model_abg_s"] >= r["model_abg_idle_host_s"]
        if r["collective"] == "dense_allreduce":  # no merges: no gamma
            assert r["gamma_s_per_element"] is None and r["model_abg_s"] == r["model_s"]
        else:  # gamma from the collective's own untimed calls
            assert r["gamma_s_per_element"] == r["gamma_in_collective_s_per_element"] > 0
        if r["collective"] == "gtopk_allreduce":  # profiled: + the ranks' off-wire CPU sharing the cores
            a, b = sorted(off_wire_cpu_s(rank["phases_cpu_s"]) for rank in r["profile"]["ranks"])
            c = r["available_cores"]
            # two ranks by hand: both at min(1, c / 2) until the lighter ends, then the other at min(1, c)
            first = a / min(1.0, c / 2)
            assert r["off_wire_cpu_s"] == b > 0
            assert r["model_abgc_s"] == pytest.approx(r["model_abg_s"] + first + (b - a) / min(1.0, c))
            assert r["measured_vs_abgc"] == pytest.approx(r["median_s"] / r["model_abgc_s"])
        else:  # no profile: no off-wire term
            assert "model_abgc_s" not in r
        # + the probed wake-up delay per dependent round x the rounds on the critical path
        # (P = 2: butterfly 1 exchange, tree 1 up + 1 down, library collectives 1 paced wait)
        rounds = 2 if r["algorithm"] == "tree" else 1
        assert r["wakeup_delay_s"] > 0 and r["wakeup_delay_mean_s"] > 0
        assert r["model_abgw_s"] == pytest.approx(r["model_abg_s"] + rounds * r["wakeup_delay_s"])
        assert r["measured_vs_abgw"] == pytest.approx(r["median_s"] / r["model_abgw_s"])
    assert rows[1]["bytes_sent_per_rank"] == 2000 * 8  # exact count: no count allgather
    dense = rows[0]
    assert dense["model_s"] == pytest.approx(2 * 800_000 / 2 * 8 / 10e6)  # ring: 2 (P-1)/P * bytes


@pytest.mark.timeout(30)
def test_bench_rejects_bad_input(capsys) -> None:
    assert main(["bench", "collectives", "--gamma", "fast", "--bandwidth", "1Gbps"]) == 2
    assert "--gamma='fast' is invalid" in capsys.readouterr().err
    assert main(["bench", "collectives", "--latency", "1ms"]) == 2
    assert main(["bench", "collectives", "--workers", "0"]) == 2
    assert main(["bench", "collectives", "--profile-repeats", "-1"]) == 2
    assert "--profile-repeats=-1 is invalid" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_exchange_probe_refuses_bad_arguments() -> None:
    from gtopk_lab.bench.stalls import exchange_times_rank, probe_exchange_stalls

    with pytest.raises(ValueError, match="calls=1"):
        probe_exchange_stalls(calls=1)
    with pytest.raises(ValueError, match="world_size=3"):
        exchange_times_rank(0, 3, [10], [0.0], 2)


@pytest.mark.timeout(120)
def test_profile_columns_sum_to_the_call_time(capsys) -> None:
    """Unthrottled P=2: every gTop-k row carries its profile; per rank the phases add up to
    about the call's wall time (the rest is generator hand-offs), and both tables print."""
    from gtopk_lab.comm.profiling import PHASES, ROUND_PHASES

    rc = main(["bench", "collectives", "--workers", "2", "--numel", "100K", "--density", "0.01",
               "--repeats", "2", "--profile-repeats", "5", "--json"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)["collectives"]
    assert [("profile" in r) for r in rows] == [False, False, True, True]
    for r in rows[2:]:
        prof = r["profile"]
        assert prof["algorithm"] == r["algorithm"] and prof["workers"] == 2 and prof["calls"] == 5
        labels = [rnd["label"] for rnd in prof["rounds"]]
        assert labels == (["butterfly exchange"] if r["algorithm"] == "butterfly"
                          else ["reduce recv / reduce send", "broadcast send / broadcast recv"])
        for rnd in prof["rounds"]:
            assert all(rnd[f"{p}_s"] >= 0 for p in ROUND_PHASES) and rnd["ranks"] == 2
        assert len(prof["ranks"]) == 2
        for rank in prof["ranks"]:
            assert set(rank["phases_s"]) == set(PHASES)
            assert rank["phases_s"]["sendrecv"] > 0 and rank["phases_s"]["prep"] > 0
            # the phases never cover more than the call; they cover most of it, but a busy
            # host can preempt the rank between two phases, so most of the best call
            shares = rank["phases_share_per_call"]
            assert len(shares) == 5 and all(0 < s <= 1.05 for s in shares)
            assert rank["phases_sum_s"] <= 1.05 * rank["wall_s"] + 1e-4
            assert max(shares) >= 0.5, shares
            assert 0 < rank["thread_cpu_s"] <= rank["process_cpu_s"] + 1e-3
        merges = prof["phases_mean_s"]["merge"]
        assert merges > 0  # rank 0 merges in both patterns at P = 2
        # critical path: the slowest rank per call; virtual = 10GbE alpha-beta + merge CPU,
        # at least one 50 us message per round of the slowest rank
        assert prof["thread_cpu_max_s"] >= min(rank["thread_cpu_s"] for rank in prof["ranks"])
        assert prof["virtual_link"] == "10GbE" and prof["virtual_s"] >= 50e-6 * len(prof["rounds"])
    # the text tables print from the same rows
    from gtopk_lab.bench.tables import print_profile

    print_profile(rows, cores=2)
    out = capsys.readouterr().out
    assert "# where the time goes" in out and "# per-rank CPU vs wall" in out
    assert "1: butterfly exchange" in out and "sum of phases" in out
    assert "max thread" in out and "virtual" in out and "on 10GbE" in out


def _profiled_and_plain_rank(rank: int, world_size: int) -> list[dict]:
    """Both patterns, with and without the count header: a plain call, then a profiled one."""
    import torch

    from gtopk_lab.comm.profiling import profiling
    from gtopk_lab.comm.torch_dist import gtopk_allreduce
    from gtopk_lab.compression.selection import get_selector

    x = torch.randn(5000, generator=torch.Generator().manual_seed(rank))
    v, i = get_selector("topk")(x, 50)
    out = []
    for algorithm in ("butterfly", "tree"):
        for exact_k in (True, False):
            plain = gtopk_allreduce(v, i, 5000, 50, algorithm=algorithm, exact_k=exact_k)
            with profiling() as prof:
                profiled = gtopk_allreduce(v, i, 5000, 50, algorithm=algorithm, exact_k=exact_k)
            out.append({"same": bool(torch.equal(plain.values, profiled.values)
                                     and torch.equal(plain.indices, profiled.indices)
                                     and torch.equal(plain.stats.dropped_values, profiled.stats.dropped_values)),
                        "steps": plain.stats.steps == profiled.stats.steps,
                        "rounds": len(prof.rounds), "stats_rounds": plain.stats.rounds,
                        "totals": prof.totals()})
    return out


@pytest.mark.timeout(120)
def test_profiling_hooks_do_not_change_results() -> None:
    """Results, drops and steps are the same with the hooks on; one profile round per
    schedule step, for both patterns and the header path (exact_k=False) too."""
    from gtopk_lab.comm.launch import run_gloo

    for per_rank in run_gloo(_profiled_and_plain_rank, 2, timeout_s=60):
        assert len(per_rank) == 4
        for out in per_rank:
            assert out["same"] and out["steps"]
            assert out["rounds"] == out["stats_rounds"]
            assert out["totals"]["sendrecv"] > 0 and out["totals"]["pack"] > 0


def test_no_profile_outside_a_profiling_block() -> None:
    from gtopk_lab.comm.profiling import RoundProfile, active_profile, profiling

    assert active_profile() is None
    mine = RoundProfile()
    with profiling(mine) as prof:
        assert prof is mine and active_profile() is mine
        prof.stop("merge", prof.stamp())  # no open round: a per-call entry
    assert active_profile() is None
    assert set(mine.call) == {"merge", "merge_cpu"} and mine.totals()["merge"] >= 0
