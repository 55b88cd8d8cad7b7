"""One rank of ``benchmarks/tcp_model.py``, run inside a testbed host (``Testbed.popen``).

``python benchmarks/tcp_model_rank.py SPEC.json RANK``: the spec names the world size, every
rank's address (the store on rank 0's), the port and the cases. The rank

1. binds gloo to the interface carrying its address (``bind_to_interface``) and joins the
   group through rank 0's TCPStore;
2. optionally ping-pongs ``pingpong_sizes`` with its partner (the calibration of alpha, beta),
   over the transport the sparse collectives take (the project's TCP links between hosts);
3. times every case (:func:`gtopk_lab.worker.tcp_calls.time_cases`); with ``slot_s`` (two jobs
   at once) case j starts at ``base_monotonic_s + j * slot_s``, the same instant in both jobs;
4. writes ``OUT/rank<r>.json``.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from gtopk_lab.comm.launch import bind_to_interface, set_single_thread
from gtopk_lab.comm.transport_choice import round_trip_over
from gtopk_lab.network.calibrate import pingpong_medians
from gtopk_lab.network.pacing import wait_until
from gtopk_lab.worker.tcp_calls import time_cases


def main(spec_path: str, rank: int) -> None:
    spec = json.loads(Path(spec_path).read_text())
    world = int(spec["world"])
    bind_to_interface(spec["addresses"][rank])
    set_single_thread()
    timeout = datetime.timedelta(seconds=float(spec.get("timeout_s", 300)))
    store = dist.TCPStore(spec["addresses"][0], int(spec["port"]), world, rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    out: dict[str, Any] = {"rank": rank, "world": world}
    if spec.get("pingpong_sizes"):  # over the transport the sparse collectives take (the TCP links)
        out["transport"], round_trip = round_trip_over()
        out["pingpong_s"] = pingpong_medians(rank, world, spec["pingpong_sizes"], int(spec["pingpong_repeats"]), 2,
                                             round_trip=round_trip)

    def before_case(j: int) -> None:
        if spec.get("slot_s"):
            dist.barrier()
            wait_until(float(spec["base_monotonic_s"]) + j * float(spec["slot_s"]), clock=time.monotonic)

    out["cases"] = time_cases(spec["cases"], rank, world, before_case)
    dist.barrier()
    dist.destroy_process_group()
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
