"""How the simulator charges P measured per-rank compute times to the virtual clock.

In one process the P virtual ranks' forward/backward passes run one after the other on a
shared, busy machine: their measured times differ by 3-5x for reasons no real cluster
shares (another rank's process on the same two cores, the OS), and the slowest of P such
measurements grows with P. Charging that maximum makes efficiency fall with P for no
reason of the method's. The rules (``config.extra["sim_compute"]``):

- ``"median"`` (default): every rank is charged the median of this iteration's P
  measurements: the typical rank, unbiased in P (at P = 1 it is the one measurement);
- ``"max"``: every rank its own measurement, so the clock waits for the slowest (the
  behaviour before this rule existed; it invents stragglers from contention);
- ``"straggler"``: an explicit straggler model: each rank's charge is drawn (private
  generator seeded by ``config.seed``) from every compute time measured so far in this
  run, so the slowest of P draws follows the measured distribution's tail, as real
  stragglers would.

Every measurement is kept (8 bytes each) so that the summary shows its spread
(:meth:`ComputeCharge.spread`: 10th, 50th, 90th percentiles). Cost per iteration: O(P log P).

:func:`fixed_times` reads the other option, shared by the simulator and real ranks: a fixed
``compute_time_s`` (and optionally ``selection_time_s``) charged instead of any measurement.
"""

from __future__ import annotations

import math
import random
import statistics
from array import array
from typing import Any

__all__ = ["COMPUTE_CHARGES", "DEFAULT_COMPUTE_CHARGE", "ComputeCharge", "fixed_times", "charged_selection_s"]

COMPUTE_CHARGES: tuple[str, ...] = ("median", "max", "straggler")
DEFAULT_COMPUTE_CHARGE = "median"


class ComputeCharge:
    """One run's rule (see the module docstring) and its measurements."""

    def __init__(self, rule: str | None, seed: int) -> None:
        rule = DEFAULT_COMPUTE_CHARGE if rule is None else rule
        if rule not in COMPUTE_CHARGES:
            raise ValueError(f"sim_compute={rule!r} is invalid: expected one of {', '.join(COMPUTE_CHARGES)}")
        self.rule = rule
        self.measured_s = array("d")
        self._rng = random.Random(seed)

    def charge(self, measured_s: list[float]) -> list[float]:
        """The per-rank compute times the clock is charged for this iteration."""
        self.measured_s.extend(measured_s)
        if self.rule == "max":
            return list(measured_s)
        if self.rule == "median":
            return [statistics.median(measured_s)] * len(measured_s)
        return [self._rng.choice(self.measured_s) for _ in measured_s]

    def spread(self) -> dict[str, float]:
        """10th, 50th and 90th percentiles of every measured per-rank compute time (s)."""
        if not self.measured_s:
            return {}
        if len(self.measured_s) == 1:
            only = float(self.measured_s[0])
            return {"p10": only, "p50": only, "p90": only}
        q = statistics.quantiles(self.measured_s, n=10, method="inclusive")
        return {"p10": q[0], "p50": q[4], "p90": q[8]}


def _fixed_time(name: str, value: Any, allow_zero: bool) -> float | None:
    """Validate an optional fixed time in seconds (keyword or ``config.extra`` entry)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}={value!r} has type {type(value).__name__}: expected a number of "
                        "seconds or None")
    value = float(value)
    ok = value >= 0 if allow_zero else value > 0
    if not ok or math.isinf(value):
        raise ValueError(f"{name}={value!r} is invalid: expected a finite number of seconds "
                         f"{'>= 0' if allow_zero else '> 0'} (or None to measure it)")
    return value


def fixed_times(extra: dict[str, Any], compute_time_s: Any = None,
                selection_time_s: Any = None) -> tuple[float | None, float | None]:
    """(compute, selection) seconds to charge every rank per iteration instead of measuring,
    each None where measured: the keywords, else ``extra["compute_time_s"]`` /
    ``extra["selection_time_s"]`` (a ``RunConfig.extra``). A fixed selection needs a fixed
    compute time; TypeError / ValueError name the field otherwise."""
    compute = _fixed_time("compute_time_s", compute_time_s if compute_time_s is not None
                          else extra.get("compute_time_s"), allow_zero=False)
    selection = _fixed_time("selection_time_s", selection_time_s if selection_time_s is not None
                            else extra.get("selection_time_s"), allow_zero=True)
    if selection is not None and compute is None:
        raise ValueError(f"selection_time_s={selection!r} is invalid without compute_time_s: "
                         "expected both fixed, or compute_time_s alone (selection then measured)")
    return compute, selection


def charged_selection_s(sparse: bool, fixed_selection_s: float | None, measured_s: float) -> float:
    """The selection seconds charged with a fixed compute time: 0 for a method without
    selection, else the fixed selection time when given, else ``measured_s`` (a real rank's
    own CPU time, the simulator's median over its virtual ranks)."""
    if not sparse:
        return 0.0
    return fixed_selection_s if fixed_selection_s is not None else measured_s
