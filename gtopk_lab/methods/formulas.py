"""The alpha-beta(-gamma) time and bytes-per-rank formulas of the built-in collectives.

Each is composed from the primitives of :mod:`gtopk_lab.network.formulas` and follows the
message pattern the collective actually runs (``a`` = alpha, ``b`` = beta, ``m`` = bytes per
sparse pair, 8 with int32 indices, 12 with int64, ``h`` = the 8-byte count header). The
family modules (:mod:`gtopk_lab.methods.dense`, :mod:`~gtopk_lab.methods.sparse`,
:mod:`~gtopk_lab.methods.oktopk`) attach one time and one bytes formula to each collective,
wrapped by :func:`checked`; ``Method.predicted_time_s`` reads them from the registry.
A network model with TCP terms (``NetworkModel.tcp``) adds them to every round: the
formulas price rounds with ``round_time_s`` / ``message_time_s``, or, where a closed form
needs one constant per round, with :func:`~gtopk_lab.network.formulas.exchange_alpha_beta`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from gtopk_lab.comm.oktopk import ALLGATHER_MODES, allreduce_rounds, bisection_rounds, bruck_rounds
from gtopk_lab.network.formulas import (
    DENSE_ELEMENT_BYTES, SPARSE_HEADER_BYTES, check_sizes, exchange_alpha_beta, log2_ceil, log2_floor,
    merge_contention, pair_bytes, tree_mergers,
)
from gtopk_lab.network.model import NetworkModel

__all__ = ["checked", "topk_allgather_time_s", "gtopk_butterfly_time_s", "gtopk_tree_time_s", "oktopk_time_s",
           "oktopk_phase_times_s", "oktopk_exact_time_s", "oktopk_model_time_s", "oktopk_paper_bound_time_s",
           "sparse_allreduce_lower_bound_time_s", "dense_bytes_per_rank", "allgather_bytes_per_rank",
           "gtopk_bytes_per_rank", "oktopk_bytes_per_rank", "oktopk_exact_bytes_per_rank"]


def checked(fn: Callable[..., float]) -> Callable[..., float]:
    """``fn(net, numel, k, workers, **kw)`` as a Collective's ``time_s``: the sizes checked
    first (``ValueError`` naming the field)."""
    @functools.wraps(fn)
    def time_s(net: Any, numel: int, k: int, workers: int, **kw: Any) -> float:
        check_sizes(numel, k, workers)
        return fn(net, numel, k, workers, **kw)
    return time_s


def topk_allgather_time_s(net: NetworkModel, numel: int, k: int, workers: int,
                          gamma_s_per_element: float = 0.0, host_cores: int | None = None,
                          counted: bool = True) -> float:
    """Top-k S-SGD as ``collectives.topk_allgather`` does it: two ring allgathers.

    First the 8-byte entry counts (P-1 rounds of ``h = 8`` bytes), then every rank's k
    pairs (P-1 rounds of ``m k`` bytes); then the P*k gathered pairs are summed:
    ``T = 2(P-1) a + (P-1)(h + m k) b + gamma * P * k * c(P)``, all P ranks summing at
    once (``c`` = :func:`merge_contention`, 1 with a core per rank). ``counted=False``
    (every count known: ``exact_count=k``) drops the count allgather:
    ``T = (P-1) (a + m k b) + gamma * P * k * c(P)``.
    """
    p = workers
    if p == 1:
        return 0.0
    m = pair_bytes(numel)
    count_round = (p - 1) * net.round_time_s(SPARSE_HEADER_BYTES, SPARSE_HEADER_BYTES) if counted else 0.0
    return (count_round + (p - 1) * net.round_time_s(m * k, m * k)
            + gamma_s_per_element * p * k * merge_contention(p, host_cores))


def gtopk_butterfly_time_s(net: NetworkModel, numel: int, k: int, workers: int,
                           gamma_s_per_element: float = 0.0, host_cores: int | None = None,
                           header: bool = True) -> float:
    """gTop-k by recursive doubling (butterfly), every rank merges.

    Power-of-two P: ``T = log2(P) * (a + b * (h + m k) + gamma * 2k)`` (each round every
    rank exchanges its current k pairs, behind an ``h = 8``-byte count header, with its
    partner and merges 2k -> k; ``gtopk_lab.comm.schedules.butterfly_schedule``).
    Other P (fold/unfold): with ``p' = 2^floor(log2 P)`` the ``P - p'`` extra ranks first
    send their k pairs to a partner inside the group (one round, merged there), the
    group runs the butterfly, then partners send the k-pair result back (one round):
    ``T = (log2(p') + 2) * (a + b * (h + m k)) + (log2(p') + 1) * gamma * 2k``.
    Message sizes are upper bounds: a merge of two vectors with fewer than k distinct
    indices sends fewer pairs. With ``host_cores`` each butterfly merge is multiplied by
    ``c(p')`` and the fold merge by ``c(P - p')`` (:func:`merge_contention`: that many
    ranks merge at once). ``header=False`` (exact-k rounds): ``h = 0``.
    """
    p = workers
    if p == 1:
        return 0.0
    m = pair_bytes(numel)
    rounds = log2_floor(p)
    inner = 1 << rounds
    folded = p != inner
    nbytes = SPARSE_HEADER_BYTES * header + m * k
    msg = net.round_time_s(nbytes, nbytes)  # an exchange with the partner
    merge = gamma_s_per_element * 2 * k
    return ((rounds + 2 * folded) * msg + rounds * merge * merge_contention(inner, host_cores)
            + folded * merge * merge_contention(p - inner, host_cores))


def gtopk_tree_time_s(net: NetworkModel, numel: int, k: int, workers: int,
                      gamma_s_per_element: float = 0.0, host_cores: int | None = None,
                      header: bool = True) -> float:
    """gTop-k as in the paper: binomial-tree reduce (merge) to rank 0, then broadcast.

    Rank 0 is on the critical path: ``ceil(log2 P)`` receive+merge rounds, then
    ``ceil(log2 P)`` broadcast sends of the k-pair result:
    ``T = 2 * ceil(log2 P) * (a + b * (h + m k)) + ceil(log2 P) * gamma * 2k``
    (``gtopk_lab.comm.schedules.tree_schedule``; ``h = 8`` header bytes).
    (The paper writes ``2 log2(P) a + 4 k log2(P) * 8 b``: it counts values and indices
    of a merge as two 2k-element messages.) With ``host_cores`` the merge of level j is
    multiplied by ``c(m_j)``, m_j the ranks that merge at that level (P/2, P/4, .., 1 for
    a power of two; :func:`merge_contention`). ``header=False`` (exact-k rounds): ``h = 0``.
    """
    p = workers
    if p == 1:
        return 0.0
    m = pair_bytes(numel)
    levels = log2_ceil(p)
    msg = net.message_time_s(SPARSE_HEADER_BYTES * header + m * k)  # one way: up the tree, then down
    merge = gamma_s_per_element * 2 * k
    return 2 * levels * msg + merge * sum(merge_contention(tree_mergers(p, j), host_cores)
                                          for j in range(1, levels + 1))


#: bytes of one count or boundary in Ok-Topk's small allreduces (int64)
_OKTOPK_COUNT_BYTES = 8


def oktopk_phase_times_s(net: NetworkModel, numel: int, k: int, workers: int, *, allgather: str = "plain",
                         kept: float | None = None, union: float | None = None,
                         imbalance: float = 1.0) -> dict[str, float]:
    """Per-call alpha-beta time of each phase of Ok-Topk as :mod:`gtopk_lab.comm.oktopk.program`
    runs it (``a`` = alpha, ``b`` = beta, ``h`` = 8-byte header, ``m`` bytes per pair, ``c`` = 8
    bytes per count, L = allreduce rounds, the Bruck sum over d = 1, 2, 4, .. < P)::

        reduce_scatter  (P-1) (a + (h + m k/P) b)                 every rank selects ~k, balanced regions
        allgather       sum_d (a + (h + m B_d) b)                  n = ``kept`` pairs (default k)
                        + L (a + (h + c P) b) + moves              balanced only
        reevaluation    the allgather of |U| = ``union`` pairs      (default min(P k, d): no overlap)
        repartition     L (a + (h + c P) b)
        warmup          2 (P-1) (a + (h + 4 ceil(d/P)) b)           dense ring allreduce

    Plain (Bruck): the owner of the largest block (``imbalance`` = largest / mean block, 1 =
    balanced) sends it in every round, ``B_d = n/P (min(d, P-d) - 1 + imbalance)``. Balanced:
    the largest block first gives away ``(imbalance - 1) n/P`` pairs in ``2 + ceil(imbalance - 1)``
    moves (2: blocks of equal expected size still differ by a few pairs, which go to the
    neighbours), then ``B_d = n/P min(d, P-d)``. Measured steps of skewed data show the rest.
    """
    if allgather not in ALLGATHER_MODES:
        raise ValueError(f"allgather={allgather!r} is invalid: expected one of {', '.join(ALLGATHER_MODES)}")
    if not imbalance >= 1.0:
        raise ValueError(f"imbalance={imbalance!r} is invalid: expected a number >= 1")
    p = workers
    names = ("reduce_scatter", "allgather", "reevaluation", "repartition", "warmup")
    if p == 1:
        return dict.fromkeys(names, 0.0)
    (a, b), h = exchange_alpha_beta(net), SPARSE_HEADER_BYTES
    m, c = pair_bytes(numel), _OKTOPK_COUNT_BYTES
    small_allreduce = allreduce_rounds(p) * (a + b * (h + c * p))

    def gather(total: float) -> float:
        block = total / p
        spans = [min(1 << j, p - (1 << j)) for j in range(bruck_rounds(p))]
        if allgather == "plain":
            return sum(a + b * (h + m * block * (span - 1 + imbalance)) for span in spans)
        given = (imbalance - 1.0) * block
        # blocks of equal expected size still differ a little: a move to each neighbour
        moves = min(p - 1, 2 + math.ceil(imbalance - 1.0 - 1e-12))
        return (small_allreduce + moves * (a + b * h) + b * m * given
                + sum(a + b * (h + m * block * span) for span in spans))

    u = min(p * k, numel) if union is None else union
    return {"reduce_scatter": (p - 1) * (a + b * (h + m * k / p)),
            "allgather": gather(k if kept is None else kept), "reevaluation": gather(u),
            "repartition": small_allreduce,
            "warmup": 2 * (p - 1) * (a + b * (h + DENSE_ELEMENT_BYTES * math.ceil(numel / p)))}


def oktopk_time_s(net: NetworkModel, numel: int, k: int, workers: int, gamma_s_per_element: float = 0.0, *,
                  allgather: str = "plain", tau: int = 32, tau_r: int = 64, kept: float | None = None,
                  union: float | None = None, imbalance: float = 1.0) -> float:
    """Ok-Topk (the ``oktopk`` method) per call after the warm-up, periodic rounds amortised::

        T = T_reduce_scatter + (1 - 1/tau) T_allgather + T_reevaluation / tau + T_repartition / tau_r

    (phases: :func:`oktopk_phase_times_s`; the warm-up calls cost its ``warmup`` entry, the
    dense allreduce). About ``(P - 1 + ceil(log2 P)) a + 2 k (P-1)/P m b`` plus the
    re-evaluation's ``|U| (P-1)/P m b / tau`` (up to ``k (P-1) m b / tau`` when the ranks'
    selections do not overlap). ``gamma`` unused: the selection is O(d) compute, not merging.
    """
    ph = oktopk_phase_times_s(net, numel, k, workers, allgather=allgather, kept=kept, union=union,
                              imbalance=imbalance)
    return (ph["reduce_scatter"] + (1.0 - 1.0 / tau) * ph["allgather"] + ph["reevaluation"] / tau
            + ph["repartition"] / tau_r)


def oktopk_exact_time_s(net: NetworkModel, numel: int, k: int, workers: int,
                        gamma_s_per_element: float = 0.0) -> float:
    """The ``oktopk-exact`` variant (:func:`oktopk_model_time_s`).

    Roughly ``(P-1 + 4L + ceil(log2 P)) a + 2k (P-1)/P * m b`` with L = log2(P) rounds per small
    allreduce: P-1 reduce-scatter rounds, a bisection for the exact global threshold, a Bruck
    allgather and an amortised re-balancing. ``gamma`` unused.
    """
    if workers == 1:
        return 0.0
    return oktopk_model_time_s(net, numel, k, workers)


def oktopk_paper_bound_time_s(net: NetworkModel, numel: int, k: int, workers: int,
                              gamma_s_per_element: float = 0.0) -> float:
    """Ok-Topk (Li & Hoefler, PPoPP'22) paper bound: ``(2P + 2 log2 P) a + 6k (P-1)/P * m b``.

    Split index space, sparse reduce-scatter, balanced allgather. ``gamma`` unused.
    """
    p = workers
    if p == 1:
        return 0.0
    m = pair_bytes(numel)
    return (2 * p + 2 * math.log2(p)) * net.latency_s + 6 * k * (p - 1) / p * m * net.beta_s_per_byte


def sparse_allreduce_lower_bound_time_s(net: NetworkModel, numel: int, k: int, workers: int,
                                        gamma_s_per_element: float = 0.0) -> float:
    """Bandwidth lower bound of any sparse allreduce of k pairs: ``2k (P-1)/P * m b``."""
    p = workers
    if p == 1:
        return 0.0
    return 2 * k * (p - 1) / p * pair_bytes(numel) * net.beta_s_per_byte


def oktopk_model_time_s(net: Any, numel: int, k: int, workers: int, rebalance_every: int = 16,
                        bins_per_region: int = 8, threshold_probes: int = 255) -> float:
    """Closed-form alpha-beta time of ``oktopk-exact`` (:func:`gtopk_lab.comm.oktopk.exact.oktopk_allreduce`),
    balanced regions.

    ``net`` is a :class:`~gtopk_lab.network.model.NetworkModel`. Per round the cost is
    ``alpha + beta * (h + bytes)`` (sent == received when balanced), h = 8::

        reduce-scatter: (P-1) rounds of k/P pairs
        threshold:      R * L rounds of c (probes+1) bytes (R = bisection_rounds, no ties)
        allgather:      Bruck round j carries min(2^j, P-2^j) blocks of k/P pairs
        re-balancing:   L rounds of c * min(numel, bins_per_region * P) bytes, / rebalance_every

    with m = 8 (12 at int64 indices) bytes per pair and c = 4 (8 when P*numel >= 2**31).
    Sum: ``~ (P - 1 + R L + ceil(log2 P)) alpha + 2 k (P-1)/P m beta`` plus small terms.
    Imbalance and ties make real calls slower (tests/benchmarks compare with measured steps).
    """
    p = workers
    if p == 1:
        return 0.0
    alpha, beta = exchange_alpha_beta(net)
    m = 8 if numel < 2**31 else 12
    c = 4 if p * numel < 2**31 else 8
    block = m * k / p
    L = allreduce_rounds(p)
    t = (p - 1) * (alpha + beta * (SPARSE_HEADER_BYTES + block))
    t += bisection_rounds(threshold_probes) * L * (alpha + beta * (SPARSE_HEADER_BYTES + c * (threshold_probes + 1)))
    d = 1
    while d < p:
        t += alpha + beta * (SPARSE_HEADER_BYTES + block * min(d, p - d))
        d *= 2
    nbins = min(numel, bins_per_region * p)
    t += L * (alpha + beta * (SPARSE_HEADER_BYTES + c * nbins)) / rebalance_every
    return t


# --- bytes one rank sends per call (payload pairs; headers and count rounds left out) -----
def dense_bytes_per_rank(numel: int, k: int, workers: int, pair_bytes: int = 8, algorithm: str | None = None) -> float:
    """Ring allreduce of d fp32: ``2 (P-1)/P * 4 d``."""
    p = workers
    return 0.0 if p == 1 else 2.0 * (p - 1) / p * DENSE_ELEMENT_BYTES * numel


def allgather_bytes_per_rank(numel: int, k: int, workers: int, pair_bytes: int = 8,
                             algorithm: str | None = None) -> float:
    """Allgather of k pairs per rank: ``(P-1) * k * m``."""
    return float((workers - 1) * k * pair_bytes)


def gtopk_bytes_per_rank(numel: int, k: int, workers: int, pair_bytes: int = 8,
                         algorithm: str | None = "butterfly") -> float:
    """gTop-k, mean over ranks. Butterfly, power-of-two P: ``log2(P) * k * m``; other P add the
    fold/unfold messages of the extra ranks. Tree (reduce + broadcast): ``2 (P-1)/P * k * m``."""
    p = workers
    if p == 1:
        return 0.0
    if algorithm == "tree":
        return 2.0 * (p - 1) / p * k * pair_bytes
    if algorithm not in (None, "butterfly"):
        raise ValueError(f"algorithm={algorithm!r} is invalid: expected 'butterfly' or 'tree'")
    p2 = 1 << (p.bit_length() - 1)
    extra = p - p2
    # each of the p2 group ranks sends log2(p2) messages; the extra ranks send one fold
    # message and their partners one unfold message each
    total = p2 * math.log2(p2) * k + 2 * extra * k
    return total / p * pair_bytes


def oktopk_bytes_per_rank(numel: int, k: int, workers: int, pair_bytes: int = 8, algorithm: str | None = None,
                          *, tau: int = 32, union: float | None = None) -> float:
    """Ok-Topk as implemented, amortised: ``(P-1)/P m (k + (1 - 1/tau) k + |U| / tau)`` (reduce-scatter,
    allgather of ~k kept pairs, the re-evaluation's allgather of the union |U| <= min(P k, d);
    small count/boundary rounds and data-balancing moves left out; the paper's bound is 6k (P-1)/P)."""
    p = workers
    if p == 1:
        return 0.0
    u = min(p * k, numel) if union is None else union
    return (p - 1) / p * pair_bytes * (k + (1.0 - 1.0 / tau) * k + u / tau)


def oktopk_exact_bytes_per_rank(numel: int, k: int, workers: int, pair_bytes: int = 8,
                                algorithm: str | None = None) -> float:
    """``oktopk-exact``: ``2 k (P-1)/P * m`` (balanced reduce-scatter + allgather, without
    the small count/threshold messages; the paper's bound is 6 k (P-1)/P)."""
    p = workers
    return 0.0 if p == 1 else 2.0 * k * (p - 1) / p * pair_bytes
