"""In-process versions of the collectives for the single-process simulator.

P virtual ranks live in one process; each function takes one input per virtual rank and
returns one :class:`~gtopk_lab.comm.stats.CollectiveResult` per virtual rank, with the same
values and the same CommStats (bytes, messages, rounds, steps, drops) the real rank would
report. gTop-k can run the very same per-rank program
(:func:`gtopk_lab.comm.programs.gtopk_program`, built on :mod:`gtopk_lab.comm.schedules` and
``merge_sparse``) under the same recorder, over in-process transports
(:func:`gtopk_lab.comm.transport.run_programs`) instead of torch.distributed, so results are
bitwise equal to gloo runs; by default it makes each of their merges once instead
(:mod:`gtopk_lab.comm.sim_gtopk`: P - 1 merges instead of P log2 P, the same results and
stats, tested against the programs). ``merge_cpu_s`` is measured here, so it differs.

Example::

    results = sim_gtopk_allreduce(values_list, indices_list, numel, k, "butterfly")
    G = results[0].values, results[0].indices   # identical on every virtual rank
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from gtopk_lab.comm.programs import allgather_assemble, allgather_ring_stats, dense_stats, gtopk_program
from gtopk_lab.comm.recorder import Recorder
from gtopk_lab.comm.sim_gtopk import sim_gtopk_shared_merges
from gtopk_lab.comm.stats import CollectiveResult, check_algorithm, check_exact_k, check_k, check_numel, wire
from gtopk_lab.comm.transport import run_programs
from gtopk_lab.comm.wire import sparse_wire
from gtopk_lab.compression.merge import check_sparse, index_dtype

__all__ = ["sim_dense_allreduce", "sim_topk_allgather", "sim_gtopk_allreduce", "run_programs",
           "check_lists"]


def check_lists(values_list: Sequence[torch.Tensor], indices_list: Sequence[torch.Tensor],
                 numel: int) -> None:
    """Every virtual rank's pair as :func:`check_sparse` checks it, the error naming the rank.

    The index range of P ranks' pairs of one index dtype and device is checked in one
    ``aminmax`` over their concatenation (at P = 64, k = 57 a call per rank cost 0.2 ms of a
    simulated iteration); only when it fails are the ranks checked one by one, to name one.
    """
    if len(values_list) < 1:
        raise ValueError("values_list is empty: expected one tensor per virtual rank (>= 1)")
    if len(values_list) != len(indices_list):
        raise ValueError(f"values_list has {len(values_list)} ranks but indices_list has "
                         f"{len(indices_list)}: expected the same number")
    first = indices_list[0]
    together = len(indices_list) > 2 and all(
        isinstance(i, torch.Tensor) and i.dtype == first.dtype and i.device == first.device for i in indices_list)
    for r, (v, i) in enumerate(zip(values_list, indices_list)):
        check_sparse(v, i, None if together else numel, name=f"rank {r} values/indices")
    if together:
        flat = torch.cat(list(indices_list))
        if flat.numel() > 0:
            lo, hi = torch.aminmax(flat)
            if int(lo) < 0 or int(hi) >= numel:
                for r, (v, i) in enumerate(zip(values_list, indices_list)):
                    check_sparse(v, i, numel, name=f"rank {r} values/indices")


def sim_dense_allreduce(tensors: list[torch.Tensor]) -> list[CollectiveResult]:
    """Dense allreduce of one tensor per virtual rank, summed in rank order, written in place.

    Stats are the ring allreduce's (library_estimate=True), as in ``dense_allreduce``. The
    sum order may differ from gloo's by rounding; integer-valued inputs agree exactly.
    """
    if len(tensors) < 1:
        raise ValueError("tensors is empty: expected one tensor per virtual rank (>= 1)")
    shape = tensors[0].shape
    for r, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors[{r}] has type {type(t).__name__}: expected torch.Tensor")
        if t.shape != shape:
            raise ValueError(f"tensors[{r}] has shape {tuple(t.shape)}: expected {tuple(shape)} like rank 0")
    total = tensors[0].clone()
    for t in tensors[1:]:
        total += t
    world = len(tensors)
    out = []
    for t in tensors:
        t.copy_(total)
        out.append(CollectiveResult(t, None, dense_stats(t.numel() * t.element_size(), world)))
    return out


def sim_topk_allgather(values_list: list[torch.Tensor], indices_list: list[torch.Tensor],
                       numel: int, exact_count: int | None = None) -> list[CollectiveResult]:
    """Top-k AllGather between virtual ranks: every rank gets the sparse sum of all selections.

    ``exact_count`` as in :func:`gtopk_lab.comm.torch_dist.topk_allgather`: no count allgather.
    """
    check_numel(numel)
    check_lists(values_list, indices_list, numel)
    if exact_count is not None:
        check_k(exact_count, numel)
        check_exact_k(True, {f"virtual rank {r}": v.numel() for r, v in enumerate(values_list)}, exact_count,
                      f"exact_count={exact_count}")
    world = len(values_list)
    wired = [wire(v, i, numel) for v, i in zip(values_list, indices_list)]
    counts = [w[0].numel() for w in wired]
    vdt, idt = wired[0][0].dtype, wired[0][1].dtype
    res = allgather_assemble(counts, wired, vdt, idt, world, counted=exact_count is None)
    # one sum, one private copy per virtual rank (callers may modify their result in place),
    # with the rounds a CPU rank's links carry (torch_dist.topk_allgather): the ring's
    return [CollectiveResult(res.values.clone(), res.indices.clone(),
                             allgather_ring_stats(res.stats, r, world) if world > 1
                             else dataclasses.replace(res.stats, steps=list(res.stats.steps), peers=list(res.stats.peers)))
            for r in range(world)]


def sim_gtopk_allreduce(values_list: list[torch.Tensor], indices_list: list[torch.Tensor], numel: int,
                        k: int, algorithm: str = "butterfly", exact_k: bool = False, *,
                        programs: bool = False) -> list[CollectiveResult]:
    """gTop-k between virtual ranks: each merge once
    (:func:`~gtopk_lab.comm.sim_gtopk.sim_gtopk_shared_merges`, the default), or with
    ``programs=True`` the real per-rank programs (see module docstring); the same results and
    ``CommStats`` either way (but the measured ``merge_cpu_s``).

    ``exact_k`` as in :func:`gtopk_lab.comm.torch_dist.gtopk_allreduce`: header-free messages
    of exactly k pairs (the same bytes and message counts as the real call).
    """
    check_numel(numel)
    check_k(k, numel)
    check_algorithm(algorithm)
    check_lists(values_list, indices_list, numel)
    check_exact_k(exact_k, {f"virtual rank {r}": v.numel() for r, v in enumerate(values_list)}, k)
    world = len(values_list)
    messages = sparse_wire(values_list[0].dtype, index_dtype(numel), k, exact_k)
    if not programs:
        return sim_gtopk_shared_merges(values_list, indices_list, numel, k, algorithm, messages)
    recs = [Recorder(messages, r, world) for r in range(world)]
    outs = run_programs([rec.wrap(gtopk_program(r, world, v, i, numel, k, algorithm))
                         for r, (rec, v, i) in enumerate(zip(recs, values_list, indices_list))])
    return [CollectiveResult(o.values, o.indices, rec.fill(o.stats)) for rec, o in zip(recs, outs)]

