"""Wait-free backpropagation: communicate a layer group's sparse gradient while backward continues.

Backward produces gradients from the last layer to the first. With whole-model top-k
(the papers' choice) nothing can be sent before the whole backward pass has finished,
because the k largest entries of the *model* are only known then. Selecting per **layer
group** instead (k_g = max(1, floor(density * d_g)) of each group's d_g elements) lets the
group's collective start as soon as its gradients are accumulated, hiding communication
behind the backward pass of the earlier layers (Zhang et al., "Poseidon", ATC'17; Shi et
al., "MG-WFBP", INFOCOM'19). This changes selection semantics: every group gets the same
density, whereas whole-model top-k gives more of the budget to layers with large gradients
(docs/beyond_papers.md measures the accuracy effect on MNIST-1D).

Mechanics (:class:`WaitFreeBackprop`):

1. parameters are grouped by module, in reverse registration order (roughly the order in
   which backward finishes them), consecutive modules merged until a group holds at least
   ``min_group_numel`` elements;
2. ``Tensor.register_post_accumulate_grad_hook`` on every parameter counts down its group;
   when a group is complete its id goes to a **communication thread**;
3. the thread handles groups strictly in group order (the same on every rank, so the
   collectives match): flatten, then the group's training step
   (:class:`~gtopk_lab.training.step.RankStep`: the method's memory and selector, its
   collective from the registry with the group's layout, the iteration and the process
   group, the memory update and aggregate), and write the step's ``G / P`` back into the
   group's ``.grad``;
4. :meth:`WaitFreeBackprop.finish` (after ``loss.backward()``) releases groups whose
   parameters got no gradient, waits for the thread and returns an :class:`OverlapReport`.

``overlap=False`` runs the same per-group communication after backward (same result,
nothing hidden) and ``scope="model"`` does whole-model selection after backward (the
papers' semantics): both are the baselines the report is compared with.

What is hidden: measured on the wall clock, ``hidden_s = sum_g |[start_g, end_g] cap
[-inf, backward_end]|`` of the real collectives; and modelled on a
:class:`~gtopk_lab.network.model.NetworkModel`: group g becomes ready at its measured time
r_g, its modelled duration c_g = ``steps_time_s(stats.steps)``, groups share one link in
order (``start_g = max(r_g, end_{g-1})``), and the same overlap formula applies. Exposed
communication is ``max(0, end_last - backward_end)``.

Costs: one extra thread per process; O(d) copies per iteration; per group the collective's
cost with k_g instead of k (the alpha term is paid once per group: many small groups pay
many latencies, hence ``min_group_numel``).

Example::

    wfbp = WaitFreeBackprop(model, density=0.01, method="gtopk", network=NetworkModel.from_strings("1Gbps"))
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # groups communicate while backward runs
        report = wfbp.finish()            # .grad now holds G / P
        opt.step()
    wfbp.close()
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gtopk_lab.comm.schedules import SPARSE_ALGORITHMS
from gtopk_lab.compression.residual import RESIDUAL_RULES
from gtopk_lab.config import k_for
from gtopk_lab.methods import available_methods, get_method
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.training.step import RankStep
from gtopk_lab.training.step_settings import StepSettings

__all__ = ["WaitFreeBackprop", "OverlapReport", "GroupTiming", "SCOPES",
           "hidden_time_s", "link_timeline"]

SCOPES: tuple[str, ...] = ("layer", "model")


@dataclass
class GroupTiming:
    """One group's communication in one iteration (seconds since the first ready group)."""

    group: int
    numel: int
    k: int
    ready_s: float
    start_s: float
    end_s: float
    model_s: float
    bytes_sent: int


@dataclass
class OverlapReport:
    """How much communication one iteration hid behind backward, measured and modelled."""

    backward_end_s: float
    groups: list[GroupTiming] = field(default_factory=list)
    comm_s: float = 0.0
    hidden_s: float = 0.0
    exposed_s: float = 0.0
    comm_model_s: float = 0.0
    hidden_model_s: float = 0.0
    exposed_model_s: float = 0.0

    @property
    def hidden_fraction(self) -> float:
        """Measured hidden / total communication (0 when nothing was communicated)."""
        return self.hidden_s / self.comm_s if self.comm_s > 0 else 0.0

    @property
    def hidden_model_fraction(self) -> float:
        """Modelled hidden / total communication on the network model."""
        return self.hidden_model_s / self.comm_model_s if self.comm_model_s > 0 else 0.0


def hidden_time_s(intervals: list[tuple[float, float]], backward_end_s: float) -> float:
    """Total length of the parts of ``[start, end]`` intervals before ``backward_end_s``."""
    return sum(max(0.0, min(end, backward_end_s) - start) for start, end in intervals)


def link_timeline(ready_s: list[float], durations_s: list[float]) -> list[tuple[float, float]]:
    """Groups in order on one link: ``start_g = max(ready_g, end_{g-1})``, ``end_g = start_g + c_g``."""
    out: list[tuple[float, float]] = []
    end = float("-inf")
    for ready, dur in zip(ready_s, durations_s):
        start = max(ready, end)
        end = start + dur
        out.append((start, end))
    return out


class WaitFreeBackprop:
    """Per-layer-group sparse aggregation overlapped with backward (see the module docstring).

    Parameters: ``model``; ``density`` (0, 1]; ``method`` a per-step registered method (a
    local-steps one is refused with one line); ``algorithm`` butterfly | tree (gTop-k);
    ``residual_rule`` paper | mass (None: the method's, else mass); ``scope`` layer | model; ``overlap`` (layer scope only);
    ``min_group_numel`` (>= 0); ``network`` for the modelled figures (default: unthrottled);
    ``group`` process group; ``timeout_s`` for :meth:`finish`; ``options`` the method's
    options, as a run's ``method_options`` holds them.

    Each group has one :class:`~gtopk_lab.training.step.RankStep` (built from one
    :class:`~gtopk_lab.training.step_settings.StepSettings`, with the group's parameter shapes
    as its layout), kept across iterations: a group's update is exactly what the training step
    gives, the method's memory, aggregate and per-iteration collective state included.
    """

    def __init__(self, model: nn.Module, density: float, method: str = "gtopk",
                 algorithm: str = "butterfly", residual_rule: str | None = None, scope: str = "layer",
                 overlap: bool = True, min_group_numel: int = 0, network: NetworkModel | None = None,
                 group: Any = None, timeout_s: float = 300.0, options: dict[str, Any] | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model has type {type(model).__name__}: expected torch.nn.Module")
        if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0 < density <= 1:
            raise ValueError(f"density={density!r} is invalid: expected a number in (0, 1]")
        for name, value, allowed in (("method", method, available_methods()),
                                     ("algorithm", algorithm, SPARSE_ALGORITHMS),
                                     ("residual_rule", residual_rule, (None, *RESIDUAL_RULES)),
                                     ("scope", scope, SCOPES)):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is invalid: expected one of {', '.join(map(str, allowed))}")
        if isinstance(min_group_numel, bool) or not isinstance(min_group_numel, int) or min_group_numel < 0:
            raise ValueError(f"min_group_numel={min_group_numel!r} is invalid: expected an integer >= 0")
        if not isinstance(overlap, bool):
            raise TypeError(f"overlap={overlap!r} has type {type(overlap).__name__}: expected bool")
        if network is not None and not isinstance(network, NetworkModel):
            raise TypeError(f"network has type {type(network).__name__}: expected NetworkModel or None")
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options={options!r} has type {type(options).__name__}: expected dict or None")
        self._distributed = dist.is_available() and dist.is_initialized()
        self.world = dist.get_world_size(group) if self._distributed else 1
        self.rank = dist.get_rank(group) if self._distributed else 0
        self.settings = StepSettings(get_method(method), world=self.world, residual_rule=residual_rule,
                                     algorithm=algorithm, options=options or {})
        self.settings.check_driver("overlap", scope=scope)
        # tuned by the user
        self.density, self.method, self.algorithm = float(density), method, algorithm
        self.residual_rule, self.scope = residual_rule, scope
        self.overlap = overlap and scope == "layer"
        self.network = network or NetworkModel.from_strings("none")
        self.group, self.timeout_s = group, float(timeout_s)
        # internal state
        self.groups = self._make_groups(model, min_group_numel) if scope == "layer" else [
            [p for p in model.parameters() if p.requires_grad]]
        self.numels = [sum(p.numel() for p in g) for g in self.groups]
        #: completed iterations (the collectives' CommCall.iteration, e.g. CLT-k's leader)
        self.iteration = 0
        # one training step per layer group: its memory and collective state persist
        self.steps = [RankStep(self.settings, n, ps[0].device if ps else torch.device("cpu"), rank=self.rank,
                               layout=[tuple(p.shape) for p in ps])
                      for n, ps in zip(self.numels, self.groups)]
        self._group_of = {id(p): g for g, ps in enumerate(self.groups) for p in ps}
        self._handles = []
        self._lock = threading.Lock()
        self._reset_iteration()
        if self.overlap:
            self._handles = [p.register_post_accumulate_grad_hook(self._on_grad)
                             for ps in self.groups for p in ps]
            self._queue: queue.Queue[int | None] = queue.Queue()
            self._thread = threading.Thread(target=self._comm_loop, name="gtopk-wfbp-comm", daemon=True)
            self._thread.start()

    # --- grouping ---------------------------------------------------------------------------
    @staticmethod
    def _make_groups(model: nn.Module, min_group_numel: int) -> list[list[nn.Parameter]]:
        by_module: dict[str, list[nn.Parameter]] = {}
        for name, p in model.named_parameters():
            if p.requires_grad:
                by_module.setdefault(name.rpartition(".")[0], []).append(p)
        groups: list[list[nn.Parameter]] = []
        current: list[nn.Parameter] = []
        for params in reversed(list(by_module.values())):  # backward finishes the last layers first
            current.extend(params)
            if sum(p.numel() for p in current) >= min_group_numel:
                groups.append(current)
                current = []
        if current:
            groups.append(current)
        return groups

    # --- per iteration ------------------------------------------------------------------------
    def _reset_iteration(self) -> None:
        self._remaining = [len(g) for g in self.groups]
        self._t0: float | None = None
        self._ready_s = [float("nan")] * len(self.groups)
        self._timings: list[GroupTiming | None] = [None] * len(self.groups)
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._released: set[int] = set()

    def _now(self) -> float:
        if self._t0 is None:
            self._t0 = time.perf_counter()
        return time.perf_counter() - self._t0

    def _release(self, g: int) -> None:
        with self._lock:
            if g in self._released:
                return
            self._released.add(g)
            self._ready_s[g] = self._now()
        self._queue.put(g)

    def _on_grad(self, param: torch.Tensor) -> None:
        g = self._group_of[id(param)]
        with self._lock:
            self._remaining[g] -= 1
            ready = self._remaining[g] == 0
        if ready:
            self._release(g)

    def _comm_loop(self) -> None:
        # The current CUDA device is per thread: use the model's, so NCCL runs on the right GPU.
        first = next((p for ps in self.groups for p in ps), None)
        if first is not None and first.device.type == "cuda":
            torch.cuda.set_device(first.device)
        while True:
            expected, ready = 0, set()
            while expected < len(self.groups):
                item = self._queue.get()
                if item is None:
                    return
                ready.add(item)
                while expected in ready:
                    try:
                        if self._error is None:
                            self._communicate(expected)
                    except BaseException as exc:  # noqa: BLE001 - handed to finish()
                        self._error = exc
                    expected += 1
            self._done.set()

    def _communicate(self, g: int) -> None:
        params = self.groups[g]
        start = self._now()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([x.reshape(-1).to(torch.float32) for x in grads])
        numel = flat.numel()
        step = self.steps[g]
        k = k_for(numel, self.density)
        sync = step.begin(flat, k, self.iteration, group=self.group)
        assert sync is not None  # a per-step method synchronises every iteration
        if self._distributed:
            result = step.collective.run(sync.contribution, sync.call)
        else:  # one process without a process group: the in-process collective
            result = step.collective.simulate([sync.contribution], sync.call)[0]
        update = sync.finish(result)
        assert update is not None
        offset = 0
        for p in params:
            n = p.numel()
            chunk = update[offset:offset + n].view_as(p).to(p.dtype)
            if p.grad is None:
                p.grad = chunk.clone()
            else:
                p.grad.copy_(chunk)
            offset += n
        end = self._now()
        self._timings[g] = GroupTiming(g, numel, k, self._ready_s[g], start, end,
                                       self.network.steps_time_s(result.stats.steps), result.stats.bytes_sent)

    def finish(self) -> OverlapReport:
        """Call after ``loss.backward()``: complete every group, return the iteration's report.

        Groups whose parameters received no gradient are communicated with zeros (all ranks
        must take part). Raises the communication thread's exception, or ``RuntimeError``
        after ``timeout_s``.
        """
        backward_end = self._now()
        if self.overlap:
            for g in range(len(self.groups)):
                self._release(g)
            if not self._done.wait(self.timeout_s):
                raise RuntimeError(f"WaitFreeBackprop.finish: communication did not finish within "
                                   f"timeout_s={self.timeout_s}")
        else:
            for g in range(len(self.groups)):
                self._ready_s[g] = backward_end
                self._communicate(g)
        error = self._error
        timings = [t for t in self._timings if t is not None]
        self._reset_iteration()
        self.iteration += 1
        if error is not None:
            raise error
        return self._report(backward_end, timings)

    def _report(self, backward_end: float, timings: list[GroupTiming]) -> OverlapReport:
        real = [(t.start_s, t.end_s) for t in timings]
        modelled = link_timeline([t.ready_s for t in timings], [t.model_s for t in timings])
        comm_s = sum(e - s for s, e in real)
        comm_model_s = sum(t.model_s for t in timings)
        hidden_s = hidden_time_s(real, backward_end)
        hidden_model_s = hidden_time_s(modelled, backward_end)
        last_model_end = modelled[-1][1] if modelled else backward_end
        return OverlapReport(
            backward_end_s=backward_end, groups=timings, comm_s=comm_s, hidden_s=hidden_s,
            exposed_s=max(0.0, max((e for _s, e in real), default=backward_end) - backward_end),
            comm_model_s=comm_model_s, hidden_model_s=hidden_model_s,
            exposed_model_s=max(0.0, last_model_end - backward_end))

    def close(self) -> None:
        """Stop the communication thread and remove the gradient hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self.overlap and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(5.0)

    def __enter__(self) -> "WaitFreeBackprop":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
