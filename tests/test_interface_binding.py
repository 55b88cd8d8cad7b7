"""Which interface a rank binds gloo/NCCL to (no root needed).

The oracle for the interface is this machine's own table of addresses, read here with
``socket`` alone (the loopback address is always on ``lo``) and, for the first address of
a non-loopback interface, with ``psutil``'s listing compared address by address.
"""

from __future__ import annotations

import socket

import psutil
import pytest

from gtopk_lab.comm.launch import InterfaceBinding, bind_to_interface, interface_for_address


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
