"""Calibrate alpha and beta of the real backend with a ping-pong, and gamma of merges.

Method (the classic Hockney fit):

1. spawn ``workers`` real ranks (``torch.distributed``, gloo on CPU or NCCL on GPU) on
   127.0.0.1 with a free port; ranks ``2i`` and ``2i+1`` form ping-pong pairs, all pairs
   at once (with more than 2 workers that measures a loaded host, not an idle link).
   Across the machines of a Dask cluster instead (the link between two workers, e.g. two
   hosts of ``gtopk-lab testbed``): ``orchestration.link_calibration.calibrate_cluster``
   runs steps 2-3 as one Dask task per worker (:func:`pingpong_medians`,
   :func:`result_from_medians`);
2. for every message size ``n`` (bytes): a few warm-up exchanges, then ``repeats``
   round trips ``send(n) -> recv(n)`` timed on the wall clock; one-way time =
   round trip / 2, the median over repeats is kept (robust to OS jitter);
3. weighted least squares ``t(n) = alpha + beta * n`` with weights ``1 / t`` so that the
   fit minimises *relative* error and the small sizes still pin down alpha
   (:func:`fit_alpha_beta`; exact on noiseless data); where the sizes show a clear kink (a
   token-bucket shaper's burst B: two sizes or more on each side of it, :func:`fit_alpha_beta_burst`)
   ``t(n) = alpha + beta * max(0, n - B)`` instead, B kept as the model's ``TcpTerms.burst_bytes``;
4. the result is a :class:`NetworkModel` saved as JSON; ``NetworkModel.from_strings(path)``
   loads it as a network preset.

Cost: ``sum(sizes) * 2 * (repeats + warmup)`` bytes per pair plus process start-up
(about 3-5 s for two spawned ranks on a small machine).

:func:`measure_gamma_s_per_element` times the project's sparse merge on random
k-sparse vectors, giving the gamma of the alpha-beta-gamma model.

Worker-side module (torch, numpy); no plotting.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import socket
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gtopk_lab.network.link_fit import fit_alpha_beta, fit_alpha_beta_burst
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.network.tcp_terms import TcpTerms

__all__ = [
    "CalibrationResult",
    "DEFAULT_SIZES_BYTES",
    "calibrate",
    "fit_alpha_beta",
    "fit_alpha_beta_burst",
    "measure_gamma_s_per_element",
    "parse_sizes_bytes",
    "pingpong_medians",
    "result_from_medians",
]

DEFAULT_SIZES_BYTES: tuple[int, ...] = (1 << 10, 64 << 10, 1 << 20, 16 << 20)
_SIZE_SUFFIX = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
                "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_sizes_bytes(text: str) -> list[int]:
    """"1K,64K,1M,16M" -> [1024, 65536, 1048576, 16777216] (binary multiples, bytes)."""
    if not isinstance(text, str):
        raise TypeError(f"sizes={text!r} has type {type(text).__name__}: expected str")
    sizes: list[int] = []
    for part in text.split(","):
        p = part.strip().upper()
        number = p.rstrip("KMGIB")
        suffix = p[len(number):]
        try:
            value = float(number) * _SIZE_SUFFIX[suffix]
        except (ValueError, KeyError):
            raise ValueError(f"sizes={text!r} is invalid: expected comma-separated byte counts "
                             "like '1K,64K,1M,16M' (suffixes K, M, G = 1024-based)") from None
        if not (1 <= value <= (1 << 31)) or value != int(value):
            raise ValueError(f"sizes={text!r} is invalid: each size must be a whole number of bytes in [1, 2G]")
        sizes.append(int(value))
    if len(set(sizes)) < 2:
        raise ValueError(f"sizes={text!r} is invalid: need at least two distinct sizes to fit alpha and beta")
    return sizes


@dataclass
class CalibrationResult:
    """Measured one-way times and the fitted model."""

    backend: str
    workers: int
    sizes_bytes: list[int]
    #: median one-way time per size (over repeats and pairs), seconds
    times_s: list[float]
    #: per size, every pair's median one-way time (rank 2i's view)
    pair_times_s: list[list[float]]
    repeats: int
    alpha_s: float
    beta_s_per_byte: float
    wall_s: float
    #: the Dask workers whose link was measured (``calibrate_cluster``); None: local ranks
    endpoints: list[str] | None = None
    #: TCP terms fitted on timed collective calls over the link (``--tcp-terms``); None: none
    tcp: TcpTerms | None = None
    #: the timed calls they were fitted on (``gtopk_lab.network.tcp_fit.merge_rank_reports`` rows)
    tcp_cases: list[dict[str, Any]] | None = None
    #: what carried the ping-pong: the backend's send/recv (None) or the point-to-point
    #: transport of the runs between those workers ("tcp", "shm", "gloo")
    transport: str | None = None
    #: a shaper's burst the fit found (:func:`fit_alpha_beta_burst`; 0: a straight line); it
    #: goes with ``alpha_s`` into the model's TCP terms, whatever ``tcp`` holds
    burst_bytes: float = 0.0
    host: str = field(default_factory=platform.node)
    created: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat())

    @property
    def model(self) -> NetworkModel:
        """The fitted link as a :class:`NetworkModel` named ``calibrated:<backend>`` (with its TCP terms)."""
        plain = NetworkModel.from_alpha_beta(self.alpha_s, self.beta_s_per_byte, name=f"calibrated:{self.backend}")
        tcp = self.tcp
        if tcp is not None or self.burst_bytes > 0:  # the burst of this fit, never one fitted with another alpha
            tcp = dataclasses.replace(tcp or TcpTerms(), burst_bytes=float(self.burst_bytes))
        if tcp is None:
            return plain
        return NetworkModel(plain.latency_s, plain.bandwidth_bps, plain.name, tcp=tcp)

    def fitted_s(self, nbytes: float) -> float:
        """The fit's one-way time of an ``nbytes`` message: ``alpha + beta * max(0, n - burst)``."""
        return self.alpha_s + self.beta_s_per_byte * max(0.0, nbytes - self.burst_bytes)

    @property
    def relative_residuals(self) -> list[float]:
        """(fit - measured) / measured per size."""
        return [(self.fitted_s(n) - t) / t for n, t in zip(self.sizes_bytes, self.times_s)]

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the model's keys (so ``NetworkModel.from_json`` reads it) + the data."""
        out = self.model.to_dict()
        out.update({
            "backend": self.backend, "workers": self.workers, "sizes_bytes": self.sizes_bytes,
            "times_s": self.times_s, "pair_times_s": self.pair_times_s, "repeats": self.repeats,
            "relative_residuals": self.relative_residuals, "wall_s": self.wall_s,
            "host": self.host, "created": self.created,
        })
        if self.endpoints is not None:
            out["endpoints"] = self.endpoints
        if self.tcp_cases is not None:
            out["tcp_cases"] = self.tcp_cases
        if self.transport is not None:
            out["transport"] = self.transport
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_dict` as JSON (atomically: temp file + rename)."""
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.to_dict(), fh, indent=2)
        os.replace(tmp, path)


# --- the measurement on each rank -----------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pingpong_medians(rank: int, world: int, sizes: Sequence[int], repeats: int, warmup: int,
                     device: Any = None, round_trip: Callable[[Any, int, bool], None] | None = None
                     ) -> list[float]:
    """Steps 1-2 of the module docstring on an initialised default process group: ranks
    ``2i`` and ``2i+1`` ping-pong every size; returns this rank's median one-way time per
    size (NaN for a rank without a partner). Every rank must call it (barriers).

    ``round_trip(buf, partner, first)``: one round trip of ``buf`` with ``partner`` (``first``:
    this rank sends first); default the backend's ``send`` / ``recv``. A Dask link
    calibration passes the transport its runs' point-to-point collectives take
    (:func:`gtopk_lab.comm.transport_choice.round_trip_over`), so alpha is that transport's."""
    import torch
    import torch.distributed as dist

    def backend_round_trip(buf: Any, peer: int, first: bool) -> None:
        if first:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)

    round_trip = round_trip or backend_round_trip

    device = device if device is not None else torch.device("cpu")
    cuda = getattr(device, "type", "cpu") == "cuda"
    partner = rank ^ 1
    active = partner < world
    medians: list[float] = []
    for size in sizes:
        buf = torch.zeros(size, dtype=torch.uint8, device=device)
        samples: list[float] = []
        dist.barrier()
        for i in range(warmup + repeats):
            if not active:
                continue
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            round_trip(buf, partner, rank % 2 == 0)
            if cuda:
                torch.cuda.synchronize(device)
            if i >= warmup:
                samples.append((time.perf_counter() - t0) / 2.0)
        medians.append(statistics.median(samples) if samples else float("nan"))
    dist.barrier()
    return medians


def result_from_medians(reports: dict[int, list[float]], sizes: Sequence[int], *, backend: str,
                        repeats: int, wall_s: float, endpoints: list[str] | None = None
                        ) -> CalibrationResult:
    """Step 3: the fit over every pair's medians (rank ``2i``'s report per pair)."""
    workers = len(reports)
    sizes = [int(n) for n in sizes]
    pair_times = [[reports[r][i] for r in range(0, workers - 1, 2)] for i in range(len(sizes))]
    times = [statistics.median(col) for col in pair_times]
    alpha, beta, burst = fit_alpha_beta_burst(sizes, times)
    return CalibrationResult(backend=backend, workers=workers, sizes_bytes=sizes, times_s=times,
                             pair_times_s=pair_times, repeats=repeats, alpha_s=alpha,
                             beta_s_per_byte=beta, wall_s=wall_s, endpoints=endpoints, burst_bytes=burst)


def _pingpong_rank(rank: int, world: int, port: int, backend: str, sizes: list[int], repeats: int,
                   warmup: int, timeout_s: float, queue: Any) -> None:
    """Child process body: init the group, ping-pong with the partner, report medians."""
    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        device = torch.device("cpu")
        if backend == "nccl":
            device = torch.device("cuda", rank % max(1, torch.cuda.device_count()))
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
        try:
            queue.put((rank, pingpong_medians(rank, world, sizes, repeats, warmup, device), None))
        finally:
            dist.destroy_process_group()
    except BaseException:  # report to the parent instead of dying silently
        queue.put((rank, None, traceback.format_exc()))


def calibrate(workers: int = 2, sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, repeats: int = 10,
              backend: str = "gloo", warmup: int = 2, timeout_s: float = 60.0) -> CalibrationResult:
    """Ping-pong over ``backend`` between real spawned ranks and fit alpha/beta (see module doc)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 2:
        raise ValueError(f"workers={workers!r} is invalid: expected an integer >= 2")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r} is invalid: expected gloo or nccl")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} is invalid: expected an integer >= 1")
    sizes = [int(s) for s in sizes_bytes]
    if len(set(sizes)) < 2 or min(sizes) < 1:
        raise ValueError(f"sizes_bytes={sizes!r} is invalid: expected >= 2 distinct sizes >= 1 byte")
    import torch.multiprocessing as mp

    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("backend='nccl' is invalid here: no CUDA device is available (use gloo)")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    start = time.perf_counter()
    procs = [ctx.Process(target=_pingpong_rank, daemon=True,
                         args=(r, workers, port, backend, sizes, repeats, warmup, timeout_s, queue))
             for r in range(workers)]
    for p in procs:
        p.start()
    reports: dict[int, list[float]] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s + 30.0
    try:
        while len(reports) + len(errors) < workers:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"calibration ranks did not finish within {timeout_s + 30:.0f} s")
            try:
                rank, medians, err = queue.get(timeout=min(remaining, 1.0))
            except Exception:  # queue.Empty: check for ranks that died without reporting
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"calibration rank exited with code {dead[0].exitcode}") from None
                continue
            if err is not None:
                errors.append(f"rank {rank}: {err}")
            else:
                reports[rank] = medians
        if errors:
            raise RuntimeError("calibration failed:\n" + "\n".join(errors))
    finally:
        for p in procs:
            p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
    return result_from_medians(reports, sizes, backend=backend, repeats=repeats,
                               wall_s=time.perf_counter() - start)


def measure_gamma_s_per_element(k: int = 100_000, repeats: int = 5, numel: int | None = None,
                                seed: int = 0, idle_before_s: float = 0.0) -> float:
    """Seconds per input element of the project's sparse merge (gamma of alpha-beta-gamma).

    Merges two random k-sparse vectors over ``numel`` (default ``100 k``) elements with
    ``gtopk_lab.compression.merge.merge_sparse`` (union of indices, add, keep top-k) and
    returns the median CPU time / (2k), on the clock a collective times its merges with
    (``merge_cpu_clock``: the thread's at one torch thread, so the Dask worker's own threads
    do not count): CPU time, like the virtual clock's compute, is not inflated when other
    processes share the cores. Run it on the machine
    whose compute you want to model.

    ``idle_before_s > 0`` times each merge as it runs inside a paced collective: after
    sleeping that long (one round's wire time) and on a second operand copied just before,
    as the round's receive buffer is. Back-to-back merges on hot caches are faster than
    that (on a 2-core VM, 2.1 against 2.8 ms for 2 x 25k pairs).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} is invalid: expected an integer >= 1")
    if not (isinstance(idle_before_s, (int, float)) and 0.0 <= idle_before_s <= 10.0):
        raise ValueError(f"idle_before_s={idle_before_s!r} is invalid: expected seconds in [0, 10]")
    import torch

    from gtopk_lab.compression.merge import index_dtype, merge_cpu_clock, merge_sparse

    numel = numel if numel is not None else 100 * k
    gen = torch.Generator().manual_seed(seed)
    idx_dtype = index_dtype(numel)

    def vec() -> tuple[Any, Any]:
        idx = torch.randperm(numel, generator=gen)[:k].sort().values.to(idx_dtype)
        return torch.randn(k, generator=gen), idx

    (va, ia), (vb, ib) = vec(), vec()
    merge_sparse(va, ia, vb, ib, k)  # warm-up
    samples = []
    for _ in range(repeats):
        v2, i2 = vb, ib
        if idle_before_s > 0:
            time.sleep(idle_before_s)
            v2, i2 = vb.clone(), ib.clone()
        t0 = merge_cpu_clock()
        merge_sparse(va, ia, v2, i2, k)
        samples.append(merge_cpu_clock() - t0)
    return statistics.median(samples) / (2 * k)
