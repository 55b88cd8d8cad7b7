"""How the simulator charges P measured per-rank compute times to the virtual clock.

In one process the P virtual ranks' forward/backward passes run one after the other on a
shared, busy machine: their measured times differ by 3-5x for reasons no real cluster
shares (another rank's process on the same two cores, the OS), and the slowest of P such
measurements grows with P. Charging that maximum makes efficiency fall with P for no
reason of the method's. The rules (``config.simulator.compute``, legacy ``extra["sim_compute"]``):

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

**Calibrated costs** (what a study charges by default, ``gtopk_lab.orchestration.calibration``):
one rank's compute measured once per workload on an idle worker thread (median of a few
passes) and the merges' gamma measured there too, at the workload's k
(:func:`merge_calibration_task`), both written into every point's ``config.compute_charge``
(``compute_time_s``, ``merge_gamma_s_per_element``, and ``calibration`` saying where and
when). Every rank, real or simulated, is then charged the same compute, and each
collective's merges ``gamma * merged_elements`` (:func:`clock_merge_options`), and each
sparse method's selection (its step before the collective) measured once per method and
density (:func:`selection_calibration_task`) as ``selection_time_s``. Neither the 2-core
box's time-sharing nor another job's load then moves virtual time; the communication is
modelled. :func:`compute_time_fields` states it in the summary (``compute_time_source:
"calibrated"``, ``fixed_selection_time_s``).
"""

from __future__ import annotations

import math
import random
import socket
import statistics
from array import array
from typing import Any

from gtopk_lab.config_options import COMPUTE_CHARGES, ComputeOptions
from gtopk_lab.network.calibrate import measure_gamma_s_per_element
from gtopk_lab.training.compute_time import measure_iteration_times

__all__ = ["COMPUTE_CHARGES", "DEFAULT_COMPUTE_CHARGE", "ComputeCharge", "fixed_times", "charged_selection_s",
           "clock_compress_option",
           "merge_gamma", "clock_merge_options", "compute_time_fields", "merge_calibration_task",
           "compute_calibration_task", "selection_calibration_task", "CALIBRATION_QUANTILE"]

#: Which of a calibration's passes is charged: the lower quartile. Contention (other ranks,
#: other jobs, a cold cache) only ever adds CPU time to a pass, so the low end of the passes
#: is the one-core-per-rank cost; the median of 7 passes read 1.76-2.23 ms for a 1.45 ms pass
#: at load 4 on the 2-core box.
CALIBRATION_QUANTILE = 0.25

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
    """Validate an optional fixed time in seconds (a keyword of ``simulate``)."""
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


def fixed_times(options: ComputeOptions, compute_time_s: Any = None,
                selection_time_s: Any = None) -> tuple[float | None, float | None]:
    """(compute, selection) seconds to charge every rank per iteration instead of measuring,
    each None where measured: the keywords, else ``options.compute_time_s`` /
    ``options.selection_time_s`` (a ``RunConfig.compute``). A fixed selection needs a fixed
    compute time; TypeError / ValueError name the field otherwise."""
    compute = _fixed_time("compute_time_s", compute_time_s if compute_time_s is not None
                          else options.compute_time_s, allow_zero=False)
    selection = _fixed_time("selection_time_s", selection_time_s if selection_time_s is not None
                            else options.selection_time_s, allow_zero=True)
    if selection is not None and compute is None:
        raise ValueError(f"selection_time_s={selection!r} is invalid without compute_time_s: "
                         "expected both fixed, or compute_time_s alone (selection then measured)")
    return compute, selection


def charged_selection_s(selected: bool, fixed_selection_s: float | None, measured_s: float) -> float:
    """The selection seconds charged with a fixed compute time: 0 for a rank that did not
    select (a method without selection; CLT-k's ranks but its leader), else the fixed
    selection time when given, else ``measured_s`` (a real rank's own CPU time, the
    simulator's median over its virtual ranks that selected)."""
    if not selected:
        return 0.0
    return fixed_selection_s if fixed_selection_s is not None else measured_s


def merge_gamma(options: ComputeOptions) -> float | None:
    """``options.merge_gamma_s_per_element`` (seconds per merged element, >= 0, checked by
    ``ComputeOptions``) as a float, or None when absent (merges measured)."""
    gamma = options.merge_gamma_s_per_element
    return None if gamma is None else float(gamma)


def clock_merge_options(virtual_merge_cpu: bool, options: ComputeOptions, fixed_compute_s: float | None
                        ) -> dict[str, Any]:
    """The ``VirtualClock`` keywords for merges: ``include_merge_cpu`` and
    ``merge_gamma_s_per_element``.

    1. a calibrated gamma (``options.merge_gamma_s_per_element``): merges charged as
       ``gamma * merged_elements``, with a fixed compute time too;
    2. else measured merges, only when compute is measured as well (measured merges would
       bring back the CPU noise a fixed compute time removes);
    3. ``virtual_merge_cpu=False`` (``RunConfig``) charges no merges at all.
    """
    gamma = merge_gamma(options)
    include = bool(virtual_merge_cpu) and (gamma is not None or fixed_compute_s is None)
    return {"include_merge_cpu": include, "merge_gamma_s_per_element": gamma if include else None}


def clock_compress_option(compresses: bool, fixed_selection_s: float | None) -> dict[str, Any]:
    """The ``VirtualClock`` keyword for a collective's own compression of the rank's input
    (``CommStats.compress_cpu_s``: Ok-Topk's threshold selection, PowerSGD's projections):
    charged as measured (``include_compress_cpu``), unless the method pays a selection
    (``Method.compresses``) and a fixed selection time stands for all of it (a calibrated one
    measures the collective's part too: :func:`~gtopk_lab.training.compute_time.measure_iteration_times`)."""
    return {"include_compress_cpu": not (compresses and fixed_selection_s is not None)}


def compute_time_fields(options: ComputeOptions, fixed_compute_s: float | None,
                        fixed_selection_s: float | None) -> dict[str, Any]:
    """What a run summary says of its compute charge: ``compute_time_source`` ("measured",
    "fixed", or "calibrated" when ``options.calibration`` describes the fixed time),
    ``fixed_compute_time_s``, ``fixed_selection_time_s``, ``merge_gamma_s_per_element`` and
    ``compute_calibration`` (where and when it was measured; None without one)."""
    calibration = options.calibration if fixed_compute_s is not None else None
    source = "measured" if fixed_compute_s is None else ("calibrated" if calibration else "fixed")
    return {"compute_time_source": source, "fixed_compute_time_s": fixed_compute_s,
            "fixed_selection_time_s": fixed_selection_s, "merge_gamma_s_per_element": merge_gamma(options),
            "compute_calibration": dict(calibration) if isinstance(calibration, dict) else None}


def merge_calibration_task(numel: int, k: int, repeats: int = 9) -> dict[str, Any]:
    """A Dask task: gamma of this worker's sparse merge at the workload's ``k`` (seconds of
    one thread's CPU per input element of a k + k ``merge_sparse`` over ``numel``, median of
    ``repeats``), as ``{"merge_gamma_s_per_element", "host"}``. At small k the per-call cost
    dominates, so gamma is measured at the k the runs merge, not at a large one."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a rank with one intra-op thread merges
    try:
        gamma = measure_gamma_s_per_element(k=int(k), repeats=repeats, numel=max(int(numel), 2 * int(k)))
    finally:
        torch.set_num_threads(threads)
    return {"merge_gamma_s_per_element": gamma, "host": socket.gethostname()}


def compute_calibration_task(config_dict: dict[str, Any], repeats: int = 15) -> dict[str, Any]:
    """A Dask task: one rank's compute (forward + backward + optimiser step) on this worker,
    one torch thread, ``repeats`` passes (:func:`~gtopk_lab.training.compute_time.measure_iteration_times`),
    charged at their :data:`CALIBRATION_QUANTILE`; ``{"compute_time_s", "compute_median_s",
    "selection_time_s", "numel", "host", "threads"}``."""
    from gtopk_lab.config import RunConfig

    times = measure_iteration_times(RunConfig.from_dict(config_dict), repeats=repeats)
    return {"compute_time_s": _lower_quartile(times["compute_samples_s"]), "compute_median_s": times["compute_time_s"],
            "selection_time_s": times["selection_time_s"], "numel": times["numel"],
            "host": socket.gethostname(), "threads": times["threads"]}


def _lower_quartile(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(CALIBRATION_QUANTILE * len(ordered)))]


def selection_calibration_task(config_dict: dict[str, Any], repeats: int = 15) -> dict[str, Any]:
    """A Dask task: one rank's selection (the method's step before its collective:
    compensation, clip, selector, at the config's density) on this worker, one torch thread,
    ``repeats`` passes on real gradients of the workload, charged at their
    :data:`CALIBRATION_QUANTILE`; ``{"selection_time_s", "selection_median_s", "k", "host",
    "threads"}``. Work a method does only every few calls (Ok-Topk's exact threshold every 32)
    falls above the quartile and is not charged: at most a few per cent of its selection."""
    from gtopk_lab.config import RunConfig

    times = measure_iteration_times(RunConfig.from_dict(config_dict), repeats=repeats)
    return {"selection_time_s": _lower_quartile(times["selection_samples_s"]),
            "selection_median_s": times["selection_time_s"], "k": times["k"],
            "host": socket.gethostname(), "threads": times["threads"]}
