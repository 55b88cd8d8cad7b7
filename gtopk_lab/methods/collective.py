"""What a collective is: how the ranks' contributions are aggregated (one registry entry).

A :class:`Collective` is called once per synchronisation with a :class:`CommCall`
describing the call (sizes, pattern, per-rank state, parameter layout) and one rank's
:class:`Contribution` (the compensated buffer ``acc`` and, for sparse collectives, the
selection ``values, indices``). A :class:`~gtopk_lab.methods.base.Method` pairs one with a
selector, a memory and a cadence (:mod:`gtopk_lab.methods.base`, which re-exports these).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gtopk_lab.comm.stats import CollectiveResult

__all__ = ["INPUTS", "Contribution", "CommCall", "Collective"]

#: What a collective takes from each rank: ``"sparse"`` (values, indices), ``"dense"`` (acc), or
#: ``"leader"`` (every rank's acc and, from the one rank ``Collective.leader`` names for the
#: call, its selection: CLT-k's cyclic leader).
INPUTS: tuple[str, ...] = ("sparse", "dense", "leader")


@dataclass
class Contribution:
    """One rank's input to a collective: ``acc`` (gradient + residual, d floats) and, for
    sparse collectives, its selection (for ``input="leader"`` collectives the leader's only,
    None on the other ranks). ``gradient`` is the buffer before compensation."""

    gradient: torch.Tensor
    acc: torch.Tensor
    values: torch.Tensor | None = None
    indices: torch.Tensor | None = None


@dataclass
class CommCall:
    """One call of a collective on one rank (the simulator passes rank 0's for the group).

    ``layout``: the shapes of the parameters in flat-buffer order, for per-layer
    compressors (PowerSGD-shaped collectives reshape ``acc`` with it). ``state``: the
    per-rank state the collective's ``make_state`` built (None when it has none).
    ``group``: the process group on real ranks (None = default group). ``options``: the
    method's hyper-parameters for this run (``Method.run_options``), e.g. a quantiser's bits.
    """

    numel: int
    k: int
    exact_k: bool = False
    algorithm: str | None = None
    state: Any = None
    iteration: int = 0
    layout: tuple[tuple[int, ...], ...] = ()
    group: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)


def _no_formula(*_args: Any, **_kwargs: Any) -> float:
    raise ValueError("this collective has no alpha-beta formula: give Collective(time_s=...) to predict it")


@dataclass(frozen=True)
class Collective:
    """How the ranks' contributions are aggregated (one registry entry).

    ``run(contribution, call) -> CollectiveResult`` on real ranks (torch.distributed);
    ``simulate(contributions, call) -> list[CollectiveResult]`` for P virtual ranks in one
    process, bitwise equal to ``run`` (write the algorithm once as a per-rank program and
    drive it with :func:`gtopk_lab.methods.programs.program_collective` to get both).
    ``time_s(net, numel, k, workers, *, algorithm, gamma_s_per_element, host_cores, exact_k)``
    and ``bytes_per_rank(numel, k, workers, pair_bytes, algorithm)`` are its alpha-beta(-gamma)
    time and the bytes one rank sends. ``input``: ``"sparse"`` (takes the selection),
    ``"dense"`` (takes ``acc``) or ``"leader"`` (takes every rank's ``acc`` and the selection
    of the rank ``leader(iteration, world)`` names for the call: only that rank selects, in
    the step, where its selection is timed and charged as every selecting method's is).
    ``needs_exact_k``: every rank must send exactly k pairs.
    ``lossless``: the result is the exact sum of the contributions (EF21-shaped methods need
    it). ``algorithms``: message patterns the caller may choose (first = default).
    ``compresses``: the collective compresses the rank's input itself before the wire and
    times it as ``CommStats.compress_cpu_s`` (Ok-Topk's threshold pass, PowerSGD's
    projections): the rank's selection, calibrated and charged as one.
    ``formula_inputs(options, layout) -> dict``: what ``time_s`` and ``bytes_per_rank`` need
    beyond the model size, as their keywords, from the run's ``method_options`` and parameter
    shapes (PowerSGD's plan); a run's summary keeps it (``comm_formula``) for the tables.
    ``make_state()``: per-rank state kept between calls (e.g. Ok-Topk's regions), saved in
    checkpoints with ``dataclasses.asdict`` when it is a dataclass.
    """

    name: str
    run: Callable[[Contribution, CommCall], CollectiveResult]
    simulate: Callable[[list[Contribution], CommCall], list[CollectiveResult]]
    time_s: Callable[..., float] = _no_formula
    bytes_per_rank: Callable[..., float] = _no_formula
    input: str = "sparse"
    needs_exact_k: bool = False
    lossless: bool = True
    algorithms: tuple[str, ...] = ()
    make_state: Callable[[], Any] | None = None
    aliases: tuple[str, ...] = ()
    description: str = ""
    #: ``input="leader"`` only: ``(iteration, world) -> rank`` whose selection the call takes
    leader: Callable[[int, int], int] | None = None
    compresses: bool = False
    formula_inputs: Callable[[Mapping[str, Any], Sequence[Sequence[int]]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name={self.name!r} is invalid: expected a non-empty string")
        for fname in ("run", "simulate", "time_s", "bytes_per_rank"):
            if not callable(getattr(self, fname)):
                raise TypeError(f"{fname}={getattr(self, fname)!r} is invalid: expected a callable")
        if self.input not in INPUTS:
            raise ValueError(f"input={self.input!r} is invalid: expected one of {', '.join(INPUTS)}")
        for fname in ("make_state", "formula_inputs"):
            if getattr(self, fname) is not None and not callable(getattr(self, fname)):
                raise TypeError(f"{fname}={getattr(self, fname)!r} is invalid: expected a callable or None")
        if (self.input == "leader") != (self.leader is not None) or not (self.leader is None or callable(self.leader)):
            raise ValueError(f"leader={self.leader!r} is invalid with input={self.input!r}: expected a callable "
                             "(iteration, world) -> rank exactly when input='leader'")
        object.__setattr__(self, "algorithms", tuple(self.algorithms))
        object.__setattr__(self, "aliases", tuple(self.aliases))

    def algorithm_for(self, requested: str | None) -> str | None:
        """The pattern a call uses: ``requested`` if this collective has patterns, else None."""
        if not self.algorithms:
            return None
        algorithm = requested or self.algorithms[0]
        if algorithm not in self.algorithms:
            raise ValueError(f"algorithm={algorithm!r} is invalid for collective {self.name!r}: "
                             f"expected one of {', '.join(self.algorithms)}")
        return algorithm
