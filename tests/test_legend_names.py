"""plotting.legend_names: a series is named by its method plus only the fields that vary
between the shown series; the oracle is the names written out by hand, and a brute-force
check of "which fields vary" computed directly from the inputs."""

from __future__ import annotations

import itertools
import math

import pytest

from gtopk_lab.plotting.legend_names import (LEGEND_FIELDS, legend_name, legend_names, link_name,
                                             varied_legend_fields)


@pytest.mark.timeout(30)
def test_two_panel_studies_differ_in_rho_and_link_and_say_so() -> None:
    # the two studies: rho = 0.001 on 1GbE, then rho = 0.01 on 10GbE
    records = [{"method": m, "density": d, "bandwidth": link, "latency": "", "source": "simulated",
                "seeds": 1} for d, link in ((0.001, "1GbE"), (0.01, "10GbE")) for m in ("dense", "gtopk")]
    assert legend_names(records) == ["dense 1GbE", "gtopk ρ=0.001 1GbE", "dense 10GbE", "gtopk ρ=0.01 10GbE"]


@pytest.mark.timeout(30)
def test_one_study_shows_only_the_method_and_what_it_varies() -> None:
    one = [{"method": "dense", "density": 0.01, "bandwidth_bps": 8 / 9e-9, "latency_s": 0.436e-3,
            "source": "real", "seeds": 2},
           {"method": "gtopk", "density": 0.01, "bandwidth_bps": 8 / 9e-9, "latency_s": 0.436e-3,
            "source": "real", "seeds": 2}]
    assert legend_names(one) == ["dense", "gtopk"]
    # the source and the seed count varying: both named; dense's density never is
    mixed = one + [{**one[1], "source": "simulated", "seeds": 1}]
    assert legend_names(mixed) == ["dense real 2 seeds", "gtopk real 2 seeds", "gtopk simulated 1 seed"]
    # a density that differs only on dense (it selects nothing) is no difference
    assert legend_names([{**one[0], "density": 0.5}, one[1]]) == ["dense", "gtopk"]
    # the tables' -1 / NaN for "no density" is no value either
    assert legend_names([{**one[1], "density": -1.0}, {**one[1], "density": math.nan}]) == ["gtopk", "gtopk"]


@pytest.mark.timeout(30)
def test_links_are_named_by_their_preset_else_rate_and_latency() -> None:
    assert link_name(8 / 9e-9, 0.436e-3) == "1GbE"
    assert link_name(9.4e9, 50e-6) == "10GbE"
    assert link_name(float("inf"), 0.0) == link_name(None, None) == "unthrottled"
    assert link_name(8 / 9e-9, 5e-3) == "888.9 Mbit/s 5 ms"  # 1GbE's rate, another latency
    same_rate = [{"method": "gtopk", "bandwidth": "1GbE", "latency": ""},
                 {"method": "gtopk", "bandwidth": "1GbE", "latency": "5ms"}]
    assert legend_names(same_rate) == ["gtopk 1GbE", "gtopk 888.9 Mbit/s 5 ms"]


def _meaningless(field: str, method: str) -> bool:
    return (field == "density" and method == "dense") or (field == "algorithm" and method in ("dense", "topk"))


@pytest.mark.timeout(30)
def test_varied_fields_match_a_brute_force_oracle_over_a_grid() -> None:
    grid = {"method": ["dense", "topk", "gtopk"], "density": [0.001, 0.01], "bandwidth": ["1GbE", "10GbE"],
            "algorithm": ["butterfly", "tree"], "source": ["real", "simulated"], "seeds": [1, 2],
            "workers": [2, 4]}
    names = list(grid)
    every = [dict(zip(names, values)) for values in itertools.product(*grid.values())]
    for size in (1, 2, 3, 5):
        for start in range(0, len(every) - size, 37):
            records = every[start:start + size]
            # oracle: a field varies when two records that it means something to differ on it
            # (density and the pattern mean nothing to dense, the pattern nothing to Top-k's
            # allgather); the link is the bandwidth here
            want = []
            for field in LEGEND_FIELDS:
                key = "bandwidth" if field == "link" else field
                values = {r[key] for r in records if not _meaningless(field, r["method"])}
                if len(values) > 1:
                    want.append(field)
            assert varied_legend_fields(records) == want, records
            got = legend_names(records)
            assert all(name.split(" ")[0] == r["method"] for name, r in zip(got, records))
            # two series with different meaningful values never share a name
            meaningful = [tuple(sorted((k, v) for k, v in r.items() if not _meaningless(k, r["method"])))
                          for r in records]
            for a, b in itertools.combinations(range(len(records)), 2):
                if meaningful[a] != meaningful[b]:
                    assert got[a] != got[b], (records[a], records[b])
    assert legend_name({"method": "gtopk", "density": 0.01, "workers": 8}, ["density", "workers"]) == "gtopk ρ=0.01 P=8"
