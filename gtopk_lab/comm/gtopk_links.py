"""gTop-k's exact-k rounds straight over this project's links, in numpy: a CPU rank's hot path.

:func:`~gtopk_lab.comm.torch_dist.gtopk_allreduce` runs its per-rank program
(:func:`~gtopk_lab.comm.programs.gtopk_program`) under the recorder and a transport, which
serves every case: counts or exact k, any dtype and device, pacing and profiling. For the
common case of a real CPU rank, where a 1M-element call at k = 1000 costs 40 us of compiled
work and messages, those layers (a generator, the recorder, torch wrappers around each
kernel and message) cost as much again (benchmarks/RESULTS.md, issue 29 item 3). When
:func:`applies` holds, :func:`gtopk_over_links` does the same rounds without them:

1. one compiled pass (``fast_merge``'s sort kernel) finds the selection's index range, checks
   it against ``numel`` and sorts it by index in the wire format (float32 values, int32
   indices), as :func:`~gtopk_lab.compression.merge.canonical_wire` does;
2. for each step of :func:`~gtopk_lab.comm.schedules.cached_schedule`: send the two arrays
   (``links.send_arrays``), take the peer's message (``links.receive_array``: 8k bytes, the
   values then the indices, cut as aligned views), then merge with the lower rank's operand
   first (``fast_merge``'s merge kernel), or keep the peer's vector (a broadcast step);
3. ``links.flush()``, and the CommStats the recorder would have filled: every message is
   the exact-k wire's 8k bytes, one round per step.

The same kernels on the same operands in the same order give the general path's result
bitwise (tests/test_gtopk_links.py checks values, indices, drops and every stats field). A
merge the kernel declines (a NaN sum, an operand with a repeated index) takes
:func:`~gtopk_lab.compression.merge.merge_sparse` on the same operands, as the program does.
Cost beyond the kernels and the links: one thread-CPU clock read around each kernel and the
CommStats, a few microseconds.
"""

from __future__ import annotations

import numpy as np
import torch

from gtopk_lab.comm.links_transport import LinksTransport
from gtopk_lab.comm.schedules import cached_schedule
from gtopk_lab.comm.stats import CollectiveResult, CommStats, merge_cpu_clock
from gtopk_lab.comm.transport import Transport
from gtopk_lab.compression.fast_merge import compiled_kernel, enabled, index_bits, numpy_view
from gtopk_lab.compression.merge import check_range, merge_sparse

__all__ = ["applies", "gtopk_over_links"]


def applies(transport: Transport, values: torch.Tensor, indices: torch.Tensor, numel: int,
            exact_k: bool, world: int) -> bool:
    """Whether :func:`gtopk_over_links` may carry this call: exact k on more than one rank,
    the compiled kernels on, CPU float32 values and int32/int64 indices (already checked
    1-D and of one length by the caller), int32 wire indices (``numel < 2**31``), and
    ``transport`` a :class:`LinksTransport` with no pacer and no profile (those hook the
    general path's rounds). O(1)."""
    return (exact_k and world > 1 and isinstance(transport, LinksTransport) and transport.pacer is None
            and transport.profile is None and numel <= 2**31 - 1
            and values.dtype == torch.float32 and indices.dtype in (torch.int32, torch.int64)
            and values.is_cpu and indices.is_cpu and indices.numel() > 0 and enabled())


def gtopk_over_links(transport: LinksTransport, rank: int, world: int, values: torch.Tensor,
                     indices: torch.Tensor, numel: int, k: int, algorithm: str,
                     name: str) -> CollectiveResult:
    """Steps 1-3 of the module docstring for this rank (the caller checked the arguments
    and :func:`applies`); returns what ``gtopk_allreduce`` returns, bitwise."""
    links, nbytes = transport.links, 8 * k
    v_np, i_np = numpy_view(values), numpy_view(indices)
    t0 = merge_cpu_clock()
    lo, hi, ascending, sorted_v, sorted_i = compiled_kernel("sort")(v_np, i_np, index_bits(numel))
    merge_cpu_s = merge_cpu_clock() - t0
    check_range(int(lo), int(hi), numel, name)
    if ascending:  # the kernel leaves an ascending selection where it is
        sorted_v, sorted_i = v_np, (i_np if i_np.dtype == np.int32 else i_np.astype(np.int32))
    mine_v, mine_i = sorted_v, sorted_i
    merge = compiled_kernel("merge")
    merged_elements, dropped = 0, []
    steps: list[tuple[int, int]] = []
    peers: list[tuple[int | None, int | None]] = []
    messages = received = 0
    for step in cached_schedule(algorithm, rank, world):
        peer = step.peer
        if step.op != "recv":
            if mine_v.size != k:  # as the wire's own check: a broken promise would hang the peer
                raise ValueError(f"exact_k: this rank would send {mine_v.size} pairs, expected exactly {k}")
            links.send_arrays(peer, [mine_v.view(np.uint8), mine_i.view(np.uint8)])
            messages += 1
        if step.op == "send":
            steps.append((nbytes, 0))
            peers.append((peer, None))
            continue
        arr = links.receive_array(peer)
        if arr.size != nbytes:
            raise RuntimeError(f"a message from rank {peer} has {arr.size} bytes: expected {nbytes}")
        received += 1
        steps.append((nbytes if step.op == "exchange" else 0, nbytes))
        peers.append((peer if step.op == "exchange" else None, peer))
        their_v, their_i = arr[:4 * k].view(np.float32), arr[4 * k:].view(np.int32)
        if not step.merge:
            mine_v, mine_i = their_v, their_i
            continue
        a, b = ((mine_v, mine_i), (their_v, their_i)) if rank < peer else ((their_v, their_i), (mine_v, mine_i))
        t0 = merge_cpu_clock()
        ok, mine_v, mine_i, d_v, d_i = merge(a[0], a[1], b[0], b[1], k)
        if not ok:
            kept_v, kept_i, drop_v, drop_i = merge_sparse(*(torch.from_numpy(x) for x in (*a, *b)), k)
            mine_v, mine_i, d_v, d_i = (np.ascontiguousarray(t.numpy()) for t in (kept_v, kept_i, drop_v, drop_i))
        merge_cpu_s += merge_cpu_clock() - t0
        merged_elements += a[0].size + b[0].size
        if step.charge_drops:
            dropped.append((torch.from_numpy(d_v), torch.from_numpy(d_i)))
    links.flush()
    out_v, out_i = torch.from_numpy(mine_v), torch.from_numpy(mine_i)
    drop_v, drop_i = dropped[0] if len(dropped) == 1 else (out_v.new_empty(0), out_i.new_empty(0))
    stats = CommStats(
        collective="gtopk_allreduce", algorithm=algorithm, bytes_sent=nbytes * messages,
        bytes_recv=nbytes * received, messages=messages, rounds=len(steps), steps=steps, peers=peers,
        merge_cpu_s=merge_cpu_s, merged_elements=merged_elements, dropped_values=drop_v, dropped_indices=drop_i,
        library_estimate=False, dropped_parts=dropped if len(dropped) > 1 else None)
    return CollectiveResult(out_v, out_i, stats)
