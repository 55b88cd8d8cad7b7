"""The timed cases of ``gtopk-lab calibrate --tcp-terms`` and ``benchmarks/tcp_model.py`` on real
gloo ranks (127.0.0.1): every case runs, and what it reports of each round (bytes and peers)
agrees across ranks.

Oracle: conservation written here: a send rank a records to rank b is a receive of the same
bytes that b records from a, in the same order; the incast's rank 0 receives every other
rank's payload in its one round.
"""

from __future__ import annotations

import pytest

from gtopk_lab.comm.launch import run_gloo
from peer_pairs import sends_and_receives

pytestmark = pytest.mark.timeout(180)
WORLD = 3


def _cases(rank: int, world: int) -> list[dict]:
    from gtopk_lab.worker.tcp_calls import CASE_COLLECTIVES, time_cases

    cases = [{"collective": c, "numel": 20_000, "density": 0.01, "repeats": 1} for c in CASE_COLLECTIVES]
    return time_cases(cases, rank, world)


def test_every_case_reports_rounds_whose_peers_pair_up() -> None:
    per_rank = run_gloo(_cases, WORLD, timeout_s=150)
    from gtopk_lab.worker.tcp_calls import CASE_COLLECTIVES

    for j, name in enumerate(CASE_COLLECTIVES):
        rows = [per_rank[r][j] for r in range(WORLD)]
        assert all(row["collective"] == name and row["median_s"] > 0 for row in rows), rows
        if name == "incast":
            assert [row["peers"] for row in rows] == [[], [[0, None]], [[0, None]]]
            assert rows[0]["steps"][0][1] == sum(row["steps"][0][0] for row in rows[1:])
            continue
        if all(not row["peers"] for row in rows):  # a library call (gloo's ring): peers unknown
            assert name == "ring_allreduce" or name == "topk_allgather", name
            continue
        sends, recvs = sends_and_receives((row["steps"], row["peers"]) for row in rows)
        assert sends and sends == recvs, (name, sends, recvs)
