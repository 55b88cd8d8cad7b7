"""``gtopk-lab testbed up | down | status | exec``: a multi-host network on this machine.

``up`` builds N network namespaces on one shaped switch with a ``dask scheduler`` in
host 0 and a ``dask worker`` in every other host (``gtopk_lab.testbed``), then

- runs ``-- COMMAND ...`` in host 0 and removes the testbed when it ends (``{scheduler}``
  in the command becomes the scheduler's address), or
- with ``--detach`` returns and leaves it up (``down`` removes it), or
- waits until Ctrl-C / SIGTERM and removes it.

``down`` removes a testbed, also a stale one left by a killed ``up``; ``exec HOST --
COMMAND`` runs a command inside host HOST (the client of a run, a shell); ``set HOST
--down | --up | --rate R`` is a fault while a run goes (a pulled cable, a slower link).
Root only;
without root, namespaces or tc one line says why (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from gtopk_lab.cli.errors import UsageError
from gtopk_lab.counts import split_list
from gtopk_lab.testbed import (
    Testbed, TestbedError, change_host, remove_testbed, testbed_names, testbed_problem, testbed_status,
)
from gtopk_lab.testbed.links import check_name, host_namespace
from gtopk_lab.testbed.testbed import STATE_DIR

NAME = "testbed"
HELP = "a multi-host network on this machine (namespaces, shaped links, dask scheduler + workers)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))
    sub.required = True
    up = sub.add_parser("up", help="build a testbed (and run a command in host 0, or wait)")
    up.add_argument("--hosts", type=int, required=True, help="hosts: host 0 runs the scheduler, 1..N-1 a worker each")
    up.add_argument("--rate", default="1gbit", help="each host's send and receive rate (200mbit, 1gbit, 1Gbps, none)")
    up.add_argument("--rate-per-host", default=None, metavar="R0,R1,...",
                    help="one rate per host instead of --rate (a straggler: 1gbit,1gbit,100mbit)")
    up.add_argument("--shaper", choices=("tbf", "htb"), default="tbf", help="queueing discipline (default tbf)")
    up.add_argument("--burst", type=float, default=None, metavar="SECONDS",
                    help="token bucket size in seconds of the rate (default 0.001: 125 kB at 1 Gbit/s)")
    up.add_argument("--subnet", default="10.77.0.0/24", help="private IPv4 subnet of the hosts (default 10.77.0.0/24)")
    up.add_argument("--no-dask", action="store_true", help="the network only, no scheduler or workers")
    up.add_argument("--worker-args", default="", help="extra `dask worker` flags, one string ('--no-nanny')")
    up.add_argument("--detach", action="store_true", help="return and leave the testbed up (`down` removes it)")
    up.add_argument("command", nargs=argparse.REMAINDER,
                    help="-- COMMAND ...: run in host 0, then remove the testbed ({scheduler} = its address)")
    down = sub.add_parser("down", help="remove a testbed (live or stale): processes, links, namespaces")
    down.add_argument("--all", action="store_true", help="every gtopk-lab testbed on this machine")
    status = sub.add_parser("status", help="the testbeds on this machine, their hosts and processes")
    status.add_argument("--json", action="store_true")
    st = sub.add_parser("set", help="a fault while a run goes: a host's link down/up, or a new rate")
    st.add_argument("host", type=int, help="host index")
    st.add_argument("--rate", default=None, help="the host's new rate each way (50mbit, none)")
    group = st.add_mutually_exclusive_group()
    group.add_argument("--down", action="store_true", help="take the host off the switch (cable pulled)")
    group.add_argument("--up", action="store_true", help="put it back")
    ex = sub.add_parser("exec", help="run a command inside a host: exec HOST -- COMMAND ...")
    ex.add_argument("host", type=int, help="host index (0 = the scheduler's host)")
    ex.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    for p in (up, down, status, st, ex):
        p.add_argument("--name", default="tb", help="testbed name, 1-8 lower-case letters/digits (default tb)")


def _command(words: list[str]) -> list[str]:
    return words[1:] if words[:1] == ["--"] else words


def _problem_or_exit() -> None:
    problem = testbed_problem()
    if problem is not None:
        raise UsageError(problem)


def _print_status(tb: Testbed) -> None:
    for link in tb.links:
        rate = "unshaped" if link.rate_bps is None else f"{link.rate_bps / 1e6:g} Mbit/s each way"
        role = "scheduler" if link.index == 0 and tb.dask else ("worker" if tb.dask else "host")
        print(f"  host {link.index}: {link.address} on {link.ifname} ({link.namespace}), {rate}, {role}")
    if tb.dask:
        print(f"  scheduler {tb.scheduler_address}; a client runs inside a host: "
              f"gtopk-lab testbed exec --name {tb.name} 0 -- gtopk-lab run --scheduler {tb.scheduler_address} ...")


def _up(args: argparse.Namespace) -> int:
    command = _command(args.command)
    if args.detach and command:
        raise UsageError("--detach and a command exclude each other: the command's end removes the testbed")
    folder = STATE_DIR / f"testbed-{check_name(args.name)}" if args.detach else None
    try:
        tb = Testbed(args.hosts, args.rate, split_list(args.rate_per_host) if args.rate_per_host else None,
                     name=args.name, subnet=args.subnet, shaper=args.shaper, dask=not args.no_dask,
                     worker_args=args.worker_args.split(), folder=folder, detached=args.detach,
                     **({"burst_s": args.burst} if args.burst is not None else {}))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _on_signals_exit()
    try:
        tb.up()  # removes what it built if it fails
    except TestbedError as exc:
        raise UsageError(str(exc)) from None
    try:
        print(f"testbed {tb.name}: {len(tb.links)} hosts up in {tb.folder}", flush=True)
        _print_status(tb)
        if args.detach:
            print(f"left up; remove it with: gtopk-lab testbed down --name {tb.name}")
            return 0
        if command:
            words = [w.replace("{scheduler}", tb.scheduler_address) for w in command]
            proc = tb.popen(0, words, cwd=os.getcwd())
            return proc.wait()
        print("Ctrl-C removes it", flush=True)
        while True:
            time.sleep(3600)
    finally:
        if not args.detach:
            tb.down()


def _on_signals_exit() -> None:
    """SIGTERM and SIGHUP end ``up`` like Ctrl-C: through ``finally``, which removes it."""
    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def _down(args: argparse.Namespace) -> int:
    _problem_or_exit()
    names = testbed_names() if args.all else [check_name(args.name)]
    removed_any = False
    for name in names:
        try:
            removed = remove_testbed(name)
        except TestbedError as exc:
            raise UsageError(str(exc)) from None
        if removed:
            removed_any = True
            print(f"removed testbed {name}: {len(removed)} namespaces and their links and processes")
    if not removed_any:
        print("no testbed to remove" if args.all else f"no testbed {args.name}")
    return 0


def _status(args: argparse.Namespace) -> int:
    states = [s for s in (testbed_status(n) for n in testbed_names()) if s is not None]
    if args.json:
        print(json.dumps(states, indent=2))
        return 0
    if not states:
        print("no testbed")
    for s in states:
        tag = " (stale: its owner is gone; `down` removes it)" if s.get("stale") else ""
        print(f"testbed {s['name']}: {len(s.get('hosts', []))} hosts, scheduler {s.get('scheduler')}{tag}")
        for h in s.get("hosts", []):
            rate = "unshaped" if h.get("rate_bps") is None else f"{h['rate_bps'] / 1e6:g} Mbit/s"
            print(f"  host {h['index']}: {h['address']} on {h['interface']}, {rate}, "
                  f"{len(h.get('pids', []))} processes")
    return 0


def _set(args: argparse.Namespace) -> int:
    if args.rate is None and not (args.down or args.up):
        raise UsageError("set needs --rate, --down or --up")
    _problem_or_exit()
    try:
        entry = change_host(args.name, args.host, up=True if args.up else (False if args.down else None),
                            rate=args.rate)
    except TestbedError as exc:
        raise UsageError(str(exc)) from None
    rate = "unshaped" if entry["rate_bps"] is None else f"{entry['rate_bps'] / 1e6:g} Mbit/s each way"
    link = " link down," if args.down else (" link up," if args.up else "")
    print(f"testbed {args.name} host {args.host}:{link} {rate}")
    return 0


def _exec(args: argparse.Namespace) -> int:
    command = _command(args.command)
    if not command:
        raise UsageError("exec needs a command: gtopk-lab testbed exec HOST -- COMMAND ...")
    name = check_name(args.name)
    if name not in testbed_names():
        raise UsageError(f"no testbed {name}: `gtopk-lab testbed up --name {name} ...` builds one")
    ns = host_namespace(name, args.host)
    if not Path(f"/run/netns/{ns}").exists():
        raise UsageError(f"host={args.host} is invalid: testbed {name} has no host {args.host}")
    sys.stdout.flush()
    os.execvp("ip", ["ip", "netns", "exec", ns, *command])
    return 127  # pragma: no cover - exec does not return


def run(args: argparse.Namespace) -> int:
    return {"up": _up, "down": _down, "status": _status, "set": _set, "exec": _exec}[args.action](args)
