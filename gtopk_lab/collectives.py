"""Public façade of the collectives (docs/architecture.md): what user scripts import.

The implementations live in :mod:`gtopk_lab.comm`; this module only re-exports them so
that ``from gtopk_lab.collectives import gtopk_allreduce`` keeps working. Package code
imports from :mod:`gtopk_lab.comm` directly.

- :func:`dense_allreduce` — S-SGD baseline, ring allreduce of d floats (library call);
- :func:`topk_allgather` — Top-k S-SGD, allgather of every rank's (value, index) pairs;
- :func:`gtopk_allreduce` — gTop-k S-SGD, global top-k along a butterfly or a binomial tree;
- :func:`oktopk_allreduce` — Ok-Topk, region-balanced sparse allreduce in O(k) per rank;

each returns ``CollectiveResult(values, indices, stats: CommStats)``.
"""

from __future__ import annotations

from gtopk_lab.comm.oktopk import OkTopkState, oktopk_allreduce
from gtopk_lab.comm.programs import allgather_assemble, allgather_steps, dense_stats, gtopk_program
from gtopk_lab.comm.stats import CollectiveResult, CommStats, check_exact_k
from gtopk_lab.comm.torch_dist import dense_allreduce, gtopk_allreduce, topk_allgather
from gtopk_lab.comm.wire import HEADER_BYTES, sparse_message_bytes

__all__ = [
    "CommStats", "CollectiveResult", "dense_allreduce", "topk_allgather", "gtopk_allreduce",
    "oktopk_allreduce", "OkTopkState", "gtopk_program", "HEADER_BYTES", "sparse_message_bytes",
    "allgather_assemble", "allgather_steps", "dense_stats", "check_exact_k",
]
