"""Golden outputs of one short run per method, recorded before the method-registry refactor
(``oktopk``: recorded when issue 16 made it the reference's algorithm; the earlier record is
``oktopk-exact``).

``python tests/golden_runs.py`` (re)writes ``tests/golden/methods.json``; tests/test_golden.py
checks that the code still reproduces it bitwise: final weights (SHA-256 of their bytes),
bytes sent per rank and iteration, training losses and modelled communication times, for
simulated P = 4 runs and real gloo P = 2 runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

GOLDEN = Path(__file__).with_name("golden") / "methods.json"

#: (label, RunConfig changes): every built-in method and gTop-k pattern.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("dense", {"method": "dense"}),
    ("topk", {"method": "topk"}),
    ("gtopk-butterfly", {"method": "gtopk", "algorithm": "butterfly"}),
    ("gtopk-tree", {"method": "gtopk", "algorithm": "tree", "residual_rule": "paper"}),
    ("gaussiank", {"method": "gaussiank"}),
    # recorded as "oktopk" before issue 16 made the reference's Ok-Topk the default
    ("oktopk-exact", {"method": "oktopk-exact"}),
    # recorded with the mass rule, oktopk's default then; the reference's rule is its default
    # since (test_oktopk_faithful checks that one against a port of the reference)
    ("oktopk", {"method": "oktopk", "residual_rule": "mass"}),
    # recorded when local clipping was unscaled at 1.0; DGC's local clip is grad_clip / sqrt(P),
    # so the record is kept by giving grad_clip = 1.0 * sqrt(P) (config_for: "local_clip")
    ("gtopk-dgc", {"method": "gtopk", "momentum_correction": True, "grad_clip_mode": "local",
                   "local_clip": 1.0}),
]


def config_for(changes: dict[str, Any], workers: int) -> Any:
    from gtopk_lab.config import RunConfig

    base = dict(workers=workers, model="mlp", dataset="mnist1d", train_samples=320, test_samples=64,
                batch_size=8, epochs=2, max_iterations=14, density=0.05, lr=0.05, momentum=0.9,
                bandwidth="1GbE", sink_every=5, extra={"return_weights": True})
    changes = dict(changes)
    if "local_clip" in changes:  # each rank's threshold: grad_clip / sqrt(P) = local_clip exactly
        changes["grad_clip"] = changes.pop("local_clip") * math.sqrt(workers)
    base.update(changes)
    return RunConfig(**base)


def fingerprint(result: Any) -> dict[str, Any]:
    """What must not change: weights (hash), bytes, losses and modelled times per row."""
    iters = sorted((r["rank"], r["iteration"], r["bytes_sent"], r["bytes_recv"], repr(r["train_loss"]),
                    repr(r["comm_model_s"])) for r in result.rows if r["kind"] == "iter")
    weights = result.final_weights.contiguous().numpy().tobytes()
    return {"weights_sha256": hashlib.sha256(weights).hexdigest(), "iters": [list(x) for x in iters],
            "k": result.summary["k"], "numel": result.summary["numel"]}


def simulated(changes: dict[str, Any]) -> dict[str, Any]:
    from gtopk_lab.training.simulator import simulate

    return fingerprint(simulate(config_for(changes, 4)))


def real(changes: dict[str, Any]) -> dict[str, Any]:
    from gtopk_lab.comm.launch import run_gloo
    from gtopk_lab.training.loop import gloo_rank_entry

    results = run_gloo(gloo_rank_entry, 2, config_for(changes, 2).to_dict(), timeout_s=120)
    out = fingerprint(results[0])
    out["iters"] = sorted(out["iters"] + fingerprint(results[1])["iters"])
    return out


def real_many(cases: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """:func:`real` of several cases in one 2-rank process group (one process start)."""
    from gtopk_lab.comm.launch import run_gloo
    from gtopk_lab.training.loop import gloo_runs_entry

    configs = [config_for(changes, 2).to_dict() for _, changes in cases]
    results = run_gloo(gloo_runs_entry, 2, configs, timeout_s=60 + 40 * len(cases))
    out = {}
    for i, (label, _) in enumerate(cases):
        fp = fingerprint(results[0][i])
        fp["iters"] = sorted(fp["iters"] + fingerprint(results[1][i])["iters"])
        out[label] = fp
    return out


def record(labels: list[str] | None = None) -> dict[str, Any]:
    """Golden outputs of the cases named (all when None); others keep their stored record."""
    old = json.loads(GOLDEN.read_text()) if labels and GOLDEN.exists() else {}
    return {label: ({"simulated": simulated(ch), "real": real(ch)} if not labels or label in labels
                    else old[label]) for label, ch in CASES}


if __name__ == "__main__":
    # python tests/golden_runs.py [label ...]: re-record only those (e.g. a new method)
    torch.set_num_threads(1)
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(record(sys.argv[1:] or None), indent=1) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
