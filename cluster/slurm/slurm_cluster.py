#!/usr/bin/env python3
"""gtopk-lab on a SLURM cluster: one batch job per rank, one GPU per job, mutual TLS.

Run this on a login node (or from JupyterLab there). It starts a Dask scheduler in this
process with dask-jobqueue's ``SLURMCluster``, submits ``--workers`` batch jobs, each of
which runs ONE ``dask worker`` with one thread and the resource ``GPU=1`` on one allocated
GPU (``--gres=gpu:1``: SLURM sets CUDA_VISIBLE_DEVICES, so each rank sees its GPU as
cuda:0), waits for all of them and runs one gtopk-lab experiment through ``Lab``.

Tested against (pin these in the environment the jobs activate)::

    dask-jobqueue==0.9.0  dask==2026.8.0  distributed==2026.8.0  torch==2.13.0

Example::

    python cluster/make_certs.py --out ~/gtopk-certs       # once; $HOME is shared with the nodes
    python cluster/slurm/slurm_cluster.py --workers 8 --partition gpu --account myproj \\
        --venv ~/gtopk-lab/.venv --tls-dir ~/gtopk-certs --interface ib0 \\
        --method gtopk --model resnet20 --dataset cifar10 --data-dir ~/data/cifar10

Cost: ``--workers`` jobs of ``--job-cpus`` cores, ``--memory`` and one GPU each, for up to
``--walltime``; they start when SLURM schedules them (``squeue -u $USER``) and end when
this script closes the cluster (also on error or Ctrl-C).

Security: the scheduler listens on ``tls://`` only; ``--tls-dir`` must hold the output of
cluster/make_certs.py on a filesystem the compute nodes read (keys mode 0600, your user).
Dask's TLS does not cover torch.distributed's own traffic between the ranks (gloo/NCCL),
which stays on the cluster's private network.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path


def build_cluster(args: argparse.Namespace):  # -> dask_jobqueue.SLURMCluster
    """A SLURMCluster whose every job is one single-threaded worker on one GPU."""
    from dask_jobqueue import SLURMCluster
    from distributed.security import Security

    tls = Path(args.tls_dir).expanduser().resolve()
    for name in ("ca.pem", "worker.pem", "worker-key.pem", "client.pem", "client-key.pem",
                 "scheduler.pem", "scheduler-key.pem"):
        if not (tls / name).is_file():
            raise ValueError(f"tls_dir={str(tls)!r} is invalid: {name} is missing "
                             "(create the files with cluster/make_certs.py)")
    # One Security for the three roles: the scheduler (here), the workers (dask-jobqueue
    # passes the worker paths to `dask worker --tls-...`) and the client (here).
    security = Security(
        tls_ca_file=str(tls / "ca.pem"),
        tls_scheduler_cert=str(tls / "scheduler.pem"), tls_scheduler_key=str(tls / "scheduler-key.pem"),
        tls_worker_cert=str(tls / "worker.pem"), tls_worker_key=str(tls / "worker-key.pem"),
        tls_client_cert=str(tls / "client.pem"), tls_client_key=str(tls / "client-key.pem"),
        require_encryption=True,
    )
    prologue = [
        f"source {Path(args.venv).expanduser()}/bin/activate",
        # one intra-op thread per rank unless the job has more cores to give it
        f"export OMP_NUM_THREADS={args.job_cpus} MKL_NUM_THREADS={args.job_cpus}",
    ]
    if args.interface:
        # torch.distributed's sockets (gloo; NCCL's bootstrap and socket transport) on the
        # same network as Dask. NCCL still prefers InfiniBand verbs where it finds them.
        prologue.append(f"export GLOO_SOCKET_IFNAME={args.interface} NCCL_SOCKET_IFNAME={args.interface}")
    gres = f"--gres=gpu:{args.gpu_type}:1" if args.gpu_type else "--gres=gpu:1"
    return SLURMCluster(
        queue=args.partition,
        account=args.account,
        # cores/processes: one Dask worker process with ONE thread per job = one rank.
        cores=1,
        processes=1,
        job_cpu=args.job_cpus,  # what SLURM reserves (--cpus-per-task): data loading, torch
        memory=args.memory,
        walltime=args.walltime,
        job_extra_directives=[gres],
        worker_extra_args=["--resources", "GPU=1"],
        job_script_prologue=prologue,
        # the venv's interpreter on the nodes, not this (login node) process's sys.executable
        python=str(Path(args.venv).expanduser() / "bin" / "python"),
        interface=args.interface,
        protocol="tls://",
        security=security,
        scheduler_options={"dashboard_address": f"127.0.0.1:{args.dashboard_port}"},
        log_directory=str(Path(args.log_dir).expanduser()),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = parser.add_argument_group("SLURM")
    g.add_argument("--workers", type=int, required=True, help="P: ranks = jobs = GPUs")
    g.add_argument("--partition", required=True)
    g.add_argument("--account", default=None)
    g.add_argument("--gpu-type", default=None, help="e.g. a100 -> --gres=gpu:a100:1")
    g.add_argument("--job-cpus", type=int, default=4)
    g.add_argument("--memory", default="32GB")
    g.add_argument("--walltime", default="02:00:00")
    g.add_argument("--venv", required=True, help="virtualenv with gtopk-lab, visible on the nodes")
    g.add_argument("--tls-dir", required=True, help="output of cluster/make_certs.py, on a shared filesystem")
    g.add_argument("--interface", default=None, help="network interface of the nodes, e.g. ib0 or eth0")
    g.add_argument("--dashboard-port", type=int, default=8787)
    g.add_argument("--log-dir", default="~/gtopk-slurm-logs")
    g.add_argument("--wait-s", type=float, default=3600.0, help="longest wait for the jobs to start")
    r = parser.add_argument_group("run (RunConfig fields)")
    r.add_argument("--method", default="gtopk")
    r.add_argument("--density", type=float, default=0.001)
    r.add_argument("--model", default="resnet20")
    r.add_argument("--dataset", default="cifar10")
    r.add_argument("--data-dir", default=None)
    r.add_argument("--epochs", type=int, default=1)
    r.add_argument("--out", default="results/slurm")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers={args.workers} is invalid: expected an integer >= 1")

    from distributed import Client

    from gtopk_lab.config import RunConfig
    from gtopk_lab.jsonsafe import json_safe
    from gtopk_lab.orchestration.lab import Lab

    config = RunConfig(method=args.method, density=args.density, workers=args.workers,
                       model=args.model, dataset=args.dataset, data_dir=args.data_dir,
                       epochs=args.epochs, device="cuda")
    cluster = build_cluster(args)
    print(cluster.job_script(), file=sys.stderr)  # what each job runs, for the record
    try:
        cluster.scale(jobs=args.workers)
        with Client(cluster, security=cluster.security) as client:
            print(f"dashboard (tunnel it): {client.dashboard_link}", file=sys.stderr)
            client.wait_for_workers(args.workers, timeout=args.wait_s)
            lab = Lab(client=client, out=args.out)
            try:
                _metrics, summary = lab.run(config)
            finally:
                lab.close()
        print(json.dumps(json_safe(summary), indent=2))  # NaN (no evaluation) -> null
        return 0 if summary.get("status") == "completed" else 1
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
