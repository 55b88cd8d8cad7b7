"""Ok-Topk's schedule, thresholds and region boundaries (Li & Hoefler, PPoPP'22), as the
reference code (Shigangli/Ok-Topk, VGG/LSTM allreducers) runs them; the rounds that use
them are in :mod:`gtopk_lab.comm.oktopk.program`.

What one buffer of one rank keeps between calls is an :class:`OkTopkBuffer`;
:class:`OkTopkFaithfulState` (the collective's per-rank state) holds the hyper-parameters
and one buffer per flat-buffer size (a DDP hook sends several buckets through one state).

Schedule of call c of a buffer (c = 0, 1, ...), s = c - warmup:

1. c < ``warmup``: dense allreduce (reference: 512 iterations for VGG, 128 for LSTM);
2. s mod ``tau`` == 0 (reference tau = 32): **re-evaluate** both thresholds exactly — the
   local one is the k-th largest |acc_r| (one exact top-k per rank), the global one the k-th
   largest |v| of the gathered union of the reduced regions (the exact global top-k);
3. otherwise **reuse** them: the local threshold is raised by 1.03 while more than
   ``raise_above`` k entries pass it (at most 5 times), and after the selection every
   threshold moves by a small factor when its count leaves its band (:class:`Bands`; the
   band's factors are the reference script's for the workload):

   ========  =============  ==================  ==================================
   script    local raise    local band (1.012)  global band
   ========  =============  ==================  ==================================
   ``vgg``   > 4k/3         2k/3 .. 5k/4        ``/1.008`` < 2k/3, ``*1.008`` > 4k/3
   ``lstm``  > 3k/2         3k/4 .. 5k/4        ``/1.01`` < 3k/4, ``*1.008`` > 5k/4
   ========  =============  ==================  ==================================

   (below the band the threshold is divided by its factor, above it multiplied); the
   ``lstm`` bands are the reference's for its language model, the ``vgg`` ones for
   everything else (the methods choose by model: ``methods.oktopk``);
4. s mod ``tau_r`` == 0 (reference tau_r = 64): **repartition** the index space: each rank
   takes the P-quantiles of its selected indices (the index at positions j * floor(n/P),
   j = 1 .. P-1), one allreduce averages them over the ranks (floor), and region q =
   [b_q, b_{q+1}) is reduced by rank q. Regions then hold about n/P selections of every rank
   wherever the selections cluster (the equal-width histogram of ``oktopk-exact`` cannot
   split a cluster narrower than one bin).

Departures from the reference, all at edges the reference does not reach or crashes on:
selections use ``|x| >= t`` on non-zero entries (the reference's ``|x| > t`` selects k - 1
entries at a re-evaluation and nothing at k = 1); a rank with no selection leaves the
boundary average (the reference indexes an empty array); the schedule counts from the end of
the warm-up (the reference counts from 0, which is the same when the warm-up is a multiple
of tau and tau_r, as 512 and 128 are of 32 and 64); a threshold that evaluates to 0 (fewer
than k non-zero entries) is evaluated again at the next call instead of passing every entry
until the next re-evaluation. Cost: O(d) per call for the selection,
plus one O(d) top-k every tau calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch

from gtopk_lab.comm.oktopk.rounds import magnitude_keys
from gtopk_lab.compression.merge import index_dtype

__all__ = ["OkTopkFaithfulState", "OkTopkBuffer", "CallPlan", "Bands", "BANDS", "ALLGATHER_MODES", "plan_call",
           "kth_largest_magnitude", "select_by_threshold", "raise_local_threshold", "next_local_threshold",
           "next_global_threshold", "global_topk", "quantile_boundaries", "average_boundaries",
           "LOCAL_RAISE", "LOCAL_RAISE_LOOPS"]

#: The allgather of the kept entries: the reference's plain Allgatherv, or the paper's
#: balanced one (data balancing first). Registered as the collective's algorithms.
ALLGATHER_MODES: tuple[str, ...] = ("plain", "balanced")
#: reference factor of a reused local threshold while too many entries pass it, and the most raises
LOCAL_RAISE, LOCAL_RAISE_LOOPS = 1.03, 5


@dataclass(frozen=True)
class Bands:
    """The threshold bands and factors of one reference allreducer script (module doc, step 3).

    Counts are compared with fractions of k exactly (``count > ratio * k``), as the
    reference's integer counts compare with its ``4*tk//3`` or ``2*topk_value/3``.
    """

    name: str
    #: raise a reused local threshold by LOCAL_RAISE while more than this times k entries pass
    local_raise_above: Fraction
    #: after the selection: local threshold / local_scale below low k, * local_scale above high k
    local_low: Fraction
    local_high: Fraction
    local_scale: float
    #: after the allgather: global threshold / global_down below low k, * global_up above high k
    global_low: Fraction
    global_high: Fraction
    global_down: float
    global_up: float


#: the reference scripts' bands: VGG-16's allreducer and the LSTM's (language models)
BANDS: dict[str, Bands] = {
    "vgg": Bands("vgg", Fraction(4, 3), Fraction(2, 3), Fraction(5, 4), 1.012,
                 Fraction(2, 3), Fraction(4, 3), 1.008, 1.008),
    "lstm": Bands("lstm", Fraction(3, 2), Fraction(3, 4), Fraction(5, 4), 1.012,
                  Fraction(3, 4), Fraction(5, 4), 1.01, 1.008),
}


def _above(count: int, ratio: Fraction, k: int) -> bool:
    return count * ratio.denominator > ratio.numerator * k


def _below(count: int, ratio: Fraction, k: int) -> bool:
    return count * ratio.denominator < ratio.numerator * k


def _int_at_least(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} has type {type(value).__name__}: expected int")
    if value < low:
        raise ValueError(f"{name}={value!r} is invalid: expected an integer >= {low}")
    return value


@dataclass
class OkTopkBuffer:
    """What one rank keeps for one flat buffer between calls (see the module docstring).

    ``calls`` counts calls (warm-up included); ``boundaries`` (P+1 ints) and
    ``global_threshold`` are identical on every rank; ``local_thresholds[r]`` is rank r's (a
    real rank fills only its own slot; the simulator's one state holds all P).
    """

    world_size: int
    calls: int = 0
    boundaries: list[int] | None = None
    global_threshold: float | None = None
    local_thresholds: list[float | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.local_thresholds) != self.world_size:
            self.local_thresholds = [None] * self.world_size


@dataclass
class OkTopkFaithfulState:
    """Ok-Topk's per-rank state: hyper-parameters and one :class:`OkTopkBuffer` per size.

    Tuned by the user (validated here): ``tau`` (threshold re-evaluation period, reference
    32), ``tau_r`` (space repartition period, reference 64), ``warmup`` (dense-allreduce
    calls first, reference 512 VGG / 128 LSTM; default 0), ``bands`` (the threshold bands
    and factors, a key of :data:`BANDS`: ``"vgg"``, default, or ``"lstm"``).

    Internal state: ``buffers`` (numel -> :class:`OkTopkBuffer`; a buffer of another world
    size starts over), ``phases`` (per rank, the last call's bytes per phase: see
    :class:`~gtopk_lab.comm.recorder.Recorder`), ``last`` (what the last call did:
    ``"warmup"``, ``"reevaluate"`` or ``"reuse"``, and whether it repartitioned). Holds no
    process group, so it pickles; ``dataclasses.asdict`` round-trips through the constructor.
    """

    # tuned by the user
    tau: int = 32
    tau_r: int = 64
    warmup: int = 0
    bands: str = "vgg"
    # internal state
    buffers: dict[int, OkTopkBuffer] = field(default_factory=dict)
    phases: list[dict[str, dict[str, int]]] = field(default_factory=list)
    last: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _int_at_least("tau", self.tau, 1)
        _int_at_least("tau_r", self.tau_r, 1)
        _int_at_least("warmup", self.warmup, 0)
        if self.bands not in BANDS:
            raise ValueError(f"bands={self.bands!r} is invalid: expected one of {', '.join(BANDS)}")
        # checkpoints hold buffers as dicts (dataclasses.asdict), JSON as string keys
        self.buffers = {int(n): b if isinstance(b, OkTopkBuffer) else OkTopkBuffer(**b)
                        for n, b in self.buffers.items()}

    def buffer(self, numel: int, world_size: int) -> OkTopkBuffer:
        """The state of the buffer of ``numel`` elements (new when absent or the world changed)."""
        buf = self.buffers.get(numel)
        if buf is None or buf.world_size != world_size:
            buf = self.buffers[numel] = OkTopkBuffer(world_size=world_size)
        return buf

    def describe(self) -> dict[str, Any]:
        """The settings a run summary records (``oktopk_*`` keys)."""
        return {"oktopk_tau": self.tau, "oktopk_tau_r": self.tau_r, "oktopk_warmup_iterations": self.warmup,
                "oktopk_bands": self.bands}


@dataclass(frozen=True)
class CallPlan:
    """What one call of one rank does, from the state before it (identical schedule on all ranks)."""

    warmup: bool
    reevaluate: bool
    repartition: bool
    #: None: evaluate it exactly on this call (re-evaluation, or a rank without one)
    local_threshold: float | None
    global_threshold: float | None
    boundaries: tuple[int, ...] | None
    bands: Bands = BANDS["vgg"]


def plan_call(state: OkTopkFaithfulState, buf: OkTopkBuffer, rank: int) -> CallPlan:
    """The schedule of the module docstring for ``buf``'s next call on ``rank``."""
    s = buf.calls - state.warmup
    bands = BANDS[state.bands]
    if s < 0:
        return CallPlan(True, False, False, None, None, None, bands)
    # a buffer without a global threshold or boundaries (restored mid-period) evaluates them
    # now; both flags depend only on what every rank holds alike (they change the rounds)
    reevaluate = s % state.tau == 0 or buf.global_threshold is None
    repartition = s % state.tau_r == 0 or buf.boundaries is None
    return CallPlan(False, reevaluate, repartition, buf.local_thresholds[rank], buf.global_threshold,
                    None if buf.boundaries is None else tuple(buf.boundaries), bands)


# =========================================================================== thresholds
def kth_largest_magnitude(x: torch.Tensor, k: int) -> float:
    """The exact threshold: the k-th largest |x| (one top-k over the buffer)."""
    return float(torch.topk(x.abs(), k, sorted=False).values.min())


def select_by_threshold(x: torch.Tensor, threshold: float, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices ascending) of the non-zero entries with ``|x| >= threshold``."""
    idx = torch.nonzero((x.abs() >= threshold) & (x != 0)).flatten()
    return x[idx], idx.to(index_dtype(numel))


def raise_local_threshold(x_abs: torch.Tensor, threshold: float, k: int, bands: Bands = BANDS["vgg"]) -> float:
    """Reused local threshold: * 1.03 while more than ``local_raise_above`` k non-zero
    entries pass (at most 5 times)."""
    for _ in range(LOCAL_RAISE_LOOPS):
        if not _above(int(((x_abs >= threshold) & (x_abs > 0)).sum()), bands.local_raise_above, k):
            break
        threshold *= LOCAL_RAISE
    return threshold


def _banded(threshold: float, count: int, k: int, low: Fraction, high: Fraction, down: float, up: float) -> float:
    if _below(count, low, k):
        return threshold / down
    if _above(count, high, k):
        return threshold * up
    return threshold


def next_local_threshold(threshold: float, selected: int, k: int, bands: Bands = BANDS["vgg"]) -> float:
    """After a selection of ``selected`` entries: / local_scale below the band, * above it."""
    return _banded(threshold, selected, k, bands.local_low, bands.local_high, bands.local_scale, bands.local_scale)


def next_global_threshold(threshold: float, kept: int, k: int, bands: Bands = BANDS["vgg"]) -> float:
    """After keeping ``kept`` entries globally: / global_down below the band, * global_up above."""
    return _banded(threshold, kept, k, bands.global_low, bands.global_high, bands.global_down, bands.global_up)


def global_topk(values: torch.Tensor, k: int) -> tuple[torch.Tensor, float]:
    """Exact top-k of the gathered union (given in ascending index order): the keep mask
    (ties to the lower index: a stable sort of the magnitude keys) and the k-th largest |v|."""
    keep = torch.zeros(values.numel(), dtype=torch.bool, device=values.device)
    if values.numel() == 0:
        return keep, 0.0
    order = torch.sort(magnitude_keys(values), descending=True, stable=True).indices[:k]
    keep[order] = True
    return keep, float(values[order[-1]].abs())


# =========================================================================== boundaries
def quantile_boundaries(sorted_indices: torch.Tensor, world_size: int) -> torch.Tensor:
    """This rank's contribution to the boundary average: P-1 quantile indices and a weight.

    int64 ``[i_{floor(n/P)}, i_{2 floor(n/P)}, .., i_{(P-1) floor(n/P)}, 1]`` of the n selected
    indices (ascending); all zeros (weight 0) when nothing is selected.
    """
    n = sorted_indices.numel()
    out = torch.zeros(world_size, dtype=torch.int64)
    if n == 0:
        return out
    chunk = n // world_size
    pos = torch.arange(1, world_size, dtype=torch.int64) * chunk
    out[:-1] = sorted_indices.to(torch.int64).cpu()[pos]
    out[-1] = 1
    return out


def average_boundaries(summed: torch.Tensor, numel: int, world_size: int) -> list[int]:
    """P+1 boundaries ``[0, floor(mean q_1), .., floor(mean q_{P-1}), numel]`` from the summed
    contributions of :func:`quantile_boundaries`; equal regions when no rank selected anything."""
    weight = int(summed[-1])
    if weight == 0:
        return [q * numel // world_size for q in range(world_size + 1)]
    inner = (summed[:-1].cpu() // weight).tolist()
    return [0] + [int(b) for b in inner] + [numel]
