"""Ok-Topk (the ``oktopk`` method) on real ranks and between virtual ranks in one process.

Both drivers run :func:`~gtopk_lab.comm.oktopk.program.oktopk_faithful_program` under the
one recorder (:class:`~gtopk_lab.comm.recorder.Recorder`, wire format
:data:`~gtopk_lab.comm.wire.BYTES`; real ranks: :func:`gtopk_lab.comm.transport.drive` over a
:class:`~gtopk_lab.comm.dist_transport.DistTransport`; virtual ranks:
:func:`gtopk_lab.comm.transport.run_programs`), plan each call from the same
:class:`~gtopk_lab.comm.oktopk.schedule.OkTopkFaithfulState` and update it the same way, so
results, bytes, steps, drops and the next call's thresholds agree bitwise. Per call:

1. the state's buffer for ``numel`` gives the call's plan (warm-up, re-evaluation,
   repartition; thresholds and boundaries);
2. the program runs (steps and cost: :mod:`gtopk_lab.comm.oktopk.program`);
3. the buffer advances: call counter, the rank's next local threshold, the next global
   threshold and the boundaries (identical on every rank), bytes per phase.

Unlike the other sparse collectives, Ok-Topk selects inside the collective (its thresholds
are collective state), so both drivers take the compensated buffer ``acc`` and return the
rank's local selection S_i with the result: the residual memory removes S_i.

Example::

    state = OkTopkFaithfulState(tau=32, tau_r=64, warmup=0)
    result, (sel_v, sel_i) = oktopk_faithful_allreduce(acc, k, state=state)
    G = result.values, result.indices        # identical on every rank (dense during warm-up)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from gtopk_lab.comm.dist_transport import comm_device, rank_world
from gtopk_lab.comm.oktopk.program import ProgramOutput, oktopk_faithful_program
from gtopk_lab.comm.oktopk.rounds import Block
from gtopk_lab.comm.oktopk.schedule import ALLGATHER_MODES, CallPlan, OkTopkBuffer, OkTopkFaithfulState, plan_call
from gtopk_lab.comm.recorder import Recorder
from gtopk_lab.comm.stats import CollectiveResult, check_k
from gtopk_lab.comm.transport import drive, run_programs
from gtopk_lab.comm.transport_choice import transport_for
from gtopk_lab.comm.wire import BYTES

__all__ = ["oktopk_faithful_allreduce", "sim_oktopk_faithful_allreduce"]


def _check_acc(acc: torch.Tensor, k: int, name: str = "acc") -> None:
    if not isinstance(acc, torch.Tensor) or not acc.is_floating_point():
        raise TypeError(f"{name}={type(acc).__name__} is invalid: expected a floating-point torch.Tensor")
    if acc.numel() < 1:
        raise ValueError(f"{name} has 0 elements: expected a buffer of numel >= 1")
    check_k(k, acc.numel())


def _check_state(state: OkTopkFaithfulState | None, allgather: str) -> OkTopkFaithfulState:
    if allgather not in ALLGATHER_MODES:
        raise ValueError(f"allgather={allgather!r} is invalid: expected one of {', '.join(ALLGATHER_MODES)}")
    if state is None:  # no memory between calls: every call re-evaluates and repartitions
        return OkTopkFaithfulState()
    if not isinstance(state, OkTopkFaithfulState):
        raise TypeError(f"state={state!r} has type {type(state).__name__}: expected OkTopkFaithfulState or None")
    return state


def _recorded(out: ProgramOutput, rec: Recorder) -> None:
    """The recorded rounds into the call's stats and its bytes per phase."""
    rec.fill(out.result.stats)
    out.phases = rec.phases


def _advance(state: OkTopkFaithfulState, buf: OkTopkBuffer, plan: CallPlan, numel: int,
             outs: Sequence[tuple[int, ProgramOutput]]) -> None:
    """Step 3: the buffer after the call (``outs``: (rank, output) of the ranks held here)."""
    buf.calls += 1
    if not plan.warmup:
        for rank, out in outs:
            buf.local_thresholds[rank] = out.local_threshold
        # identical on every rank: any rank's output will do
        buf.global_threshold = outs[0][1].global_threshold
        buf.boundaries = outs[0][1].boundaries
    phases: list[dict[str, dict[str, int]]] = [{} for _ in range(buf.world_size)]
    for rank, out in outs:
        phases[rank] = out.phases
    state.phases = phases
    kind = "warmup" if plan.warmup else "reevaluate" if plan.reevaluate else "reuse"
    state.last = {"numel": numel, "call": buf.calls - 1, "kind": kind,
                  "repartition": plan.repartition and not plan.warmup}


def oktopk_faithful_allreduce(acc: torch.Tensor, k: int, group: dist.ProcessGroup | None = None,
                              state: OkTopkFaithfulState | None = None, allgather: str = "plain",
                              ) -> tuple[CollectiveResult, Block]:
    """Ok-Topk sparse allreduce of this rank's flat buffer ``acc`` (gradient + residual).

    Returns ``(result, (values, indices))``: the result (``indices`` None during warm-up,
    when it is the dense sum; else canonical sparse, identical on every rank) and this
    rank's local selection S_i. ``state`` carries thresholds, boundaries and the call
    counter between calls (None: a fresh state every call, i.e. every call re-evaluates).
    ``allgather``: ``"plain"`` (the reference's Allgatherv) or ``"balanced"`` (the paper's).
    Works with gloo (CPU buffers) and NCCL (buffers on the tensor's GPU).
    """
    _check_acc(acc, k)
    st = _check_state(state, allgather)
    rank, world = rank_world(group)
    flat = acc.detach().reshape(-1)
    numel = flat.numel()
    device = comm_device(flat, group) if world > 1 else flat.device
    buf = st.buffer(numel, world)
    plan = plan_call(st, buf, rank)
    rec = Recorder(BYTES, rank, world)
    out = drive(rec.wrap(oktopk_faithful_program(rank, world, flat.to(device), numel, k, plan, allgather)),
                transport_for(group, device, BYTES))
    _recorded(out, rec)
    _advance(st, buf, plan, numel, [(rank, out)])
    res, there = out.result, flat.device
    stats = res.stats
    if stats.dropped_indices is not None:
        stats.dropped_values = stats.dropped_values.to(there)  # type: ignore[union-attr]
        stats.dropped_indices = stats.dropped_indices.to(there)
    values = res.values.to(there)
    indices = None if res.indices is None else res.indices.to(there)
    sel_v = flat if plan.warmup else out.selection[0].to(there)  # warm-up: everything, as it is
    return CollectiveResult(values, indices, stats), (sel_v, out.selection[1].to(there))


def sim_oktopk_faithful_allreduce(accs: list[torch.Tensor], k: int, state: OkTopkFaithfulState | None = None,
                                  allgather: str = "plain") -> list[tuple[CollectiveResult, Block]]:
    """Ok-Topk between virtual ranks in one process: the real per-rank programs, in-memory mail.

    ``accs[r]`` is virtual rank r's buffer; one ``state`` stands for the P per-rank states
    (it holds every rank's local threshold). Same values, bytes, steps, drops and state
    updates as :func:`oktopk_faithful_allreduce` on P real ranks.
    """
    if not isinstance(accs, (list, tuple)) or len(accs) < 1:
        raise ValueError("accs is empty: expected one buffer per virtual rank (>= 1)")
    for r, acc in enumerate(accs):
        _check_acc(acc, k, name=f"accs[{r}]")
        if acc.numel() != accs[0].numel():
            raise ValueError(f"accs[{r}] has {acc.numel()} elements: expected {accs[0].numel()} like rank 0")
    st = _check_state(state, allgather)
    world, numel = len(accs), accs[0].numel()
    buf = st.buffer(numel, world)
    plans = [plan_call(st, buf, r) for r in range(world)]
    flats = [a.detach().reshape(-1) for a in accs]
    recs = [Recorder(BYTES, r, world) for r in range(world)]
    outs: list[ProgramOutput] = run_programs(
        [rec.wrap(oktopk_faithful_program(r, world, flats[r], numel, k, plans[r], allgather))
         for r, rec in enumerate(recs)])
    for out, rec in zip(outs, recs):
        _recorded(out, rec)
    _advance(st, buf, plans[0], numel, list(enumerate(outs)))
    return [(o.result, (flats[r] if plans[0].warmup else o.selection[0], o.selection[1]))
            for r, o in enumerate(outs)]
