"""``gtopk-lab calibrate``: ping-pong over the real backend, fit alpha and beta.

Without ``--scheduler`` the ranks are spawned here on 127.0.0.1 (this machine's
loopback); with ``--scheduler ADDRESS`` they are Dask tasks on two workers on different
hosts of that cluster (two hosts of ``gtopk-lab testbed``, two machines), so the fit is
the link between them (``orchestration.link_calibration``).

``--tcp-terms fit`` (with ``--scheduler``) also times a few P = 2 collective calls on that
link and fits the real-TCP terms (``gtopk_lab.network.tcp_terms``: per-message CPU, duplex);
``--tcp-terms FILE`` stores terms fitted elsewhere (``benchmarks/tcp_model.py`` writes them,
fitted on P <= 4). Either way ``--out`` saves them in the calibration file's model, so
``--bandwidth FILE`` (the virtual clock, ``gtopk-lab model``) charges them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from gtopk_lab.cli.errors import UsageError
from gtopk_lab.counts import split_list

NAME = "calibrate"
HELP = "measure latency/bandwidth of the real backend (ping-pong) and save an alpha-beta preset"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="ranks to spawn; pairs ping-pong at once (default 2)")
    parser.add_argument("--sizes", default="1K,64K,1M,16M",
                        help="message sizes in bytes, K/M/G = 1024-based (default 1K,64K,1M,16M)")
    parser.add_argument("--repeats", type=int, default=10, help="timed round trips per size (default 10)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--timeout", type=float, default=60.0, help="process-group timeout in seconds")
    parser.add_argument("--scheduler", default=None,
                        help="measure the link between two workers of this Dask cluster "
                             "(tcp://HOST:PORT) instead of ranks spawned here")
    parser.add_argument("--link", default=None, metavar="WORKER,WORKER",
                        help="with --scheduler: the two worker addresses (default: the first two "
                             "on different hosts)")
    parser.add_argument("--connect-timeout", type=float, default=10.0,
                        help="with --scheduler: seconds to reach the scheduler (default 10)")
    parser.add_argument("--tcp-terms", default=None, metavar="fit|FILE",
                        help="fit the real-TCP terms on timed P=2 calls over the link (fit, needs "
                             "--scheduler), or store those of a JSON file (benchmarks/tcp_model.py's)")
    parser.add_argument("--out", default=None, help="write the calibration JSON here (usable as --bandwidth FILE)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _on_cluster(args: argparse.Namespace, sizes: list[int]):
    from gtopk_lab.orchestration.cluster import SchedulerUnreachable, connect
    from gtopk_lab.orchestration.link_calibration import calibrate_cluster

    if args.backend != "gloo":
        raise UsageError(f"--backend={args.backend} is invalid with --scheduler: the link is measured with gloo")
    link = split_list(args.link) if args.link else None
    try:
        client, _ = connect(args.scheduler, None, None, tls_ca_file=None, tls_cert=None, tls_key=None,
                            resources=None, connect_timeout_s=args.connect_timeout)
    except SchedulerUnreachable as exc:
        raise UsageError(str(exc)) from None
    with client:
        return calibrate_cluster(client, link, sizes, repeats=args.repeats, timeout_s=args.timeout,
                                 fit_tcp=args.tcp_terms == "fit")


def _terms_file(path: str):
    """TcpTerms of a JSON file: ``{"tcp": {...}}`` (benchmarks/tcp_model.py) or the fields themselves."""
    from gtopk_lab.atomic_io import DamagedFile, read_json_file
    from gtopk_lab.network.tcp_terms import TcpTerms

    try:
        data = read_json_file(path)
    except DamagedFile as exc:
        raise UsageError(f"--tcp-terms={path!r} is invalid: {exc.reason}") from None
    if data is None:
        raise UsageError(f"--tcp-terms={path!r} is invalid: expected fit or a JSON file of TCP terms")
    if isinstance(data.get("tcp"), dict):
        data = data["tcp"]
    try:
        return TcpTerms.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--tcp-terms={path!r} is invalid: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from gtopk_lab.network.calibrate import calibrate, parse_sizes_bytes
    from gtopk_lab.network.model import format_bandwidth, format_latency

    if args.workers < 2:
        raise UsageError(f"--workers={args.workers} is invalid: expected an integer >= 2")
    if args.repeats < 1:
        raise UsageError(f"--repeats={args.repeats} is invalid: expected an integer >= 1")
    if args.link and not args.scheduler:
        raise UsageError("--link needs --scheduler: it names two workers of that cluster")
    if args.tcp_terms == "fit" and not args.scheduler:
        raise UsageError("--tcp-terms fit needs --scheduler: it times calls over a link between two hosts")
    terms = _terms_file(args.tcp_terms) if args.tcp_terms not in (None, "fit") else None
    sizes = parse_sizes_bytes(args.sizes)
    if args.scheduler:
        result = _on_cluster(args, sizes)
    else:
        result = calibrate(workers=args.workers, sizes_bytes=sizes, repeats=args.repeats,
                           backend=args.backend, timeout_s=args.timeout)
    if terms is not None:
        result = dataclasses.replace(result, tcp=terms)
    if args.out:
        result.save(args.out)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    where = f"link {result.endpoints[0]} <-> {result.endpoints[1]}" if result.endpoints else f"{result.workers} ranks"
    print(f"backend {result.backend}, {where}, {result.repeats} repeats, {result.wall_s:.1f} s")
    print(f"{'bytes':>12} {'one-way (us)':>14} {'fit (us)':>10} {'error':>8}")
    for n, t, e in zip(result.sizes_bytes, result.times_s, result.relative_residuals):
        fit = result.fitted_s(n)
        print(f"{n:>12d} {t * 1e6:>14.1f} {fit * 1e6:>10.1f} {e:>+8.1%}")
    model = result.model
    burst = f", a shaper's burst of {result.burst_bytes:.0f} B" if result.burst_bytes > 0 else ""
    print(f"alpha = {format_latency(model.latency_s)}, beta = {model.beta_s_per_byte:.3e} s/B "
          f"({format_bandwidth(model.bandwidth_bps)}){burst}")
    if result.tcp is not None:
        t = result.tcp
        print(f"TCP terms: {t.cpu_s_per_message * 1e6:.1f} us per message, duplex +{t.duplex_beta_fraction:.1%} "
              f"of beta, incast {t.incast_s_per_sender * 1e6:.1f} us per extra sender and "
              f"-{t.incast_beta_fraction:.1%} of beta past the burst")
    if args.out:
        print(f"saved {args.out}; use it as --bandwidth {args.out}")
    return 0
