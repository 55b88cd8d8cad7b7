"""The simulator's P training steps over ranks at once: error feedback, selection, memory update.

With the P gradients in one ``[P, d]`` tensor (:mod:`~gtopk_lab.training.batched_ranks`), the
per-rank steps (:class:`~gtopk_lab.training.step.RankStep`: compensate, select, ..., memory
update) cost P times the per-call overhead of a handful of small tensor ops. Where the
method allows (:func:`batched_step_refusal`), :class:`BatchedSteps` runs them as row-wise ops
on ``[P, d]`` tensors, with the same result on every row as the rank's own step:

1. ``acc = G + R``: ``G`` the ``[P, d]`` gradients, ``R`` the P residuals stacked (the
   project's :class:`~gtopk_lab.compression.residual.ErrorFeedback`; none: ``acc = G``);
2. sparse methods: the exact top-k of every row at once (:func:`batched_topk`): a compiled
   row kernel, whose set is the one ``torch.topk`` gives the row alone wherever that set is
   unique, and ``torch.topk(|acc|, k, dim=1)`` on the rows where ties at the k-th largest
   magnitude leave ``torch.topk`` a choice (the per-slice kernel ``topk_select`` runs on one
   rank's vector: the same choice). So every row selects the set the rank's own call selects
   (tests/test_batched_step.py checks it against per-row ``torch.topk``, ties included); the
   order within a row differs, which no collective sees (each sorts by index); values bitwise
   ``acc[r, idx]``, indices in the selectors' index dtype;
3. the P contributions go to the method's in-process collective unchanged (the driver's seam);
4. memory update in one pass: ``R' = acc`` with each row's selection zeroed (one
   ``scatter_``; the "paper" rule: only where the index is in the global set, one ``isin``),
   plus, under the "mass" rule, the entries the merges dropped and charged to each rank (one
   ``index_add_`` into the flat ``[P * d]`` view); each rank's memory then holds its row;
5. the update ``G_sum / P`` from rank 0's result (every rank's is the same), through rank 0's
   ``RankStep.aggregate`` (the aggregated clip included).

Refused (the per-rank path stays, the reason in one line): a device other than the CPU (the
row-wise top-k's equality is checked there only), a memory of the method's own
(PowerSGD, CLT-k, EF21, SparseLoCo: their updates are their own code), a selector other than
``topk_select`` (thresholds and random picks have no row-wise form that selects exactly as the
rank's own call), DGC momentum correction and the local clip (per-rank state and norms; not
batched yet).

Cost per iteration: O(P d) for steps 1, 2 and 4 (the row kernel: one read), in about ten
tensor calls instead of about ten per rank; memory: ``acc`` and ``R'``, 8 P d bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gtopk_lab.comm.stats import CollectiveResult
from gtopk_lab.compression.checks import check_selection
from gtopk_lab.compression.fast_topk_rows import numba_rows_topk, rows_topk_applies
from gtopk_lab.compression.merge import index_dtype
from gtopk_lab.compression.residual import ErrorFeedback
from gtopk_lab.compression.selection import topk_select
from gtopk_lab.methods.base import CommCall, Contribution
from gtopk_lab.training.step import RankStep

__all__ = ["BatchedRound", "BatchedSteps", "batched_step_refusal", "batched_summary", "batched_topk"]


def batched_step_refusal(step: RankStep, device: torch.device | str = "cpu") -> str | None:
    """Why the P steps of this run cannot run as one batched step, in one line, or None
    (``step``: rank 0's; every rank's is built from the same settings; ``device``: the run's)."""
    settings, method = step.settings, step.method
    if torch.device(device).type != "cpu":
        # CUDA's topk picks its kernel by slice size: rows and one rank's vector may break
        # ties differently, and that has not been checked on a device
        return f"device {str(device)!r}: the row-wise top-k is checked against each rank's on CPU only"
    if settings.local_steps:
        return f"method {method.name!r} takes local steps: each rank synchronises its own weights"
    if step.memory is not None and type(step.memory) is not ErrorFeedback:
        return (f"method {method.name!r} keeps its own memory ({type(step.memory).__name__}): its "
                "update runs rank by rank")
    if method.sparse and step.select is not topk_select:
        name = getattr(step.select, "__name__", repr(step.select))
        return (f"selector {name!r} has no row-wise form that selects exactly what one rank's call "
                "selects")
    if step.velocity is not None:
        return "momentum correction (DGC) keeps a velocity per rank: not batched"
    if settings.grad_clip is not None and settings.grad_clip_mode == "local":
        return "grad_clip_mode='local' clips each rank by its own norm: not batched"
    return None


def batched_summary(gradients: bool, gradients_refusal: str | None, steps_refusal: str | None, *,
                    fixed: bool, how: tuple[str, str | None] | None = None) -> dict[str, object]:
    """A simulated run's summary fields: whether the gradients (``gradients``) and the steps
    (``steps_refusal`` None) ran batched, why not, how the batched gradients were computed
    (``how``: ``BatchedGradients``' rule and why not "layers"), and how their time was charged
    (batched gradients and a batched step's selection: rank 0's own call, ``one_rank_call``;
    else per rank, or ``fixed``)."""
    def rule(batched: bool, label: str) -> str:
        return "fixed" if fixed else label if batched else "per_rank"
    steps = steps_refusal is None
    return {"batched_ranks": gradients, "batched_ranks_refusal": gradients_refusal,
            "batched_gradients": how[0] if how else None, "batched_gradients_refusal": how[1] if how else None,
            "batched_steps": steps, "batched_steps_refusal": steps_refusal,
            "compute_s_attribution": rule(gradients, "one_rank_call"),
            "selection_s_attribution": rule(steps, "one_rank_call")}


def batched_topk(acc: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's exact top-k of ``|acc|``: the set ``topk_select`` gives for that row alone.

    ``acc``: ``[P, d]``. Returns ``(values [P, k], indices [P, k])``, indices in
    ``index_dtype(d)``; ``k == d``: every index in ascending order, as ``topk_select`` returns
    it. A CPU float32 ``acc`` takes the compiled row kernel
    (:func:`~gtopk_lab.compression.fast_topk_rows.numba_rows_topk`, ascending indices), whose
    set is ``torch.topk``'s wherever that set is unique; the rows it flags (a tie across the
    k-th largest magnitude, a NaN) and other inputs take ``torch.topk`` on those rows, the
    per-slice kernel ``topk_select`` runs on one rank's vector (same set, same order, same
    ties). The order within a row never reaches a result: every collective sorts its inputs
    by index. Cost: one read of ``acc`` and O(k) per row (0.5 ms at P = 64, d = 5.7k, k = 57,
    against 1.5 ms for ``torch.topk`` on all rows).
    """
    if acc.dim() != 2:
        raise ValueError(f"acc has shape {tuple(acc.shape)}: expected [P, d]")
    check_selection(acc[0], k)
    world, d = acc.shape
    if k == d:
        idx = torch.arange(d, device=acc.device).expand(world, d)
        return acc.gather(1, idx), idx.to(index_dtype(d))
    if not rows_topk_applies(acc, k):
        idx = torch.topk(acc.abs(), k, dim=1, sorted=False).indices
        return acc.gather(1, idx), idx.to(index_dtype(d))
    values, idx, ok = numba_rows_topk(acc, k)
    if not bool(ok.all()):
        tied = torch.nonzero(~ok).flatten()
        rows = acc[tied]
        own = torch.topk(rows.abs(), k, dim=1, sorted=False).indices
        idx[tied] = own
        values[tied] = rows.gather(1, own)
    return values, idx.to(index_dtype(d))


@dataclass
class BatchedRound:
    """One synchronisation of all P ranks waiting for its collective: the P contributions, rank
    0's call, and the ``[P, d]`` accumulators and ``[P, k]`` int64 selections the memory
    update reads (None for a dense method)."""

    contributions: list[Contribution]
    call: CommCall
    acc: torch.Tensor
    indices: torch.Tensor | None


class BatchedSteps:
    """The P ranks' :class:`RankStep` s run as one (steps 1-5 of the module docstring).

    ``steps``: every rank's step, in rank order (their memories are read and written; their
    collective call is rank 0's). :meth:`begin` gives the round, :meth:`finish` the update.
    """

    def __init__(self, steps: Sequence[RankStep]) -> None:
        refusal = batched_step_refusal(steps[0])
        if refusal is not None:
            raise ValueError(f"BatchedSteps is invalid for this run: {refusal}")
        self.steps = list(steps)
        self.world = len(self.steps)
        self.memories: list[ErrorFeedback] = [s.memory for s in self.steps if s.memory is not None]
        self.sparse = self.steps[0].method.sparse

    def begin(self, grads: torch.Tensor, k: int, iteration: int = 0) -> BatchedRound:
        """Steps 1-2: compensation and selection of every row of ``grads`` ``[P, d]``."""
        if grads.shape != (self.world, self.steps[0].numel):
            raise ValueError(f"grads has shape {tuple(grads.shape)}: expected "
                             f"({self.world}, {self.steps[0].numel})")
        acc = grads
        if self.memories:
            residuals = torch.stack([m.residual for m in self.memories])
            acc = grads.to(residuals.dtype) + residuals
        call = self.steps[0].call(k, iteration)
        if not self.sparse:
            return BatchedRound([Contribution(gradient=g, acc=a) for g, a in zip(grads, acc)], call, acc, None)
        values, indices = batched_topk(acc, k)
        contributions = [Contribution(gradient=g, acc=a, values=v, indices=i)
                         for g, a, v, i in zip(grads, acc, values, indices)]
        return BatchedRound(contributions, call, acc, indices.long())

    def update_memories(self, round_: BatchedRound, results: Sequence[CollectiveResult]) -> None:
        """Step 4: every rank's new residual, as ``ErrorFeedback.update`` makes it per rank."""
        if not self.memories or round_.indices is None:
            return
        rule = self.memories[0].rule
        residual = round_.acc.to(self.memories[0].residual.dtype).clone()
        local, d = round_.indices, residual.shape[1]
        offsets = torch.arange(self.world, device=local.device).unsqueeze(1) * d
        flat = residual.view(-1)
        globals_ = [r.indices for r in results]
        if rule == "paper" and globals_[0] is not None:
            # an entry leaves rank i's residual only where its index reached the global set
            same = all(g is globals_[0] or torch.equal(g, globals_[0]) for g in globals_)
            if same:
                hit = torch.isin(local, globals_[0].to(device=local.device, dtype=torch.int64))
            else:
                hit = torch.stack([torch.isin(row, g.to(device=local.device, dtype=torch.int64))
                                   for row, g in zip(local, globals_)])
            flat[(local + offsets)[hit]] = 0
        else:
            residual.scatter_(1, local, 0.0)
        if rule == "mass":
            # unsummed pieces: index_add_ sums repeated indices itself (no coalescing sort)
            drops = [(r, i, v) for r, res in enumerate(results) for v, i in res.stats.drop_pieces()
                     if i.numel() > 0]
            if drops:
                # one cat each and one offset per piece (a tensor op per piece cost 0.3 ms at P = 64)
                idx = torch.cat([i for _, i, _ in drops]).to(device=flat.device, dtype=torch.int64)
                idx += torch.repeat_interleave(torch.tensor([r * d for r, _, _ in drops], device=flat.device),
                                               torch.tensor([i.numel() for _, i, _ in drops], device=flat.device))
                vals = torch.cat([v for _, _, v in drops]).to(device=flat.device, dtype=flat.dtype)
                flat.index_add_(0, idx, vals)
        for memory, row in zip(self.memories, residual):
            memory.residual = row

    def update(self, round_: BatchedRound, results: Sequence[CollectiveResult]) -> torch.Tensor:
        """Step 5: the update ``G_sum / P`` from rank 0's result."""
        return torch.div(self.steps[0].aggregate(results[0], round_.acc.device), self.world)
