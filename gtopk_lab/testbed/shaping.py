"""The numbers of the testbed's shaping: rates as users type them, bucket, segment and
queue sizes (:func:`gtopk_lab.testbed.links.shape` applies them with ``tc``).
Standard library only."""

from __future__ import annotations

import re

from gtopk_lab.network.model import parse_bandwidth_bps

__all__ = ["DEFAULT_BURST_S", "DEFAULT_QUEUE_S", "FRAME_BYTES", "burst_bytes", "gso_bytes", "parse_rate_bps"]

FRAME_BYTES = 1514  # a full Ethernet frame as tc counts it (MTU 1500 + header)
#: the token bucket holds this long of the rate (at least two full frames): bursts above
#: the rate are short, as on a port that serialises every frame at its line rate
DEFAULT_BURST_S = 1e-4
#: the queue holds this long of the rate: a long one (50 ms) delays the ACKs of a host's
#: receive behind its own sends on the same link (bidirectional exchanges slow down)
DEFAULT_QUEUE_S = 0.01

_RATE_RE = re.compile(r"^([0-9]*\.?[0-9]+)\s*([kmgt]?)bit$")
_RATE_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_rate_bps(text: str, field: str = "rate") -> float | None:
    """``"200mbit"`` / ``"1gbit"`` (tc's spelling, bits) or ``"200Mbps"`` / ``"1Gbps"``
    (gtopk-lab's, also bits) -> bits per second; ``"none"`` -> None (unshaped).
    tc's own ``mbps`` (megaBYTES) is refused rather than read as bits."""
    if not isinstance(text, str):
        raise TypeError(f"{field}={text!r} has type {type(text).__name__}: expected str")
    s = text.strip()
    if s.lower() in ("none", "off", "unshaped"):
        return None
    if re.match(r"^[0-9.]+\s*[kmgt]bps$", s):
        raise ValueError(f"{field}={text!r} is invalid: tc reads '{s[-4:]}' as bytes per second; "
                         f"write the bits: {s[:-3]}bit, or {s[:-4]}{s[-4].upper()}bps")
    m = _RATE_RE.match(s.lower())
    if m:
        rate = float(m.group(1)) * _RATE_PREFIX[m.group(2)]
    else:
        try:
            rate = parse_bandwidth_bps(s)
        except ValueError:
            raise ValueError(f"{field}={text!r} is invalid: expected a bit rate such as 200mbit, "
                             "1gbit, 200Mbps, or none") from None
    if not (8e3 <= rate <= 1e12):
        raise ValueError(f"{field}={text!r} is invalid: expected a rate between 8kbit and 1tbit")
    return rate


def burst_bytes(rate_bps: float, burst_s: float) -> int:
    return max(2 * FRAME_BYTES, int(rate_bps / 8 * burst_s))


def gso_bytes(rate_bps: float, burst_s: float) -> int:
    """Largest segment the stack hands a shaped veth: one frame less than the bucket."""
    return min(65536, burst_bytes(rate_bps, burst_s) - FRAME_BYTES)
