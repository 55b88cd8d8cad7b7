"""Which interface a rank binds gloo/NCCL to, and the testbed's input checks (no root needed).

The oracle for the interface is this machine's own table of addresses, read here with
``socket`` alone (the loopback address is always on ``lo``) and, for the first address of
a non-loopback interface, with ``psutil``'s listing compared address by address.
"""

from __future__ import annotations

import socket

import psutil
import pytest

from gtopk_lab.comm.launch import InterfaceBinding, bind_to_interface, interface_for_address
from gtopk_lab.orchestration.link_calibration import pick_link
from gtopk_lab.testbed.links import check_name, host_links, parse_rate_bps


def _some_interface_address() -> tuple[str, str] | None:
    """(interface, IPv4 address) of one interface that is not loopback, if any."""
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return name, a.address
    return None


def test_the_interface_is_found_from_the_address_not_the_hostname() -> None:
    assert interface_for_address("127.0.0.1") in ("lo", "lo0")
    assert interface_for_address("localhost") in ("lo", "lo0")
    other = _some_interface_address()
    if other is not None:
        assert interface_for_address(other[1]) == other[0]
    assert interface_for_address("10.77.0.250") is None  # on no interface here
    assert interface_for_address("no-such-host.invalid") is None


def test_binding_sets_both_variables_and_an_explicit_one_wins() -> None:
    env: dict[str, str] = {}
    binding = bind_to_interface("127.0.0.1", env)
    assert binding == InterfaceBinding(binding.interface, "worker address 127.0.0.1")
    assert env == {"GLOO_SOCKET_IFNAME": binding.interface, "NCCL_SOCKET_IFNAME": binding.interface}
    env = {"GLOO_SOCKET_IFNAME": "eth7"}
    assert bind_to_interface("127.0.0.1", env) == InterfaceBinding("eth7", "GLOO_SOCKET_IFNAME")
    assert env == {"GLOO_SOCKET_IFNAME": "eth7"}  # nothing else touched
    env = {"NCCL_SOCKET_IFNAME": "ib0"}
    bound = bind_to_interface("127.0.0.1", env)
    assert env["NCCL_SOCKET_IFNAME"] == "ib0" and env["GLOO_SOCKET_IFNAME"] == bound.interface


def test_a_stray_worker_address_is_a_one_line_error() -> None:
    with pytest.raises(ValueError) as info:
        bind_to_interface("10.77.0.250", {})
    message = str(info.value)
    assert "\n" not in message
    assert "10.77.0.250" in message and "no network interface of this host" in message
    assert "GLOO_SOCKET_IFNAME" in message
    # the operator's choice still wins over a stray address
    assert bind_to_interface("10.77.0.250", {"GLOO_SOCKET_IFNAME": "lo"}).interface == "lo"


@pytest.mark.parametrize("text, bps", [("200mbit", 200e6), ("1gbit", 1e9), ("1.5gbit", 1.5e9),
                                       ("500kbit", 5e5), ("200Mbps", 200e6), ("1Gbps", 1e9),
                                       ("none", None)])
def test_rates_in_tc_and_gtopk_spelling(text: str, bps: float | None) -> None:
    assert parse_rate_bps(text) == bps


@pytest.mark.parametrize("text", ["200mbps", "fast", "", "1kbit", "2tbit", "-5mbit"])
def test_bad_rates_are_one_line_errors(text: str) -> None:
    with pytest.raises(ValueError, match=r"^rate='.*' is invalid: "):
        parse_rate_bps(text)


def test_host_addresses_names_and_subnet_checks() -> None:
    links = host_links("tb", [200e6, None, 1e9], "10.77.0.0/24")
    assert [ln.address for ln in links] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    assert [ln.namespace for ln in links] == ["gtopk-tb-h0", "gtopk-tb-h1", "gtopk-tb-h2"]
    assert [(ln.ifname, ln.port) for ln in links] == [("tb-h0", "tb-p0"), ("tb-h1", "tb-p1"),
                                                      ("tb-h2", "tb-p2")]
    assert all(len(ln.ifname) <= 15 for ln in host_links("abcdefgh", [None] * 250, "10.77.0.0/16"))
    with pytest.raises(ValueError, match="room for 2 hosts"):
        host_links("tb", [None] * 3, "10.77.0.0/30")
    with pytest.raises(ValueError, match="private IPv4"):
        host_links("tb", [None], "8.8.8.0/24")
    with pytest.raises(ValueError, match="subnet='10.77.0.1/24' is invalid"):
        host_links("tb", [None], "10.77.0.1/24")
    for bad in ("TB", "tb-1", "", "toolongname", "1tb"):
        with pytest.raises(ValueError, match="is invalid: expected 1-8 lower-case"):
            check_name(bad)


def test_a_link_is_two_workers_on_different_hosts() -> None:
    assert pick_link(["tcp://10.0.0.3:1", "tcp://10.0.0.2:9", "tcp://10.0.0.2:5"]) == \
        ["tcp://10.0.0.2:5", "tcp://10.0.0.3:1"]
    with pytest.raises(ValueError, match="2 worker\\(s\\) on 1 host\\(s\\)"):
        pick_link(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"])


def test_without_root_the_testbed_says_why_in_one_line(monkeypatch, capsys) -> None:
    from gtopk_lab.cli.main import main
    from gtopk_lab.testbed import links

    monkeypatch.setattr(links.os, "geteuid", lambda: 1000)
    for argv in (["testbed", "up", "--hosts", "2"], ["testbed", "down"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "the testbed needs root" in err, err
