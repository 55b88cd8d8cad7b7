"""Train one rank under ``torchrun``: ``python -m gtopk_lab.training.torchrun --method gtopk ...``.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; this module
initialises the default process group from them (gloo on CPU, NCCL when the rank's
device is CUDA), runs :func:`gtopk_lab.training.loop.train_rank` and, on rank 0, prints
the summary as JSON (and writes it to ``--summary-out`` if given). Without torchrun (no
WORLD_SIZE) it runs a single rank without a process group (``--workers`` must be 1).

Every ``RunConfig`` field is an option, with the same syntax as ``gtopk-lab run``
(:mod:`gtopk_lab.config_flags`): ``--density 0.001``, ``--lr-milestones 81,122``,
``--density-warmup 0.004,1``, ``--no-momentum-correction``, ``--extra key=json`` (the
space-separated ``--lr-milestones 81 122`` still parses); ``--recipe NAME`` starts from a
named recipe (gtopk_lab.training.optim.RECIPES). ``--workers`` defaults to WORLD_SIZE.
Examples::

    torchrun --standalone --nproc-per-node 4 -m gtopk_lab.training.torchrun --method gtopk --density 0.01 \\
        --model cnn --dataset mnist1d --epochs 5 --bandwidth 1GbE
    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint host:29400 \\
        -m gtopk_lab.training.torchrun --recipe resnet20-cifar10 --data-dir ~/data/cifar10
    python -m gtopk_lab.training.torchrun --workers 1 --method dense --max-iterations 20
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Sequence

from gtopk_lab.config import RunConfig
from gtopk_lab.config_flags import add_config_flags, config_kwargs
from gtopk_lab.jsonsafe import json_safe


def build_parser() -> argparse.ArgumentParser:
    """One option per RunConfig field, the same flags as ``gtopk-lab run`` (config_flags).

    Options not given are absent from the namespace, so they keep the recipe's or
    RunConfig's value.
    """
    parser = argparse.ArgumentParser(prog="python -m gtopk_lab.training.torchrun", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--summary-out", default=None, help="rank 0 writes the summary JSON here")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="process-group timeout")
    add_config_flags(parser)
    return parser


def config_from_args(args: argparse.Namespace, world_size: int | None) -> RunConfig:
    """RunConfig from parsed options: recipe, then the options given, then WORLD_SIZE."""
    from gtopk_lab.training.optim import RECIPES, recipe

    values = config_kwargs(args)
    if "workers" not in values and world_size is not None:
        values["workers"] = world_size
    name = values.get("recipe")
    if name is not None and name != "auto":  # a named recipe: its model, dataset and density too
        if name not in RECIPES:
            raise ValueError(f"recipe={name!r} is invalid: expected one of {', '.join(RECIPES)}")
        return recipe(name, **values)
    return RunConfig(**values)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 on bad options)."""
    import torch
    import torch.distributed as dist

    from gtopk_lab.training.loop import resolve_device, train_rank

    args = build_parser().parse_args(argv)
    world_env = os.environ.get("WORLD_SIZE")
    world_size = int(world_env) if world_env else None
    try:
        config = config_from_args(args, world_size)
    except (ValueError, TypeError) as exc:
        print(f"gtopk_lab.training.torchrun: error: {exc}", file=sys.stderr)
        return 2
    device = resolve_device(config)
    initialised = False
    try:
        if world_size is not None and not dist.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            if device.type == "cuda":
                torch.cuda.set_device(device)
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout_s))
            initialised = True
        result = train_rank(config, device=device)
        if int(os.environ.get("RANK", "0")) == 0:
            text = json.dumps(json_safe(result.summary), indent=2)
            print(text)
            if args.summary_out:
                with open(args.summary_out, "w", encoding="utf-8") as fh:
                    fh.write(text + "\n")
        return 0
    finally:
        if initialised:
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
