"""Alpha-beta(-gamma) primitives that every collective's time formula is built from.

A message of n bytes costs ``alpha + beta n`` on a per-rank full-duplex link
(:class:`~gtopk_lab.network.model.NetworkModel`); a ring allreduce of a dense buffer is
the one library pattern modelled here. The formulas of the methods' collectives live in
:mod:`gtopk_lab.methods.formulas`, composed from these.
"""

from __future__ import annotations

from gtopk_lab.network.model import NetworkModel

__all__ = ["DENSE_ELEMENT_BYTES", "SPARSE_HEADER_BYTES", "check_sizes", "exchange_alpha_beta", "pair_bytes",
           "log2_floor", "log2_ceil", "merge_contention", "tree_mergers", "dense_ring_allreduce_time_s"]

#: Bytes per element of a dense fp32 gradient.
DENSE_ELEMENT_BYTES = 4
#: Bytes of the int64 count header before every sparse message (``comm.stats.HEADER_BYTES``).
SPARSE_HEADER_BYTES = 8


def check_sizes(numel: int, k: int, workers: int) -> None:
    """``numel``, ``k``, ``workers`` are integers >= 1 and ``k <= numel`` (ValueError naming the field)."""
    for fname, value, low in (("numel", numel, 1), ("k", k, 1), ("workers", workers, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{fname}={value!r} is invalid: expected an integer >= {low}")
    if k > numel:
        raise ValueError(f"k={k!r} is invalid: expected k <= numel ({numel})")


def exchange_alpha_beta(net: NetworkModel) -> tuple[float, float]:
    """``(a, b)`` such that an exchange round of ``n`` bytes each way costs ``a + b n`` on ``net``.

    Plain model (``net.tcp`` None): ``(alpha, beta)``, bitwise. With TCP terms: alpha plus the
    per-message CPU, beta times ``1 + duplex_beta_fraction`` (one sender a round; slow start and
    a shaper's burst, which depend on each message's size, are left to the formulas that price
    rounds with ``NetworkModel.round_time_s``). Closed forms whose rounds all send and receive
    alike use it.
    """
    if net.tcp is None:
        return net.latency_s, net.beta_s_per_byte
    return (net.latency_s + net.tcp.cpu_s_per_message,
            net.beta_s_per_byte * (1.0 + net.tcp.duplex_beta_fraction))


def pair_bytes(numel: int) -> int:
    """Bytes per sparse (value, index) pair: fp32 value + int32 index, int64 when numel >= 2**31."""
    return 4 + (4 if numel < 2**31 else 8)


def log2_floor(workers: int) -> int:
    """floor(log2 P): butterfly rounds inside the largest power-of-two group."""
    return workers.bit_length() - 1


def log2_ceil(workers: int) -> int:
    """ceil(log2 P): levels of a binomial tree over P ranks."""
    return (workers - 1).bit_length()


def merge_contention(concurrent_mergers: int, host_cores: int | None) -> float:
    """Slow-down of a merge phase that ``concurrent_mergers`` ranks run at once on ``host_cores``.

    ``max(1, m / cores)``: m CPU-bound merges time-share the cores of one host, each
    getting ``cores / m`` of a core. 1.0 when ``host_cores`` is None (a core per rank).
    Only the emulation of a P-rank cluster on fewer cores needs it; the gamma terms of
    the formulas below are multiplied by it, the alpha-beta terms are not (pacing
    sleeps, it does not compute).
    """
    if host_cores is None or concurrent_mergers <= host_cores:
        return 1.0
    return concurrent_mergers / host_cores


def tree_mergers(workers: int, level: int) -> int:
    """Ranks that receive and merge at ``level`` (1-based) of the binomial reduce to rank 0."""
    span, half = 1 << level, 1 << (level - 1)
    return sum(1 for r in range(0, workers, span) if r + half < workers)


def dense_ring_allreduce_time_s(net: NetworkModel, numel: int, k: int, workers: int,
                                gamma_s_per_element: float = 0.0) -> float:
    """Dense S-SGD, ring allreduce of ``d = numel`` fp32 values.

    ``T = 2(P-1) * (a + b * ceil(4 d / P))`` (reduce-scatter then allgather, P-1 rounds
    each, one chunk of ``ceil(4d/P)`` bytes sent and received per round, as in
    ``gtopk_lab.comm.schedules.ring_allreduce_steps``; with ``net.tcp`` each round adds its
    TCP terms, ``NetworkModel.round_time_s``). ``gamma`` is not applied (dense adds
    are bandwidth-bound, not merge-bound). ``k`` is ignored.
    """
    p = workers
    if p == 1:
        return 0.0
    chunk_bytes = -(-DENSE_ELEMENT_BYTES * numel // p)
    return 2 * (p - 1) * net.round_time_s(chunk_bytes, chunk_bytes)
