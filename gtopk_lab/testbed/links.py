"""The testbed's network: namespaces as hosts, one bridge as the switch, shaped veth links.

Layout of a testbed named ``tb`` with N hosts (every name below is the testbed's own):

- a namespace ``gtopk-tb-sw`` (the switch) holding the bridge ``br0``;
- per host i a namespace ``gtopk-tb-h<i>`` holding loopback and the interface ``tb-h<i>``
  with address ``subnet + i + 1`` (10.77.0.1 for host 0), the other end ``tb-p<i>`` of
  its veth pair a port of the bridge.

Both ends of each veth pair are created directly inside their namespaces
(``ip link add ... netns``), so nothing of the testbed ever appears in the host's own
namespace and no packet can leave it: the subnet exists only on these interfaces. The
host's namespace gets one ``unreachable`` route for the subnet (protocol 77, removed with
the testbed), so a client started outside the testbed by mistake fails at once ("No
route to host") instead of sending the subnet's packets to the host's default gateway;
a subnet that overlaps any of the host's own networks is refused.

Shaping (:func:`shape`): a host's send is limited by a qdisc on the egress of ``tb-h<i>``
and its receive by one on the egress of the switch port ``tb-p<i>``, as on a switch port
where both directions have the line rate. ``tbf`` (default) or ``htb``; the bucket holds
``max(2 frames, rate x burst_s)`` (``burst_s`` = 100 us: 2.5 kB at 200 Mbit/s, 12.5 kB at
1 Gbit/s; a message larger than that crosses at the rate, as on a real port), the veth's
segments (``gso_max_size``) are one frame smaller than the bucket so the qdisc never cuts
them up (which capped a 1 Gbit/s link at ~300 Mbit/s on the 2-core box), and the queue
holds ``rate x queue_s`` (10 ms by default, at least a few frames and a segment), about a
switch port's buffer; a longer queue holds a host's ACKs behind its own data. No delay:
this kernel has no ``netem``.

Cost: about 8 ``ip``/``tc`` calls per host (a few milliseconds each). Client side
(needs root: CAP_NET_ADMIN and CAP_SYS_ADMIN for namespaces).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from gtopk_lab.testbed.shaping import (
    FRAME_BYTES, DEFAULT_BURST_S, DEFAULT_QUEUE_S, burst_bytes, gso_bytes, parse_rate_bps,
)

__all__ = [
    "NAMESPACE_PREFIX", "TestbedError", "Link", "check_name", "create_network", "destroy_network",
    "host_namespace", "link_names", "namespace_pids", "process_alive", "parse_rate_bps", "set_link_up", "shape",
    "switch_namespace", "testbed_names", "testbed_problem",
]

#: Every namespace of every testbed starts with this: ``down --all`` removes only those.
NAMESPACE_PREFIX = "gtopk-"
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
#: routing protocol number that marks the testbed's unreachable routes in the host namespace
_ROUTE_PROTO = "77"
_COMMAND_TIMEOUT_S = 20.0


class TestbedError(RuntimeError):
    """A testbed cannot be built, used or removed; the message is one line."""

    __test__ = False  # not a pytest test class despite the name


@dataclass(frozen=True)
class Link:
    """One host's network: its namespace, interface, address and shaped rate."""

    index: int
    namespace: str
    ifname: str
    port: str
    address: str
    prefixlen: int
    #: bits per second each way; None = unshaped (the veth's own speed)
    rate_bps: float | None
    #: largest segment the stack hands this veth (set once, when it is created)
    gso_max_bytes: int = 65536


def check_name(name: str) -> str:
    """A testbed name: 1-8 lower-case letters/digits starting with a letter (interface
    names are at most 15 characters: ``<name>-h<i>``)."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"name={name!r} is invalid: expected 1-8 lower-case letters or digits, "
                         "starting with a letter")
    return name


def switch_namespace(name: str) -> str:
    return f"{NAMESPACE_PREFIX}{name}-sw"


def host_namespace(name: str, index: int) -> str:
    return f"{NAMESPACE_PREFIX}{name}-h{index}"


def link_names(name: str, index: int) -> tuple[str, str]:
    """(host-side interface, switch-side port) of host ``index``."""
    return f"{name}-h{index}", f"{name}-p{index}"


# --- commands -----------------------------------------------------------------------------
def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"`{' '.join(argv)}` did not finish within {_COMMAND_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise TestbedError(f"`{argv[0]}` cannot run: {exc}") from None
    if check and proc.returncode != 0:
        why = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()[0]
        raise TestbedError(f"`{' '.join(argv)}` failed: {why}")
    return proc


def _ip(namespace: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *(("-n", namespace) if namespace else ()), *args], check=check)


def _tc(namespace: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", "netns", "exec", namespace, "tc", *args], check=check)


def testbed_problem() -> str | None:
    """Why a testbed cannot be built here (one line), or None when it can: Linux, root,
    ``ip`` and ``tc``, and a namespace whose veth takes a ``tbf`` qdisc (tried and removed)."""
    if sys.platform != "linux":
        return "the testbed needs Linux network namespaces"
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces and tc need CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the testbed needs `{tool}` (install iproute2)"
    probe = f"{NAMESPACE_PREFIX}probe{os.getpid()}"
    try:
        _ip(None, "netns", "add", probe)
    except TestbedError as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _ip(probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb")
        _tc(probe, "qdisc", "add", "dev", "pa", "root", "tbf", "rate", "200mbit", "burst", "32kb",
            "limit", "256kb")
    except TestbedError as exc:
        return f"cannot shape a veth with tbf in a namespace: {exc}"
    finally:
        _ip(None, "netns", "del", probe, check=False)
    return None


def testbed_names() -> list[str]:
    """Names of the testbeds whose namespaces exist now (live or stale)."""
    proc = _ip(None, "netns", "list", check=False)
    names = set()
    for line in proc.stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        m = re.match(rf"^{re.escape(NAMESPACE_PREFIX)}([a-z][a-z0-9]*)-(sw|h[0-9]+)$", ns)
        if m:
            names.add(m.group(1))
    return sorted(names)


def _namespaces_of(name: str) -> list[str]:
    proc = _ip(None, "netns", "list", check=False)
    pattern = re.compile(rf"^{re.escape(NAMESPACE_PREFIX)}{re.escape(name)}-(sw|h[0-9]+)$")
    return [line.split()[0] for line in proc.stdout.splitlines() if line.split() and pattern.match(line.split()[0])]


def namespace_pids(namespace: str) -> list[int]:
    """Processes running in ``namespace`` (``ip netns pids``)."""
    proc = _ip(None, "netns", "pids", namespace, check=False)
    return [int(tok) for tok in proc.stdout.split() if tok.isdigit()]


# --- building -----------------------------------------------------------------------------
def host_links(name: str, rates_bps: list[float | None], subnet: str = "10.77.0.0/24",
               burst_s: float = DEFAULT_BURST_S) -> list[Link]:
    """The links of a testbed of ``len(rates_bps)`` hosts (nothing is created)."""
    try:
        net = ipaddress.ip_network(subnet, strict=True)
    except ValueError as exc:
        raise ValueError(f"subnet={subnet!r} is invalid: {exc}") from None
    if net.version != 4 or not net.is_private:
        raise ValueError(f"subnet={subnet!r} is invalid: expected a private IPv4 network such as 10.77.0.0/24")
    if len(rates_bps) + 2 > net.num_addresses:
        raise ValueError(f"hosts={len(rates_bps)} is invalid: subnet {subnet} has room for "
                         f"{max(0, net.num_addresses - 2)} hosts")
    links = []
    for i, rate in enumerate(rates_bps):
        ifname, port = link_names(name, i)
        gso = 65536 if rate is None else gso_bytes(rate, burst_s)
        links.append(Link(i, host_namespace(name, i), ifname, port, str(net.network_address + i + 1),
                          net.prefixlen, rate, gso))
    return links


def create_network(name: str, links: list[Link], shaper: str = "tbf",
                   queue_s: float = DEFAULT_QUEUE_S, burst_s: float = DEFAULT_BURST_S) -> None:
    """Build the switch, the hosts and their shaped links (module docstring). On any
    failure everything built so far is removed before the error propagates."""
    check_name(name)
    if shaper not in ("tbf", "htb"):
        raise ValueError(f"shaper={shaper!r} is invalid: expected tbf or htb")
    existing = _namespaces_of(name)
    if existing:
        raise TestbedError(f"testbed {name!r} exists already ({existing[0]}): "
                           f"`gtopk-lab testbed down --name {name}` removes it")
    subnet = f"{ipaddress.ip_network(f'{links[0].address}/{links[0].prefixlen}', strict=False)}"
    clash = _host_network_overlapping(subnet)
    if clash is not None:
        raise TestbedError(f"subnet={subnet!r} is invalid: it overlaps {clash} of this machine; "
                           "choose another private subnet (--subnet)")
    switch = switch_namespace(name)
    try:
        _ip(None, "route", "add", "unreachable", subnet, "proto", _ROUTE_PROTO)
        _ip(None, "netns", "add", switch)
        _ip(switch, "link", "add", "br0", "type", "bridge")
        _ip(switch, "link", "set", "br0", "up")
        for link in links:
            _ip(None, "netns", "add", link.namespace)
            _ip(link.namespace, "link", "set", "lo", "up")
            _ip(link.namespace, "link", "add", link.ifname, "type", "veth", "peer", "name", link.port,
                "netns", switch)
            _ip(link.namespace, "addr", "add", f"{link.address}/{link.prefixlen}", "dev", link.ifname)
            if link.gso_max_bytes < 65536:
                # a segment larger than the bucket would be cut up inside the qdisc (CPU-bound
                # at ~300 Mbit/s here): the stack makes segments that fit it instead
                gso = str(link.gso_max_bytes)
                _ip(link.namespace, "link", "set", link.ifname, "gso_max_size", gso)
                _ip(switch, "link", "set", link.port, "gso_max_size", gso)
            _ip(link.namespace, "link", "set", link.ifname, "up")
            _ip(switch, "link", "set", link.port, "master", "br0")
            _ip(switch, "link", "set", link.port, "up")
            if link.rate_bps is not None:
                shape(link, link.rate_bps, shaper, queue_s, switch, burst_s)
    except BaseException:
        destroy_network(name)
        raise


def shape(link: Link, rate_bps: float | None, shaper: str = "tbf",
          queue_s: float = DEFAULT_QUEUE_S, switch: str | None = None,
          burst_s: float = DEFAULT_BURST_S) -> None:
    """Limit ``link``'s send and receive to ``rate_bps`` each (None: remove the limit).
    Replaces what was there, so it also changes a running testbed's rate."""
    ends = ((link.namespace, link.ifname), (switch or _switch_of(link), link.port))
    for namespace, dev in ends:
        _tc(namespace, "qdisc", "del", "dev", dev, "root", check=False)
        if rate_bps is None:
            continue
        rate = f"{int(rate_bps)}bit"
        # a rate changed on a running link keeps the link's segments: the bucket holds one
        burst = f"{max(burst_bytes(rate_bps, burst_s), link.gso_max_bytes + FRAME_BYTES)}b"
        limit = f"{max(4 * FRAME_BYTES + link.gso_max_bytes, int(rate_bps / 8 * queue_s))}b"
        if shaper == "tbf":
            _tc(namespace, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", rate,
                "burst", burst, "limit", limit)
        else:
            _tc(namespace, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
            _tc(namespace, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                "rate", rate, "ceil", rate, "burst", burst, "cburst", burst)


def _switch_of(link: Link) -> str:
    return link.namespace.rsplit("-h", 1)[0] + "-sw"


def set_link_up(link: Link, up: bool) -> None:
    """Take host ``link`` off the switch (``up=False``: its port goes down, as when a cable
    is pulled) or put it back. The host's own interface stays configured."""
    _ip(_switch_of(link), "link", "set", link.port, "up" if up else "down")
    if up:  # neighbours that failed to resolve while it was down would refuse for seconds
        prefix = link.namespace.rsplit("-h", 1)[0] + "-h"
        for ns in _ip(None, "netns", "list").stdout.split():
            if ns.startswith(prefix):
                _ip(ns, "neigh", "flush", "all", check=False)


# --- removing -----------------------------------------------------------------------------
def destroy_network(name: str, grace_s: float = 5.0) -> list[str]:
    """Stop every process inside testbed ``name``'s namespaces (SIGTERM, then SIGKILL after
    ``grace_s``) and delete the namespaces (which deletes their links). Works on a stale
    testbed left by a killed process. Returns the namespaces removed."""
    check_name(name)
    namespaces = _namespaces_of(name)
    _stop_pids({pid for ns in namespaces for pid in namespace_pids(ns)}, grace_s)
    for ns in namespaces:
        _ip(None, "netns", "del", ns, check=False)
    left = _namespaces_of(name)
    if left:
        raise TestbedError(f"could not delete namespace {left[0]} of testbed {name!r}")
    _drop_unused_routes()
    return namespaces


def _host_network_overlapping(subnet: str) -> str | None:
    """The first of the host namespace's routes and addresses that overlaps ``subnet``
    (described for the error), or None."""
    net = ipaddress.ip_network(subnet)
    routes = json.loads(_ip(None, "-j", "-4", "route", "show", "table", "all").stdout or "[]")
    for route in routes:
        dst = route.get("dst", "default")
        if dst == "default":
            continue
        try:
            other = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if other.overlaps(net):
            owner = " (another testbed's)" if route.get("protocol") == _ROUTE_PROTO else ""
            return f"the route {dst}{owner}" + (f" on {route['dev']}" if route.get("dev") else "")
    return None


def _drop_unused_routes() -> None:
    """Delete the testbed routes (protocol 77) of subnets no remaining testbed uses."""
    used = set()
    for other in testbed_names():
        for ns in _namespaces_of(other):
            addrs = json.loads(_ip(ns, "-j", "-4", "addr", "show", check=False).stdout or "[]")
            used |= {str(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
                     for iface in addrs for a in iface.get("addr_info", []) if iface.get("ifname") != "lo"}
    routes = json.loads(_ip(None, "-j", "-4", "route", "show", "proto", _ROUTE_PROTO,
                            check=False).stdout or "[]")
    for route in routes:
        if route.get("type") == "unreachable" and route.get("dst") not in used:
            _ip(None, "route", "del", "unreachable", route["dst"], "proto", _ROUTE_PROTO, check=False)


def _stop_pids(pids: set[int], grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while pids and time.monotonic() < deadline:
            pids = {pid for pid in pids if process_alive(pid)}
            if pids:
                time.sleep(0.05)
        if not pids:
            return


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not; one of our children is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours is gone for every purpose here: reap it
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                return fh.read().split(b") ", 1)[-1][:1] != b"Z"
        except OSError:
            return False
