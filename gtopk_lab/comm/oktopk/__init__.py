"""Ok-Topk sparse allreduce (Li & Hoefler, PPoPP'22): both variants, one subpackage.

- **Ok-Topk as published** (the ``oktopk`` method; ``oktopk-balanced`` with the paper's
  balanced allgather): thresholds re-evaluated exactly every tau calls and reused in
  between, region boundaries from the ranks' selection quantiles every tau_r calls, dense
  warm-up, plain or balanced allgather. :func:`oktopk_faithful_allreduce`,
  :func:`sim_oktopk_faithful_allreduce`, :class:`OkTopkFaithfulState`.
  Modules: :mod:`~gtopk_lab.comm.oktopk.schedule` (state, schedule, thresholds and their
  bands, boundaries), :mod:`~gtopk_lab.comm.oktopk.program` (the per-rank program and its
  cost), :mod:`~gtopk_lab.comm.oktopk.drivers` (real and in-process drivers).
- **Exact variant** (the ``oktopk-exact`` method, the project's Ok-Topk before issue 16):
  exact global top-k every call by a distributed bisection, histogram-balanced regions.
  :func:`oktopk_allreduce`, :func:`sim_oktopk_allreduce`, :class:`OkTopkState`
  (also as ``oktopk_exact_allreduce``, ``sim_oktopk_exact_allreduce``, ``OkTopkExactState``).
  Module: :mod:`~gtopk_lab.comm.oktopk.exact`.

Both are per-rank programs over the rounds of :mod:`~gtopk_lab.comm.oktopk.rounds`, recorded
by the one recorder and driven bitwise alike over torch.distributed and in one process
(:mod:`gtopk_lab.comm.transport`). Their alpha-beta formulas are
:func:`gtopk_lab.methods.formulas.oktopk_time_s` and ``oktopk_exact_time_s``.
"""

from __future__ import annotations

from gtopk_lab.comm.oktopk.drivers import oktopk_faithful_allreduce, sim_oktopk_faithful_allreduce
from gtopk_lab.comm.oktopk.exact import (
    OkTopkState, bisection_rounds, boundaries_from_histogram, equal_boundaries, oktopk_allreduce, oktopk_program,
    sim_oktopk_allreduce,
)
from gtopk_lab.comm.oktopk.program import oktopk_faithful_program
from gtopk_lab.comm.oktopk.rounds import allreduce_rounds, bruck_rounds
from gtopk_lab.comm.oktopk.schedule import ALLGATHER_MODES, BANDS, Bands, OkTopkBuffer, OkTopkFaithfulState

__all__ = [
    "OkTopkFaithfulState", "OkTopkBuffer", "ALLGATHER_MODES", "BANDS", "Bands", "oktopk_faithful_allreduce",
    "sim_oktopk_faithful_allreduce", "oktopk_faithful_program",
    "OkTopkState", "OkTopkExactState", "oktopk_allreduce", "oktopk_exact_allreduce", "sim_oktopk_allreduce",
    "sim_oktopk_exact_allreduce", "oktopk_program", "equal_boundaries", "boundaries_from_histogram",
    "allreduce_rounds", "bisection_rounds", "bruck_rounds",
]

#: the exact variant under names that say so
OkTopkExactState = OkTopkState
oktopk_exact_allreduce = oktopk_allreduce
sim_oktopk_exact_allreduce = sim_oktopk_allreduce
