"""Link units as users type them: rates in bits (or bytes) per second, latencies in seconds.

1. a rate string is a number, an optional SI prefix and a unit, ``"1Gbps"``, ``"2.5 Gbit/s"``,
   ``"125MB/s"`` (capital ``B``: bytes, x 8), or tc's ``"1gbit"``; ``"none"`` is unthrottled
   (``math.inf``); :func:`parse_bandwidth_bps` returns bits per second;
2. a latency string is a number and a unit, ``"0.5ms"``, ``"50us"``, ``"1e-4s"``, or ``"0"``;
   :func:`parse_latency_s` returns seconds;
3. :func:`format_bandwidth` / :func:`format_latency` write them back, for people or (``exact``)
   so that they parse back bit for bit.

Presets and calibration files are :class:`gtopk_lab.network.model.NetworkModel`'s; a bad
string is a ``ValueError`` naming the field and the accepted forms. Cost: O(len(text)).

Worker-side module: imports only the standard library.
"""

from __future__ import annotations

import math
import re

__all__ = ["BANDWIDTH_FORMS", "LATENCY_FORMS", "format_bandwidth", "format_latency", "parse_bandwidth_bps",
           "parse_latency_s"]

BANDWIDTH_FORMS = (
    "a rate like '1Gbps', '100Mbps', '2.5 Gbit/s', '125MB/s' (B = bytes), '1gbit' (tc's); "
    "a preset: 1GbE, 10GbE, 25GbE, 100G-IB, none/unthrottled; "
    "the path of a calibration JSON from 'gtopk-lab calibrate'; "
    "or that JSON's model inline, '{\"latency_s\": ..., \"bandwidth_bps\": ...}'"
)
LATENCY_FORMS = "a latency like '0.5ms', '50us', '1e-4s', '200ns' (or '0')"

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_RATE_RE = re.compile(rf"^{_NUMBER}\s*([kKmMgGtT]?)\s*(bps|bit/s|bits/s|b/s|bit|bits|Bps|B/s|byte/s|bytes/s)$")
_TIME_RE = re.compile(rf"^{_NUMBER}\s*(s|sec|ms|us|µs|μs|ns)$")
_RATE_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_TIME_UNIT = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9}


def parse_bandwidth_bps(text: str) -> float:
    """Parse a rate string ("1Gbps", "2.5 Gbit/s", "125MB/s", tc's "1gbit") into bits per second.

    Presets and calibration files are handled by :meth:`NetworkModel.from_strings`;
    this function accepts rates only (and "none"/"unthrottled" -> ``math.inf``).
    """
    if not isinstance(text, str):
        raise TypeError(f"bandwidth={text!r} has type {type(text).__name__}: expected str")
    s = text.strip()
    if s.lower() in ("none", "unthrottled", "inf", "off"):
        return math.inf
    m = _RATE_RE.match(s)
    if not m:
        raise ValueError(f"bandwidth={text!r} is invalid: expected {BANDWIDTH_FORMS}")
    number, prefix, unit = float(m.group(1)), m.group(2).lower(), m.group(3)
    bits_per_unit = 8.0 if unit.startswith("B") or unit.startswith("byte") else 1.0
    rate = number * _RATE_PREFIX[prefix] * bits_per_unit
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"bandwidth={text!r} is invalid: expected a rate > 0 ({BANDWIDTH_FORMS})")
    return rate


def parse_latency_s(text: str) -> float:
    """Parse a latency string ("0.5ms", "50us", "1e-4s", "0") into seconds."""
    if not isinstance(text, str):
        raise TypeError(f"latency={text!r} has type {type(text).__name__}: expected str")
    s = text.strip()
    if s in ("0", "0.0"):
        return 0.0
    m = _TIME_RE.match(s)
    if not m:
        raise ValueError(f"latency={text!r} is invalid: expected {LATENCY_FORMS}")
    value = float(m.group(1)) * _TIME_UNIT[m.group(2)]
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"latency={text!r} is invalid: expected a finite latency >= 0")
    return value


def format_bandwidth(bandwidth_bps: float, exact: bool = False) -> str:
    """Human form ("889 Mbit/s") or, with ``exact``, a string that parses back bit-exactly."""
    if math.isinf(bandwidth_bps):
        return "none"
    if exact:
        return f"{bandwidth_bps!r}bps"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bandwidth_bps >= scale:
            return f"{bandwidth_bps / scale:.4g} {prefix}bit/s"
    return f"{bandwidth_bps:.4g} bit/s"


def format_latency(latency_s: float, exact: bool = False) -> str:
    """Human form ("436 us") or, with ``exact``, a string that parses back bit-exactly."""
    if exact:
        return f"{latency_s!r}s"
    if latency_s == 0:
        return "0 s"
    if latency_s >= 1:
        return f"{latency_s:.4g} s"
    if latency_s >= 1e-3:
        return f"{latency_s * 1e3:.4g} ms"
    if latency_s >= 1e-6:
        return f"{latency_s * 1e6:.4g} us"
    return f"{latency_s * 1e9:.4g} ns"
