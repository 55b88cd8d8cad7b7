"""SparseLoCo, and SparseLoCo with its outer sync over gTop-k.

Source: Sarfi, Therien, Lidin, Belilovsky, "Communication Efficient LLM Pre-training with
SparseLoCo", arXiv:2508.15706 (2025). ``sparseloco-gtopk`` is this project's own variant:
no published system aggregates SparseLoCo's pseudo-gradients with gTop-k.

One round (H iterations) on rank i of P, from the shared weights ``theta`` (the anchor):

1. H inner steps of the run's inner optimiser (AdamW by default) on rank i's own batches;
2. the pseudo-gradient ``Delta_i = theta - theta_i``;
3. error feedback with decay: ``e_i <- beta e_i + Delta_i`` (option ``ef_decay``, default
   0.95; beta = 0 turns it off);
4. chunk-wise Top-k: the flat buffer is cut into chunks of ``CHUNK`` = 4096 entries and
   every chunk keeps its ``k_c`` largest |e_i|, with ``k_c`` the chunk's share of k (exactly k
   in all; selector ``chunk-topk``). The paper chunks each weight tensor in 2-D tiles; here
   the chunks run over the flat buffer and may straddle two tensors;
5. 2-bit quantisation (option ``quant_bits``: 2, or 32 for none) of each chunk's selected
   values: one bit for the sign, one for the magnitude class (above / at-or-below the
   chunk's mean |v|), and per chunk two fp32 levels, the mean |v| of each class. (The paper
   quantises to 2 bits with per-chunk statistics; this particular sign+class quantiser is
   this project's choice.) ``Q(v)`` is what the encoding decodes to;
6. the collective (``sparseloco``: a ring allgather of every rank's encoded message, each
   decoded and summed in rank order on every rank; ``sparseloco-gtopk``: see below) gives
   ``G = sum_i Q(TopK(e_i))``;
7. ``e_i <- e_i - Q(TopK(e_i))``: the selected entries leave the buffer and what the encoding
   lost (and, for gTop-k, what a merge dropped) is charged back to it. The collective
   reports it as the rank's drops; the memory always applies the mass-conserving rule, so
   ``sum_i e_i + G`` equals ``sum_i (beta e_i + Delta_i)`` to rounding;
8. the outer step: ``theta <- theta - alpha G / P`` -- the average of the sparse updates, no
   outer momentum (the decayed error buffer plays that role); ``alpha`` = option
   ``outer_lr``, default 1.

Defaults: H = option ``sync_every`` = 8 (small runs), beta = 0.95, alpha = 1, 2 bits,
chunks of 4096, inner AdamW. The paper tunes these per model size; where its exact values
could not be checked offline, the defaults here are this project's choices.

The encoding (:mod:`gtopk_lab.methods.sparseloco_wire`): one uint8 tensor per message,
``2c + 2n + 8m + ceil(n/4)`` bytes for n entries in m non-empty chunks out of c (2-bit),
against 8n for the project's (fp32, int32) pairs, plus the 16-byte tensor header.

``sparseloco-gtopk`` (step 6 by gTop-k, O(k log P) instead of O(k P)): the butterfly or tree
schedule of :func:`gtopk_lab.comm.schedules.sparse_schedule`; every vector that travels is
encoded, and from then on every rank holding it uses its decoded (dequantised) values, so
both ranks of a butterfly exchange merge the same two operands; a merge sums the operands
and keeps the top k (:func:`~gtopk_lab.compression.merge.merge_sparse`). Mass bookkeeping:
the entries a merge drops are charged to the rank the schedule names (``charge_drops``), a
quantisation error to the one rank that owns the vector (the lowest rank of the block that
holds it); when the schedule sends the result back out (tree broadcast, butterfly unfold at
P not a power of two) every rank ends with the decoded result, its owner (rank 0) charged
the difference. Received results are forwarded as received (never re-encoded).

Cost per round: the chunk top-k O(d log k_c); the encoding O(k) (of the rank's own selection: its
compression, ``CommStats.compress_cpu_s``, charged as its selection); ``sparseloco`` sends
(P-1) messages of ~2.25 k + 8 min(c, k) + 2c bytes per rank; ``sparseloco-gtopk``
log2(P) of them (butterfly, P a power of two) and merges 2k entries per round.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

import torch

from gtopk_lab.comm.schedules import largest_power_of_two, sparse_schedule
from gtopk_lab.comm.stats import CollectiveResult, CommStats, merge_cpu_clock, wire
from gtopk_lab.compression.merge import coalesce_sparse, merge_sparse, sort_by_index
from gtopk_lab.methods import formulas as F
from gtopk_lab.methods.base import CommCall, Contribution, Method
from gtopk_lab.methods.programs import program_collective
from gtopk_lab.methods.registry import get_method, register_collective, register_method
from gtopk_lab.methods.sparseloco_wire import (  # the wire format (and its names, re-exported)
    CHUNK, QUANT_BITS, Sparse, chunk_topk, decode, encode, encoded_bytes, quantize,
)
from gtopk_lab.network.formulas import (
    check_sizes, log2_ceil, log2_floor, merge_contention, tree_mergers,
)

__all__ = ["CHUNK", "chunk_topk", "encode", "decode", "quantize", "encoded_bytes", "SparseLoCoMemory",
           "sparseloco_allgather_program", "sparseloco_gtopk_program", "averaged_outer_optimizer",
           "SPARSELOCO_OPTIONS", "SPARSELOCO", "SPARSELOCO_GTOPK"]

#: SparseLoCo's options and defaults (``method_options`` overrides them per run).
SPARSELOCO_OPTIONS: dict[str, Any] = {"sync_every": 8, "optimizer": "adamw", "ef_decay": 0.95,
                                      "quant_bits": 2, "outer_lr": 1.0}

TensorRequests = Generator[tuple[str, int, "torch.Tensor | None"], "torch.Tensor | None", Any]


# =========================================================================== steps 3 and 7: memory
class SparseLoCoMemory:
    """The decayed error buffer e_i: ``compensate(Delta) = beta e + Delta``; ``update`` zeroes the
    rank's selection and adds back what the collective charged it (always the mass rule: the
    run's ``residual_rule`` does not apply, since quantisation errors must come back)."""

    def __init__(self, numel: int, rule: str, device: torch.device | str | None,
                 options: Mapping[str, Any] | None = None) -> None:
        beta = float((options or {}).get("ef_decay", SPARSELOCO_OPTIONS["ef_decay"]))
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"method_options ef_decay={beta!r} is invalid: expected a number in [0, 1]")
        bits = (options or {}).get("quant_bits", SPARSELOCO_OPTIONS["quant_bits"])
        if bits not in QUANT_BITS:  # checked here so that a bad value fails before training
            raise ValueError(f"method_options quant_bits={bits!r} is invalid: expected one of {QUANT_BITS}")
        self.beta = beta
        self.residual = torch.zeros(numel, device=device)

    def compensate(self, g: torch.Tensor) -> torch.Tensor:
        return g.reshape(-1) + self.beta * self.residual

    def update(self, acc: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, result: Any) -> None:
        residual = acc.reshape(-1).clone()
        residual[indices.long()] = 0.0
        d_i = result.stats.dropped_indices
        if d_i is not None and d_i.numel():
            residual.index_add_(0, d_i.to(residual.device).long(),
                                result.stats.dropped_values.to(residual.device, residual.dtype))
        self.residual = residual

    def state_dict(self) -> dict[str, Any]:
        return {"residual": self.residual.detach().cpu().clone(), "beta": self.beta}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.residual = state["residual"].to(self.residual.device).clone()


# =========================================================================== step 6: collectives
def _result(name: str, algorithm: str, values: torch.Tensor, indices: torch.Tensor, drops: list[Sparse],
            cpu_s: float, merged: int, compress_cpu_s: float) -> CollectiveResult:
    """``cpu_s``: the decodes and merges (merge CPU); ``compress_cpu_s``: step 5, the encoding
    of this rank's own selection (its compression, charged as its selection)."""
    if drops:
        d_v, d_i = coalesce_sparse(torch.cat([d[0] for d in drops]), torch.cat([d[1] for d in drops]))
    else:
        d_v, d_i = values.new_empty(0), indices.new_empty(0)
    return CollectiveResult(values, indices, CommStats(collective=name, algorithm=algorithm, merge_cpu_s=cpu_s,
                                                       merged_elements=merged, dropped_values=d_v,
                                                       dropped_indices=d_i, compress_cpu_s=compress_cpu_s))


def sparseloco_allgather_program(rank: int, world: int, contribution: Contribution, call: CommCall
                                 ) -> TensorRequests:
    """Step 6 by a ring allgather of the encoded messages (P-1 rounds); every rank decodes all P
    and sums them in rank order. This rank is charged its own quantisation error."""
    bits = int(call.options.get("quant_bits", 2))
    values, indices = sort_by_index(*wire(contribution.values, contribution.indices, call.numel))
    t0 = merge_cpu_clock()
    mine, (q_values, _q_idx) = quantize(values, indices, call.numel, bits)
    compress_cpu_s = merge_cpu_clock() - t0
    blobs = {rank: mine}
    send = mine
    for step in range(1, world):  # one round: send right, receive from the left
        send = yield ("sendrecv", ((rank + 1) % world, (rank - 1) % world), send)
        blobs[(rank - step) % world] = send
    t0 = merge_cpu_clock()
    parts = [decode(blobs[r], call.numel, bits) if r != rank else (q_values, indices) for r in range(world)]
    total_v, total_i = coalesce_sparse(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
    cpu_s = merge_cpu_clock() - t0
    drops = [(values - q_values, indices)] if bits != 32 else []
    return _result("sparseloco_allgather", "ring", total_v, total_i, drops, cpu_s,
                   sum(p[0].numel() for p in parts), compress_cpu_s)


def _result_travels(algorithm: str, world: int) -> bool:
    """Whether the schedule sends the merged result out again (tree broadcast, butterfly unfold)."""
    if world == 1:
        return False
    return algorithm == "tree" or world != largest_power_of_two(world)


def sparseloco_gtopk_program(rank: int, world: int, contribution: Contribution, call: CommCall
                             ) -> TensorRequests:
    """Step 6 by gTop-k over encoded messages (module docstring, ``sparseloco-gtopk``)."""
    bits, numel, k = int(call.options.get("quant_bits", 2)), call.numel, call.k
    algorithm = call.algorithm or "butterfly"
    values, indices = sort_by_index(*wire(contribution.values, contribution.indices, numel))
    drops: list[Sparse] = []
    cpu = [0.0, 0.0]  # merge CPU (decodes, merges, a merged vector's encoding); own encoding
    merged = 0
    blob: torch.Tensor | None = None  # the message of the vector held now, once encoded

    def travel(owner: bool) -> torch.Tensor:
        """Encode the held vector (once), adopt its decoded values, charge the owner the loss."""
        nonlocal values, indices, blob
        if blob is None:
            t0 = merge_cpu_clock()
            blob, (q_values, q_indices) = quantize(values, indices, numel, bits)
            if owner and bits != 32:
                drops.append((values - q_values, indices))
            values, indices = q_values, q_indices
            # before any merge the vector is this rank's own selection: its compression
            cpu[0 if merged else 1] += merge_cpu_clock() - t0
        return blob

    schedule = sparse_schedule(algorithm, rank, world)
    spread = ("broadcast", "unfold")
    reduce = [s for s in schedule if s.phase not in spread]
    distribute = [s for s in schedule if s.phase in spread]
    round_ = 0  # butterfly round: the vector held is shared by the aligned block of 2**round_ ranks
    for step in reduce:
        if step.op == "send":  # fold or tree reduce: the sender alone holds its vector
            yield ("send", step.peer, travel(owner=True))
            continue
        if step.op == "exchange":
            out = travel(owner=rank % (1 << round_) == 0)
            theirs_blob = yield ("exchange", step.peer, out)
            round_ += 1
        else:  # a receive that merges: my own operand never travelled
            theirs_blob = yield ("recv", step.peer, None)
        t0 = merge_cpu_clock()
        theirs = decode(theirs_blob, numel, bits)
        mine = (values, indices)
        first, second = (mine, theirs) if rank < step.peer else (theirs, mine)
        values, indices, d_v, d_i = merge_sparse(first[0], first[1], second[0], second[1], k)
        merged += first[0].numel() + second[0].numel()
        cpu[0] += merge_cpu_clock() - t0
        blob = None
        if step.charge_drops:
            drops.append((d_v, d_i))
    if world == 1:  # nothing travels: keep the top k (a selector may give more), own the rest
        values, indices, d_v, d_i = merge_sparse(values, indices, values.new_empty(0), indices.new_empty(0), k)
        drops.append((d_v, d_i))
    holds_result = rank == 0 if algorithm == "tree" else rank < largest_power_of_two(world)
    if _result_travels(algorithm, world) and holds_result:
        travel(owner=rank == 0)  # every holder adopts the decoded result; rank 0 owns the loss
    for step in distribute:
        if step.op == "send":
            yield ("send", step.peer, travel(owner=False))
        else:  # the result as received; forwarded as received
            blob = yield ("recv", step.peer, None)
            values, indices = decode(blob, numel, bits)
    return _result("sparseloco_gtopk", algorithm, values, indices, drops, cpu[0], merged, cpu[1])


# =========================================================================== formulas
def _message_bytes(numel: int, k: int) -> int:
    """A message of k entries spread over min(c, k) chunks, 2-bit (the method's default)."""
    return encoded_bytes(k, min(-(-numel // CHUNK), k), numel, bits=2)


def sparseloco_allgather_time_s(net: Any, numel: int, k: int, workers: int, *, algorithm: str | None = None,
                                gamma_s_per_element: float = 0.0, host_cores: int | None = None,
                                exact_k: bool = False) -> float:
    """``(P-1) (a + b B) + gamma P k c(P)``: P-1 ring rounds of one encoded message of
    ``B = 2c + 2.25k + 8 min(c, k)`` bytes, then the sum of P k decoded entries."""
    check_sizes(numel, k, workers)
    p = workers
    if p == 1:
        return 0.0
    return ((p - 1) * (net.latency_s + net.beta_s_per_byte * _message_bytes(numel, k))
            + gamma_s_per_element * p * k * merge_contention(p, host_cores))


def sparseloco_allgather_bytes_per_rank(numel: int, k: int, workers: int, pair_bytes: int = 8,
                                        algorithm: str | None = None) -> float:
    """``(P-1) B``: every rank forwards P-1 encoded messages (2-bit; tensor headers left out)."""
    return float((workers - 1) * _message_bytes(numel, k))


def sparseloco_gtopk_time_s(net: Any, numel: int, k: int, workers: int, *, algorithm: str | None = None,
                            gamma_s_per_element: float = 0.0, host_cores: int | None = None,
                            exact_k: bool = False) -> float:
    """gTop-k's round structure with encoded messages of at most B bytes (k entries):
    butterfly ``(log2 p' + 2 [P != p']) (a + b B) + merges``, tree ``2 ceil(log2 P) (a + b B) +
    merges``, a merge of 2k entries costing ``gamma 2k`` times its contention (as for gTop-k)."""
    check_sizes(numel, k, workers)
    p = workers
    if p == 1:
        return 0.0
    msg = net.latency_s + net.beta_s_per_byte * _message_bytes(numel, k)
    merge = gamma_s_per_element * 2 * k
    if algorithm == "tree":
        levels = log2_ceil(p)
        return 2 * levels * msg + merge * sum(merge_contention(tree_mergers(p, j), host_cores)
                                              for j in range(1, levels + 1))
    rounds = log2_floor(p)
    inner = 1 << rounds
    folded = p != inner
    return ((rounds + 2 * folded) * msg + rounds * merge * merge_contention(inner, host_cores)
            + folded * merge * merge_contention(p - inner, host_cores))


def sparseloco_gtopk_bytes_per_rank(numel: int, k: int, workers: int, pair_bytes: int = 8,
                                    algorithm: str | None = "butterfly") -> float:
    """gTop-k's messages per rank (:func:`~gtopk_lab.methods.formulas.gtopk_bytes_per_rank`), each
    an encoded message of at most B bytes instead of k pairs."""
    return F.gtopk_bytes_per_rank(numel, k, workers, _message_bytes(numel, k) / k, algorithm)


# =========================================================================== the methods
def averaged_outer_optimizer(params: list[torch.nn.Parameter], config: Any) -> torch.optim.Optimizer:
    """Step 8: plain SGD of lr ``outer_lr`` (alpha) on G / P, no momentum."""
    lr = get_method(config.method).run_options(config.method_options)["outer_lr"]
    if not lr > 0:
        raise ValueError(f"method_options outer_lr={lr!r} is invalid: expected a number > 0")
    return torch.optim.SGD(params, lr=lr, momentum=0.0)


def sparseloco_method(name: str, collective: Any, description: str, **fields: Any) -> Method:
    """A SparseLoCo-shaped :class:`Method` over ``collective`` (not registered)."""
    return Method(name=name, selector="chunk-topk", collective=collective, memory=SparseLoCoMemory,
                  sync_every=SPARSELOCO_OPTIONS["sync_every"], outer_optimizer=averaged_outer_optimizer,
                  options=SPARSELOCO_OPTIONS, description=description, **fields)


#: Where SparseLoCo departs from its paper (the module docstring's steps 4, 5 and defaults).
SPARSELOCO_DEPARTURES: tuple[str, ...] = (
    "chunks of 4096 over the flat buffer (the paper tiles each tensor)",
    "the sign + magnitude-class 2-bit quantiser is this project's",
    f"H = {SPARSELOCO_OPTIONS['sync_every']} and beta = {SPARSELOCO_OPTIONS['ef_decay']} are this project's choices",
)

SPARSELOCO = register_method(sparseloco_method(
    "sparseloco", register_collective(program_collective(
        "sparseloco-allgather", sparseloco_allgather_program, lossless=False, compresses=True,
        time_s=sparseloco_allgather_time_s, bytes_per_rank=sparseloco_allgather_bytes_per_rank,
        description="ring allgather of chunk-wise 2-bit messages, decoded and summed (O(kP))")),
    "SparseLoCo (Sarfi et al. 2025): H local steps, decayed EF, chunk top-k, 2-bit, averaged outer step",
    departures=SPARSELOCO_DEPARTURES, color="#8C564B"))

SPARSELOCO_GTOPK = register_method(sparseloco_method(
    "sparseloco-gtopk", register_collective(program_collective(
        "sparseloco-gtopk", sparseloco_gtopk_program, lossless=False, algorithms=("butterfly", "tree"),
        compresses=True,
        time_s=sparseloco_gtopk_time_s, bytes_per_rank=sparseloco_gtopk_bytes_per_rank,
        description="gTop-k merge of 2-bit chunk messages, drops charged to their owner (O(k log P))")),
    "SparseLoCo with its outer sync over gTop-k (this project's variant)",
    departures=("no paper: this project's variant (gTop-k merges of the 2-bit messages)",) + SPARSELOCO_DEPARTURES,
    family="sparseloco", color="#C49C94"))
