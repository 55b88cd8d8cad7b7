"""Predict a measured collective call with the TCP terms, and fit their constants (issue 28, item 4).

A call's prediction on one rank, from the rounds it really sent (``CommStats.steps``):

1. ``ab``: the calibrated alpha-beta time of the rounds, ``net.steps_time_s(steps)`` (what the
   virtual clock charges);
2. ``cpu``: the rank's off-wire CPU per call as the wall time it takes when every rank's
   starts together and the ranks share the cores they get
   (:func:`~gtopk_lab.network.cpu_contention.processor_sharing_s`): ``c s`` with
   ``s = max(1, P / cores)`` where the ranks' CPU is alike (ranks that outnumber the cores wait
   for one), less for a rank whose peers run out of work first (a tree's merging ranks once its
   leaves have sent). Another job's ranks on the same cores count by the share of the call
   they spend on a core (:func:`~gtopk_lab.network.cpu_contention.shared_contention`'s ``s``),
   which takes its part of the cores off this call's; plus the links' own I/O
   CPU where, stretched by ``s``, it outlasts the rank's alpha-beta time:
   ``max(0, io s - ab)``. The link's calibration (a ping-pong at one rank per core) prices
   that I/O inside alpha and beta, hidden under the wire; when ranks share cores it takes
   ``io s`` of wall time, and for latency-bound rounds (8 ranks on 2 cores, 8 kB
   messages: 0.5 ms of I/O a call against 1.4 ms of wire) the excess is on the critical
   path. Bandwidth-bound calls keep it under their wire (2 MB rounds: io s < ab);
3. ``tcp``: :class:`~gtopk_lab.network.tcp_terms.TcpTerms` per round, its per-message CPU also
   times ``s`` (posting and completing a message is CPU work too), plus incast when ``senders``
   hit one receiver in a round (its queue's drops, and its port kept busy). With
   ``serial_io_bytes`` (F) the links' I/O splits in two: the part spent on each message's
   first F bytes (:meth:`~gtopk_lab.network.tcp_terms.TcpTerms.serial_io_s`) runs in series
   with the wire, so it adds ``serial (s_io - 1)``, where ``s_io = max(1, (P / cores) a / P)``,
   ``a`` = the ranks exchanging in a round on average (every rank's rounds over the most
   rounds: P for a butterfly or a ring, fewer for a tree, whose levels pair some ranks
   only). Only the call's own ranks count: they exchange in lockstep, while another job's
   run at unrelated moments (counted by their share, as in step 2, they put the two-jobs
   calls 17-22% over). The rest of the I/O keeps step 2's ``max(0, rest s - wire)``.
   Latency-bound calls with more ranks than cores (8 kB messages, 4-8 ranks on 2 cores)
   had read 16-29% under without it.

The call's time is the largest over ranks (the slowest rank ends it). Where links differ (a
straggler's slower host), a round is priced on the slower network when either of its ends is
a slow rank (``CommStats.peers``): the critical path of a tree crosses the straggler's link in
its own rounds only, while a rank whose peers are unknown (a library ring: every round waits
for the slowest link) pays it in every round. :func:`fit_tcp_constants` fits
``cpu_s_per_message``, ``incast_s_per_sender``, ``duplex_beta_fraction`` and
``incast_beta_fraction`` by least squares on *relative* residuals (a 25M dense call of
seconds must not outweigh a 1M gTop-k call of milliseconds), each >= 0.
Cost: O(ranks x rounds) per call; the fit O(points).

Worker-side module: standard library and the network model only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from gtopk_lab.network.cpu_contention import cpu_contention, off_wire_wall_s, shared_contention
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.network.tcp_terms import TcpTerms

__all__ = ["CallPrediction", "FITTED", "fit_terms", "fit_tcp_constants", "merge_rank_reports", "predict_call", "predict_row"]


@dataclasses.dataclass(frozen=True)
class CallPrediction:
    """Seconds of one call: the alpha-beta rounds, + off-wire CPU, + the TCP terms (cumulative)."""

    ab_s: float
    ab_cpu_s: float
    all_terms_s: float
    #: rounds, incast senders and ``beta * sum(min(sent, recv))`` of the rank whose all-terms
    #: time is largest (what a fit weighs)
    rounds: int
    senders: int
    duplex_s: float
    #: the CPU contention ``s`` the call was priced at (step 2)
    contention: float = 1.0
    #: ``beta * sum(max(0, n - burst))`` of that rank's rounds with several senders (what a
    #: busy port's fraction of beta saves, per unit of the fraction)
    incast_beta_s: float = 0.0


def _slow_rounds(rank: int, peers: Sequence[Sequence[int | None]], rounds: int,
                 slow_ranks: Collection[int]) -> list[bool]:
    """Per round of ``rank``: does it cross a slow rank's link (the module docstring)?"""
    if rank in slow_ranks or len(peers) != rounds:
        return [True] * rounds
    return [any(p is not None and int(p) in slow_ranks for p in pair) for pair in peers]


def _cpu_wall_s(cpu_s_per_rank: Sequence[float], ranks: int, cores: float | None, s: float) -> list[float]:
    """Step 2's CPU term per rank: its off-wire CPU under processor sharing
    (:func:`~gtopk_lab.network.cpu_contention.off_wire_wall_s`) of the ``cores`` less the
    share another job takes (``s``, :func:`shared_contention`, over this call's own count)."""
    return off_wire_wall_s(cpu_s_per_rank, ranks, None if cores is None else cores * cpu_contention(ranks, cores) / s)


def predict_call(net: NetworkModel, tcp: TcpTerms, steps_per_rank: Sequence[Sequence[Sequence[int]]],
                 cpu_s_per_rank: Sequence[float], ranks: int, cores: float | None,
                 senders_per_rank: Sequence[int] | None = None, *, slow_net: NetworkModel | None = None,
                 slow_ranks: Collection[int] = (),
                 peers_per_rank: Sequence[Sequence[Sequence[int | None]]] | None = None,
                 other_ranks: int = 0, io_s_per_rank: Sequence[float] | None = None) -> CallPrediction:
    """Steps 1-3 of the module docstring, the largest over ranks for each column.

    ``steps_per_rank``: each rank's rounds ``(sent, recv)``; ``cpu_s_per_rank``: each rank's
    off-wire CPU per call; ``ranks`` share ``cores`` (None: a core per rank);
    ``senders_per_rank``: how many ranks send to that rank at once in its rounds (default 1).
    ``slow_net``: the network of the ``slow_ranks``' links; the all-terms column prices a
    round on it when the round crosses one of them (``peers_per_rank``: each rank's
    ``CommStats.peers``; a rank without them pays ``slow_net`` in every round). The other
    columns stay on ``net``. ``other_ranks``: ranks of another job on the same ``cores``,
    running calls like this one (step 2); ``io_s_per_rank``: each rank's CPU inside the
    links' calls per call (step 2's exposed I/O; None: none).
    """
    if len(steps_per_rank) != len(cpu_s_per_rank) or not steps_per_rank:
        raise ValueError("steps_per_rank and cpu_s_per_rank are invalid: expected one entry per rank")
    if slow_net is not None and not slow_ranks:
        raise ValueError("slow_ranks is invalid: expected the ranks on slow_net's links")
    pairs_per_rank = [[(int(a), int(b)) for a, b in steps] for steps in steps_per_rank]
    ab_per_rank = [net.ab_steps_time_s(pairs) for pairs in pairs_per_rank]
    s = shared_contention(ranks, cores, other_ranks, max(float(c) for c in cpu_s_per_rank), max(ab_per_rank))
    # the share of the call's rounds in which a rank exchanges, a / P (ranks not listed count as the mean)
    exchanging = sum(len(p) for p in pairs_per_rank) / len(pairs_per_rank) / max(1, max(map(len, pairs_per_rank)))
    s_io = max(1.0, cpu_contention(ranks, cores) * exchanging)
    scaled = dataclasses.replace(tcp, cpu_s_per_message=tcp.cpu_s_per_message * s)
    cpu_wall = _cpu_wall_s(cpu_s_per_rank, ranks, cores, s)
    ab = ab_cpu = best = duplex = incast_beta = 0.0
    rounds = senders = 0
    for r, (pairs, t_ab) in enumerate(zip(pairs_per_rank, ab_per_rank)):
        n_send = 1 if senders_per_rank is None else int(senders_per_rank[r])
        io = float(io_s_per_rank[r]) if io_s_per_rank is not None else 0.0
        cpu = cpu_wall[r]
        t_cpu = t_ab + cpu + max(0.0, io * s - t_ab)
        peers = peers_per_rank[r] if peers_per_rank is not None else ()
        slow = _slow_rounds(r, peers, len(pairs), slow_ranks) if slow_net is not None else [False] * len(pairs)
        wire = sum(scaled.steps_time_s(slow_net if crosses else net, [pair], [n_send])
                   for pair, crosses in zip(pairs, slow))
        serial = tcp.serial_io_s(io, pairs)
        t_all = wire + cpu + serial * (s_io - 1.0) + max(0.0, (io - serial) * s - wire)
        ab, ab_cpu = max(ab, t_ab), max(ab_cpu, t_cpu)
        if t_all >= best:
            best, rounds, senders = t_all, len(pairs), n_send
            duplex = net.beta_s_per_byte * sum(min(a, b) for a, b in pairs)
            incast_beta = (net.beta_s_per_byte * sum(tcp.past_burst_bytes(a, b) for a, b in pairs)
                           if n_send > 1 else 0.0)
    return CallPrediction(ab, ab_cpu, best, rounds, senders, duplex, s, incast_beta)


#: the constants :func:`fit_tcp_constants` fits, and the point key of each one's units
FITTED = (("cpu_s_per_message", "message_units"), ("incast_s_per_sender", "incast_units"),
          ("duplex_beta_fraction", "duplex_units"), ("incast_beta_fraction", "incast_beta_units"))


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[piv][c]) < 1e-300:
            return None
        m[c], m[piv] = m[piv], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit_tcp_constants(points: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The :data:`FITTED` constants (each >= 0) from measured calls (P <= 4 only).

    Each point: ``measured_s``, ``base_s`` (its prediction with every fitted constant 0) and,
    per constant, its units (:data:`FITTED`: rounds x contention ``s``, ``senders - 1``,
    ``beta * sum(min(sent, recv))`` and ``- beta * sum(max(0, n - burst))`` of several senders'
    rounds, of the critical rank; a missing key counts 0).

    1. Residual ``d = measured - base``; every term divided by ``measured`` (a relative fit).
    2. For every subset of the constants (at most 2**4), least squares of ``d`` on those
       units (normal equations); keep the subsets whose constants are all >= 0 (and a busy
       port's fraction < 1).
    3. The kept subset with the smallest squared residual wins (non-negative least squares by
       enumeration; the others are 0). Cost: O(16 x points).
    """
    if not points:
        raise ValueError("points is invalid: expected at least one measured call")
    rows = []
    for p in points:
        t = float(p["measured_s"])
        if not t > 0:
            raise ValueError(f"measured_s={t!r} is invalid: expected seconds > 0")
        rows.append(((t - float(p["base_s"])) / t, [float(p.get(key, 0.0)) / t for _, key in FITTED]))
    best: tuple[float, list[float]] = (sum(d * d for d, _ in rows), [0.0] * len(FITTED))
    for mask in range(1, 1 << len(FITTED)):
        cols = [j for j in range(len(FITTED)) if mask >> j & 1]
        a = [[sum(u[i] * u[j] for _, u in rows) for j in cols] for i in cols]
        b = [sum(d * u[i] for d, u in rows) for i in cols]
        sol = _solve(a, b)
        if sol is None or any(x < 0 for x in sol) or any(
                FITTED[j][0] == "incast_beta_fraction" and x >= 1 for j, x in zip(cols, sol)):
            continue
        full = [0.0] * len(FITTED)
        for j, x in zip(cols, sol):
            full[j] = x
        sse = sum((d - sum(c * x for c, x in zip(full, u))) ** 2 for d, u in rows)
        if sse < best[0]:
            best = (sse, full)
    return {name: value for (name, _), value in zip(FITTED, best[1])}


def merge_rank_reports(per_rank: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per case from every rank's timed cases (``gtopk_lab.worker.tcp_calls``):
    the slowest rank's median, the fewest cores any rank saw, every rank's rounds, off-wire CPU
    and (for the log) CPU in the TCP links' I/O."""
    rows = []
    for j, case in enumerate(per_rank[0]):
        per = [r[j] for r in per_rank]
        rows.append({**{k: case[k] for k in ("collective", "numel", "density", "workers")},
                     "median_s": case["median_s"], "slowest_s": case["slowest_s"],
                     "cores": min(p["available_cores"] for p in per),
                     "steps": [p["steps"] for p in per], "cpu_s": [p["cpu_s"] for p in per],
                     "io_cpu_s": [p.get("io_cpu_s", 0.0) for p in per],
                     "peers": [p.get("peers", []) for p in per]})
    return rows


def predict_row(net: NetworkModel, tcp: TcpTerms, row: dict[str, Any], host_cores: float,
                ranks_on_box: int | None = None, link: NetworkModel | None = None,
                slow_ranks: Collection[int] = (), other_ranks: int = 0) -> dict[str, float]:
    """:func:`predict_call` of a merged row: ``ab_s``, ``ab_cpu_s``, ``all_s`` and the units a fit
    weighs (``base_s``, ``message_units``, ``incast_units``, ``duplex_units``,
    ``incast_beta_units``).

    ``ranks_on_box``: the ranks sharing the cores in lockstep (default the row's P);
    ``other_ranks``: another job's ranks on them (:func:`predict_call`); the cores they all
    get are the row's probe scaled to them, at most ``host_cores``; ``link``: the slower network of the
    ``slow_ranks`` (a straggler's host), which the all-terms column prices the rounds that
    cross them on (:func:`predict_call`). An ``incast`` row has P - 1 senders into rank 0.
    """
    p = int(row["workers"])
    ranks = p if ranks_on_box is None else ranks_on_box
    cores = min(float(row["cores"]) * (ranks + other_ranks) / p, float(host_cores))
    senders = [p - 1] + [1] * (p - 1) if row["collective"] == "incast" else None
    io = row.get("io_cpu_s")
    base = predict_call(net, TcpTerms(), row["steps"], row["cpu_s"], ranks, cores, senders, other_ranks=other_ranks,
                        io_s_per_rank=io)
    full = predict_call(net, tcp, row["steps"], row["cpu_s"], ranks, cores, senders, slow_net=link,
                        slow_ranks=slow_ranks, peers_per_rank=row.get("peers"), other_ranks=other_ranks,
                        io_s_per_rank=io)
    return {"ab_s": base.ab_s, "ab_cpu_s": base.ab_cpu_s, "all_s": full.all_terms_s, "base_s": base.ab_cpu_s,
            "message_units": base.rounds * base.contention, "incast_units": base.senders - 1,
            "duplex_units": base.duplex_s, "incast_beta_units": -full.incast_beta_s}


def fit_terms(net: NetworkModel, rows: Sequence[dict[str, Any]], host_cores: float) -> TcpTerms:
    """The :class:`TcpTerms` of :func:`fit_tcp_constants` on merged rows, each priced by
    :func:`predict_row` with the fitted constants zero and the others as ``net.tcp`` has them
    (a shaper's burst from the link's calibration, slow start's constants; defaults without
    ``net.tcp``), which the result keeps. ``serial_io_bytes`` is the TCP initial window
    (``init_window_bytes``) when a row measured the links' I/O, else 0 (nothing to split)."""
    measured_io = any(float(x) > 0 for r in rows for x in (r.get("io_cpu_s") or ()))
    fixed = dataclasses.replace(net.tcp or TcpTerms(), **{name: 0.0 for name, _ in FITTED})
    fixed = dataclasses.replace(fixed, serial_io_bytes=fixed.init_window_bytes if measured_io else 0.0)
    points = []
    for r in rows:
        point = predict_row(net, fixed, r, host_cores)
        points.append({**point, "base_s": point["all_s"], "measured_s": r["median_s"]})
    return dataclasses.replace(fixed, **fit_tcp_constants(points))
