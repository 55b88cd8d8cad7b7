"""Alpha and beta of the link between two workers of a Dask cluster (client side).

:func:`calibrate_cluster` is ``gtopk-lab calibrate --scheduler ADDRESS``:

1. picks two workers on different hosts (the first two by address, whose host parts
   differ), or the two it is given;
2. submits :func:`gtopk_lab.worker.link_task.calibrate_link_rank` to each, pinned to it,
   under one fresh rendezvous key: the two tasks form a gloo group bound to the workers'
   own interfaces and ping-pong every size (:mod:`gtopk_lab.network.calibrate`, steps 2-3);
3. fits ``t(n) = alpha + beta n`` to rank 0's medians
   (:func:`~gtopk_lab.network.calibrate.result_from_medians`) and returns the
   :class:`~gtopk_lab.network.calibrate.CalibrationResult` with the two workers as its
   ``endpoints``. Saved with ``--out FILE``, the file is a network for ``--bandwidth FILE``
   (``gtopk-lab run``, ``model``, the virtual clock);
4. with ``fit_tcp`` the two tasks also time :data:`TCP_FIT_CASES` (P = 2 collective calls,
   :mod:`gtopk_lab.worker.tcp_calls`) and the result carries the TCP terms fitted on them
   (:func:`gtopk_lab.network.tcp_fit.fit_terms`: per-message CPU and duplex; incast needs
   more than one sender and stays 0), which the saved file's model then charges.

Cost: one task per worker; the bytes of the ping-pong on the link (with the default sizes
about 2 x 12 x 17.1 MB, 1.6 s at 1 Gbit/s).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from typing import Any

from distributed import Variable, wait

from gtopk_lab.network.calibrate import DEFAULT_SIZES_BYTES, CalibrationResult, result_from_medians
from gtopk_lab.network.tcp_fit import fit_terms, merge_rank_reports
from gtopk_lab.worker.link_task import calibrate_link_rank
from gtopk_lab.worker.rank_task import rendezvous_name

__all__ = ["TCP_FIT_CASES", "calibrate_cluster", "pick_link"]

#: the calls ``--tcp-terms fit`` times on the link (a few seconds at 200 Mbit/s): latency- and
#: bandwidth-bound rounds, one-way (tree) and exchanges (butterfly, allgather, ring)
TCP_FIT_CASES: tuple[dict[str, Any], ...] = (
    {"collective": "ring_allreduce", "numel": 1_000_000, "density": 0.01, "repeats": 3},
    *({"collective": c, "numel": 1_000_000, "density": d, "repeats": 5}
      for d in (0.001, 0.01) for c in ("topk_allgather", "gtopk_butterfly", "gtopk_tree")),
)


def _host(address: str) -> str:
    return address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")


def pick_link(addresses: Sequence[str]) -> list[str]:
    """The first two worker addresses (sorted) whose hosts differ; ValueError when the
    cluster has no two workers on different hosts."""
    ordered = sorted(addresses)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            if _host(a) != _host(b):
                return [a, b]
    raise ValueError(f"the cluster has {len(ordered)} worker(s) on "
                     f"{len({_host(a) for a in ordered})} host(s): a link calibration needs two "
                     "workers on different hosts")


def calibrate_cluster(client: Any, workers: Sequence[str] | None = None,
                      sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, repeats: int = 10,
                      warmup: int = 2, timeout_s: float = 60.0, fit_tcp: bool = False) -> CalibrationResult:
    """Ping-pong between two workers of ``client``'s cluster and fit alpha/beta (module doc)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} is invalid: expected an integer >= 1")
    sizes = [int(s) for s in sizes_bytes]
    if len(set(sizes)) < 2 or min(sizes) < 1:
        raise ValueError(f"sizes_bytes={sizes!r} is invalid: expected >= 2 distinct sizes >= 1 byte")
    known = sorted(client.scheduler_info(n_workers=-1)["workers"])
    if workers is None:
        pair = pick_link(known)
    else:
        pair = list(workers)
        if len(pair) != 2 or any(w not in known for w in pair):
            raise ValueError(f"workers={pair!r} is invalid: expected two of this cluster's workers "
                             f"({', '.join(known)})")
    key = f"calibrate-{uuid.uuid4().hex[:12]}"
    start = time.perf_counter()
    cases = [dict(c) for c in TCP_FIT_CASES] if fit_tcp else None
    futures = [client.submit(calibrate_link_rank, rank, 2, key, sizes, repeats, warmup, timeout_s, cases,
                             workers=[w], allow_other_workers=False, pure=False, key=f"{key}-{rank}")
               for rank, w in enumerate(pair)]
    try:
        # each task bounds its own waits by timeout_s; this only guards a lost worker
        wait(futures, timeout=2 * timeout_s + 60)
        outputs = client.gather(futures, errors="raise")
    finally:
        client.cancel(futures)
        _drop_variable(client, key)
    reports = {out["rank"]: out["medians_s"] for out in outputs}
    result = dataclasses.replace(
        result_from_medians(reports, sizes, backend="gloo", repeats=repeats,
                            wall_s=time.perf_counter() - start, endpoints=pair),
        transport=outputs[0].get("transport"))
    if fit_tcp:
        ordered = sorted(outputs, key=lambda out: out["rank"])
        rows = merge_rank_reports([out["tcp_cases"] for out in ordered])
        # the two ranks get at most a core each: on two machines, s = 1
        result = dataclasses.replace(result, tcp=fit_terms(result.model, rows, host_cores=2.0),
                                     tcp_cases=rows)
    return result


def _drop_variable(client: Any, key: str) -> None:
    try:
        Variable(rendezvous_name(key), client=client).delete()
    except Exception:  # the scheduler may be gone already; nothing to keep
        pass
