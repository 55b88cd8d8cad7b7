"""``gtopk-lab run``: one training run on a Dask cluster (embedded or remote) or simulated.

Every ``RunConfig`` field is a flag, generated from the dataclass by
:mod:`gtopk_lab.config_flags` (``--max-iterations``, ``--throttle/--no-throttle``,
``--lr-milestones 80,120``, ``--extra key=json`` ...), the same flags as the torchrun entry's.
Everything is validated before any folder, cluster or connection is made, so bad input
ends with exit code 2, one line and no files written.

This module also holds the helpers ``sweep`` and ``demo`` share: deep validation (model,
dataset folder) and opening a :class:`~gtopk_lab.orchestration.Lab`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gtopk_lab.cli.errors import UsageError
from gtopk_lab.config import RunConfig
from gtopk_lab.config_flags import add_config_flags, config_kwargs
from gtopk_lab.jsonsafe import json_safe

NAME = "run"
HELP = "run one training run on a Dask cluster (embedded, tcp:// or tls://) or simulated"

#: Datasets that must come from a local folder (``--data-dir``).
FOLDER_DATASETS: tuple[str, ...] = ("cifar10", "mnist", "ptb", "imagenet")


def validate_config(config: RunConfig) -> None:
    """Checks RunConfig cannot do alone: known model that fits the dataset, dataset folder.

    (``k = max(1, floor(density * numel))`` never exceeds ``numel`` because RunConfig
    keeps density in (0, 1]; the selector is checked against the registry by RunConfig.)
    """
    from gtopk_lab.training.data import DATASETS
    from gtopk_lab.training.models import get_model_spec

    spec = get_model_spec(config.model)  # ValueError listing the known models
    if config.dataset not in DATASETS:
        raise ValueError(f"dataset={config.dataset!r} is invalid: expected one of {', '.join(DATASETS)}")
    if config.dataset not in spec.datasets:
        raise ValueError(f"model={config.model!r} does not fit dataset={config.dataset!r}: "
                         f"it fits {', '.join(spec.datasets)}")
    if config.data_dir is not None and not Path(config.data_dir).expanduser().is_dir():
        raise ValueError(f"data_dir={config.data_dir!r} is invalid: no such folder")
    if config.dataset in FOLDER_DATASETS and config.data_dir is None:
        raise ValueError(f"data_dir=None is invalid for dataset={config.dataset!r}: "
                         "pass --data-dir pointing at the local dataset folder")


# ------------------------------------------------------------------------------------------
# cluster flags
def add_out_argument(parser: Any, sub: str | None = None) -> None:
    """``--out``, defaulting to the results home (``gtopk_lab.results_home``; ``sub``: a
    folder in it), shared by every command that reads or writes runs."""
    from gtopk_lab.results_home import RULE, results_home

    home = results_home(sub)
    where = "the results home" + (f"'s {sub}/" if sub else "")
    parser.add_argument("--out", default=str(home),
                        help=f"results folder (default {where}: {RULE}; here {home})")


def add_identity_arguments(parser: Any) -> None:
    """``--study-id NAME`` and ``--tag T`` (repeatable, or comma-separated): what the runs'
    summaries record (``gtopk_lab.orchestration.run_identity``; ``gtopk-lab runs --study/--tag``)."""
    parser.add_argument("--study-id", default=None, metavar="NAME",
                        help="the study's name in every run's summary (default: a generated study-<time>-<hex>)")
    parser.add_argument("--tag", dest="tags", action="append", default=[], metavar="T",
                        help="a tag recorded in every run's summary (repeat, or comma-separated)")


def identity_args(args: argparse.Namespace) -> tuple[str | None, tuple[str, ...]]:
    """``(study_id, tags)`` of :func:`add_identity_arguments`' flags, checked (exit 2)."""
    from gtopk_lab.orchestration.run_identity import check_study_id, check_tags

    try:
        study_id = None if args.study_id is None else check_study_id(args.study_id, "--study-id")
        tags = check_tags([t.strip() for text in args.tags for t in text.split(",") if t.strip()], "--tag")
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    return study_id, tags


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster")
    group.add_argument("--scheduler", metavar="ADDR", default=None,
                       help="tcp://HOST:PORT or tls://HOST:PORT of a running Dask scheduler "
                            "(default: an embedded LocalCluster on 127.0.0.1)")
    group.add_argument("--n-workers", type=int, default=None,
                       help="workers of the embedded cluster (default: what the run(s) need)")
    group.add_argument("--tls-ca-file", default=None, help="CA certificate (PEM) for tls://")
    group.add_argument("--tls-cert", default=None, help="client certificate (PEM) for tls://")
    group.add_argument("--tls-key", default=None, help="client private key (PEM) for tls://")
    group.add_argument("--timeout", dest="timeout_s", type=float, default=60.0,
                       help="rendezvous/collective timeout per rank and failure-detection bound, s (default 60)")
    group.add_argument("--connect-timeout", dest="connect_timeout_s", type=float, default=10.0,
                       help="seconds to wait for the scheduler (default 10)")
    add_out_argument(group)
    group.add_argument("--no-progress", action="store_true", help="no progress bar")


def validate_cluster_args(args: argparse.Namespace) -> None:
    """Check cluster flags without connecting (so errors come before any side effect)."""
    from gtopk_lab.orchestration.lab import validate_scheduler_address

    if args.n_workers is not None and args.n_workers < 1:
        raise UsageError(f"--n-workers={args.n_workers} is invalid: expected an integer >= 1")
    if not args.timeout_s > 0:
        raise UsageError(f"--timeout={args.timeout_s} is invalid: expected seconds > 0")
    tls = (args.tls_ca_file, args.tls_cert, args.tls_key)
    for flag, value in zip(("--tls-ca-file", "--tls-cert", "--tls-key"), tls):
        if value is not None and not Path(value).is_file():
            raise UsageError(f"{flag}={value!r} is invalid: no such file")
    if args.scheduler is None:
        if any(tls):
            raise UsageError("--tls-ca-file/--tls-cert/--tls-key need --scheduler tls://HOST:PORT")
        return
    args.scheduler = validate_scheduler_address(args.scheduler)
    if args.scheduler.startswith("tls://") and not all(tls):
        raise UsageError(f"--scheduler={args.scheduler!r} needs --tls-ca-file, --tls-cert and --tls-key")
    if args.scheduler.startswith("tcp://") and any(tls):
        raise UsageError(f"--scheduler={args.scheduler!r} is tcp:// but TLS files were given: use tls://")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out={args.out!r} is invalid: it exists and is not a folder")


def local_gpu_resources(workers: int) -> dict[str, float]:
    """Worker resources of an embedded LocalCluster for ``--device cuda``: one GPU each.

    Ranks on one machine take distinct GPUs (``rank_task.select_device``), so at most as
    many ranks as visible CUDA devices: NCCL cannot put two ranks on one GPU.
    """
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        raise UsageError("device='cuda' is invalid here: this machine has no CUDA device for the "
                         "embedded LocalCluster (use --device cpu, or --scheduler for a GPU cluster)")
    if workers > gpus:
        raise UsageError(f"workers={workers} is invalid with device='cuda' on the embedded LocalCluster: "
                         f"{gpus} GPU(s) here and NCCL needs one GPU per rank")
    return {"GPU": 1.0}


def open_lab(args: argparse.Namespace, n_workers_needed: int, progress: bool) -> Any:
    """A Lab for the parsed flags; an unreachable scheduler becomes a UsageError.

    ``--device cuda`` without ``--scheduler`` gives the LocalCluster's workers a ``GPU``
    resource (:func:`local_gpu_resources`), so GPU ranks can be placed on them.
    """
    from gtopk_lab.orchestration.lab import Lab, SchedulerUnreachable

    resources = None
    if args.scheduler is None and getattr(args, "device", "auto") == "cuda":
        resources = local_gpu_resources(n_workers_needed)
    try:
        return Lab(
            scheduler=args.scheduler,
            resources=resources,
            n_workers=args.n_workers or n_workers_needed,
            out=args.out, timeout_s=args.timeout_s, progress=progress,
            tls_ca_file=args.tls_ca_file, tls_cert=args.tls_cert, tls_key=args.tls_key,
            connect_timeout_s=args.connect_timeout_s,
        )
    except SchedulerUnreachable as exc:
        raise UsageError(str(exc)) from None


def print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(json_safe(summary), separators=(",", ":")))
        return
    keys = ("run_id", "status", "method", "workers", "density", "k", "iterations",
            "final_train_loss", "final_test_accuracy", "wall_time_s", "virtual_time_s",
            "samples_per_s_wall", "samples_per_s_virtual", "bytes_sent_per_rank_per_iter")
    for key in keys:
        value = summary.get(key)
        text = f"{value:.6g}" if isinstance(value, float) else str(value)
        print(f"{key:>30}  {text}")
    print(f"{'link':>30}  {summary.get('link')}")
    fields = summary.get("recipe_fields") or ""
    print(f"{'recipe':>30}  {summary.get('recipe') or 'none'}"
          + (f" (supplied {fields.replace(',', ', ')})" if fields else ""))
    if summary.get("error"):
        print(f"{'error':>30}  {summary['error'].splitlines()[0]}")


# ------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    add_cluster_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON (last line)")
    parser.add_argument("--simulate", action="store_true",
                        help="single-process simulator (P virtual workers, no Dask)")
    parser.add_argument("--resume", metavar="RUN_ID", default=None,
                        help="continue the failed, cancelled or crashed run RUN_ID (in --out) with its stored config: "
                             "from its last epoch checkpoint when it ran with --checkpoint "
                             "(Dask or --simulate; kept metric rows are extended), else from "
                             "iteration 0")


def _resume_config(args: argparse.Namespace) -> RunConfig:
    from gtopk_lab.orchestration.results import RunStore

    store = RunStore(args.out, args.resume)
    data = store.read_config()
    if data is None:
        damaged = " (damaged: not a JSON object)" if (store.path / "config.json").exists() else ""
        raise UsageError(f"--resume={args.resume!r} is invalid: no {store.path}/config.json{damaged}")
    summary = store.read_summary() or {}
    if summary.get("status") == "completed":
        raise UsageError(f"--resume={args.resume!r} is invalid: that run already completed")
    data.pop("config_hash", None)
    data["run_id"] = args.resume
    return RunConfig.from_dict(data)


def _resume_point(args: argparse.Namespace, config: RunConfig) -> dict[str, int] | None:
    """The checkpoint ``--resume`` continues from (None: from iteration 0); says which on stderr."""
    from gtopk_lab.orchestration.results import checkpoint_folder
    from gtopk_lab.training.checkpoint import check_rank_files, read_latest

    latest = read_latest(checkpoint_folder(args.out, args.resume))  # damaged: one line, exit 2
    if latest is not None and latest["workers"] != config.workers:
        latest = None
    if latest is not None:
        check_rank_files(checkpoint_folder(args.out, args.resume), latest)
    if latest is None:
        print(f"--resume {args.resume}: no checkpoint in {checkpoint_folder(args.out, args.resume)}; "
              "re-running from iteration 0", file=sys.stderr)
        return None
    print(f"resuming {args.resume} from epoch {latest['epoch']}", file=sys.stderr)
    return latest


def run(args: argparse.Namespace) -> int:
    config = _resume_config(args) if args.resume else RunConfig(**config_kwargs(args))
    validate_config(config)
    resume_at = _resume_point(args, config) if args.resume else None
    if args.simulate:
        if args.scheduler or any((args.tls_ca_file, args.tls_cert, args.tls_key)):
            raise UsageError("--simulate runs in this process: drop --scheduler and the TLS flags")
        from gtopk_lab.orchestration.locks import lock_run
        from gtopk_lab.orchestration.results import new_run_id
        from gtopk_lab.orchestration.simulated_run import simulate_run

        config = config if config.run_id else config.replace(run_id=new_run_id(config))
        with lock_run(Path(args.out) / str(config.run_id)):  # another client writes it: one line, exit 2
            summary = simulate_run(config, args.out, resume_at, timeout_s=args.timeout_s)
    else:
        validate_cluster_args(args)
        with open_lab(args, config.workers, progress=not args.no_progress) as lab:
            handle = lab.submit(config, resume=bool(args.resume))  # keeps the stored rows
            if not args.json:
                print(f"run {handle.run_id} on {len(handle.workers) or config.workers} Dask worker(s); "
                      f"dashboard {lab.dashboard_link}", file=sys.stderr)
            _, summary = handle.result()
    print_summary(summary, args.json)
    return 0 if summary.get("status") == "completed" else 1
