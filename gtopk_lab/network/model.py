"""Alpha-beta(-gamma) network model: parsing, presets and collective times.

A point-to-point message of ``n`` bytes costs ``alpha + beta * n`` seconds (Hockney's
model): ``alpha`` is the per-message latency (``latency_s``) and ``beta`` the time per
byte (``beta_s_per_byte = 8 / bandwidth_bps``). Every rank has its own full-duplex link,
so a communication round in which a rank sends ``s`` and receives ``r`` bytes costs it
``alpha + beta * max(s, r)`` and a collective costs the sum over its rounds
(:meth:`NetworkModel.steps_time_s`). An optional ``gamma`` (seconds per element) adds the
merge/selection compute on the critical path (the alpha-beta-gamma model). An optional
``tcp`` (:class:`~gtopk_lab.network.tcp_terms.TcpTerms`: per-message CPU, slow start,
incast, duplex) adds what real TCP costs beside alpha-beta to every round; None (the
default) is the plain model, bitwise.

Users type networks as strings; :meth:`NetworkModel.from_strings` accepts

- a rate: ``"1Gbps"``, ``"100Mbps"``, ``"2.5 Gbit/s"``, ``"125MB/s"`` (capital ``B`` = bytes),
  or tc's spelling ``"1gbit"``, ``"100mbit"``, ``"500kbit"`` (bits; note that tc reads
  ``mbps`` as megabytes per second, while here ``Mbps``/``mbps`` are megabits, as everywhere
  in gtopk-lab),
- a preset: ``"1GbE"``, ``"10GbE"``, ``"25GbE"``, ``"100G-IB"``, ``"none"``/``"unthrottled"``,
- the path of a calibration JSON written by ``gtopk-lab calibrate``,

and a latency such as ``"0.5ms"``, ``"50us"``, ``"1e-4s"``. A latency given explicitly
overrides the preset's; a bare rate without a latency means a latency of 0 (pure
bandwidth link).

Worker-side module: imports only the standard library, :mod:`~gtopk_lab.network.tcp_terms` and
:mod:`~gtopk_lab.network.units` (the rate and latency strings).
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from gtopk_lab.network.tcp_terms import TcpTerms
from gtopk_lab.network.units import (BANDWIDTH_FORMS as _BANDWIDTH_FORMS, format_bandwidth,
                                     format_latency, parse_bandwidth_bps, parse_latency_s)

__all__ = [
    "DEFAULT_NETWORK",
    "NetworkModel",
    "PRESETS",
    "link_text",
    "network_model",
    "parse_bandwidth_bps",
    "parse_latency_s",
    "format_bandwidth",
    "format_latency",
    "portable_bandwidth",
    "bandwidth_label",
]



# --- presets ---------------------------------------------------------------------------
# (latency_s, bandwidth_bps, note).  Bandwidths are *effective* (what a large message sees
# after protocol overhead), not the nominal line rate.
PRESETS: dict[str, tuple[float, float, str]] = {
    # Shi et al. (ICDCS'19) fitted constants for their 1 GbE cluster: alpha = 0.436 ms,
    # beta = 9e-6 ms/byte = 9e-9 s/byte, i.e. 8 / 9e-9 bit/s ~ 889 Mbit/s effective.
    "1GbE": (0.436e-3, 8.0 / 9e-9, "paper's fitted 1 GbE constants (alpha 0.436 ms, beta 9e-6 ms/B)"),
    # 10 GbE with TCP: ~9.4 Gbit/s goodput, tens of microseconds per message through the
    # kernel stack.
    "10GbE": (50e-6, 9.4e9, "10 GbE over TCP: 9.4 Gbit/s goodput, 50 us per message"),
    # 25 GbE with TCP: ~23.5 Gbit/s goodput, slightly lower per-message latency.
    "25GbE": (30e-6, 23.5e9, "25 GbE over TCP: 23.5 Gbit/s goodput, 30 us per message"),
    # InfiniBand EDR (100 Gbit/s signalling, 64b/66b): ~97 Gbit/s data rate; MPI/NCCL
    # point-to-point latency over RDMA is a few microseconds including software.
    "100G-IB": (2e-6, 97e9, "InfiniBand EDR 100G over RDMA: 97 Gbit/s, 2 us per message"),
    "none": (0.0, math.inf, "unthrottled: no modelled communication cost"),
}
#: THE default link of every entry (RunConfig, ``run``, ``sweep``, ``study``, ``demo``,
#: ``model``, the ControlPanel): the paper's fitted 1 GbE, latency included (0.436 ms,
#: 889 Mbit/s). ``"none"`` (no communication cost) only when asked for.
DEFAULT_NETWORK: str = "1GbE"
_PRESET_ALIASES: dict[str, str] = {
    "1gbe": "1GbE", "10gbe": "10GbE", "25gbe": "25GbE",
    "100g-ib": "100G-IB", "100gib": "100G-IB", "ib": "100G-IB", "edr": "100G-IB",
    "none": "none", "unthrottled": "none", "inf": "none", "off": "none",
}

@dataclass(frozen=True)
class NetworkModel:
    """A per-rank full-duplex link: ``latency_s`` per message, ``bandwidth_bps`` bits/s.

    ``bandwidth_bps = math.inf`` means unthrottled (zero per-byte cost). ``name`` is a
    label only (the preset or the string the user typed) and is ignored by ``==``.
    ``gamma_s_per_element`` is an optional default compute cost per element merged or
    selected on the critical path of a sparse collective (0: not modelled). ``tcp``: the
    real-TCP terms each round adds (:class:`TcpTerms`; None: the plain alpha-beta model).

    Example::

        net = NetworkModel.from_strings("1GbE")
        net.steps_time_s([(8000, 8000)])      # one round, 8 kB each way
    """

    latency_s: float
    bandwidth_bps: float
    name: str = field(default="", compare=False)
    gamma_s_per_element: float = 0.0
    tcp: TcpTerms | None = None

    def __post_init__(self) -> None:
        for fname in ("latency_s", "bandwidth_bps", "gamma_s_per_element"):
            value = getattr(self, fname)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{fname}={value!r} has type {type(value).__name__}: expected float")
            object.__setattr__(self, fname, float(value))
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"latency_s={self.latency_s!r} is invalid: expected a finite number >= 0")
        if not self.bandwidth_bps > 0:
            raise ValueError(f"bandwidth_bps={self.bandwidth_bps!r} is invalid: expected a number > 0 or math.inf")
        if not (self.gamma_s_per_element >= 0 and math.isfinite(self.gamma_s_per_element)):
            raise ValueError(
                f"gamma_s_per_element={self.gamma_s_per_element!r} is invalid: expected a finite number >= 0"
            )
        if not isinstance(self.name, str):
            raise TypeError(f"name={self.name!r} has type {type(self.name).__name__}: expected str")
        if self.tcp is not None and not isinstance(self.tcp, TcpTerms):
            raise TypeError(f"tcp={self.tcp!r} has type {type(self.tcp).__name__}: expected TcpTerms or None")

    # --- constructors -----------------------------------------------------------------
    @classmethod
    def from_strings(cls, bandwidth: str, latency: str | None = None) -> "NetworkModel":
        """Parse what users type: a rate, a preset or a calibration JSON, plus a latency.

        ``latency`` (if given) overrides the preset's or calibrated latency; a bare rate
        without a latency gets ``latency_s = 0``. Raises ``ValueError`` listing the
        accepted forms for anything else.
        """
        if not isinstance(bandwidth, str):
            raise TypeError(f"bandwidth={bandwidth!r} has type {type(bandwidth).__name__}: expected str")
        if latency is not None and not isinstance(latency, str):
            raise TypeError(f"latency={latency!r} has type {type(latency).__name__}: expected str or None")
        latency_override = parse_latency_s(latency) if latency is not None else None
        text = bandwidth.strip()
        preset = _PRESET_ALIASES.get(text.lower())
        gamma, tcp = 0.0, None
        if preset is not None:
            latency_s, bandwidth_bps, _ = PRESETS[preset]
            name = preset
        elif text.startswith("{") or _is_calibration_path(text):
            model = cls.from_inline(text) if text.startswith("{") else cls.from_json(text)
            latency_s, bandwidth_bps, name = model.latency_s, model.bandwidth_bps, model.name
            gamma, tcp = model.gamma_s_per_element, model.tcp
        else:
            bandwidth_bps = parse_bandwidth_bps(text)
            latency_s = 0.0
            name = "none" if math.isinf(bandwidth_bps) else text
        if latency_override is not None:
            latency_s = latency_override
            name = f"{name}@{latency.strip()}"  # type: ignore[union-attr]
        return cls(latency_s=latency_s, bandwidth_bps=bandwidth_bps, name=name, gamma_s_per_element=gamma,
                   tcp=tcp)

    @classmethod
    def from_alpha_beta(cls, alpha_s: float, beta_s_per_byte: float, name: str = "") -> "NetworkModel":
        """Construct from fitted constants (``beta = 0`` means unthrottled)."""
        if not (beta_s_per_byte >= 0):
            raise ValueError(f"beta_s_per_byte={beta_s_per_byte!r} is invalid: expected a number >= 0")
        bandwidth_bps = math.inf if beta_s_per_byte == 0 else 8.0 / beta_s_per_byte
        return cls(latency_s=alpha_s, bandwidth_bps=bandwidth_bps, name=name)

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> "NetworkModel":
        """Load a calibration JSON (``gtopk-lab calibrate --out``) or a :meth:`to_dict` dump."""
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            raise ValueError(f"bandwidth={str(path)!r} is invalid: no such calibration file; "
                             f"expected {_BANDWIDTH_FORMS}") from None
        except (OSError, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError (a binary file)
            raise ValueError(f"bandwidth={str(path)!r} is invalid: cannot read calibration JSON "
                             f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        if not isinstance(data, dict):
            raise ValueError(f"bandwidth={str(path)!r} is invalid: calibration JSON must hold an object")
        if "model" in data and isinstance(data["model"], dict):
            data = data["model"]
        try:
            model = cls.from_dict(data)
        except (TypeError, ValueError) as exc:  # a field of the wrong type or range
            raise ValueError(f"bandwidth={str(path)!r} is invalid: calibration JSON {exc}") from None
        if not model.name:
            model = cls(model.latency_s, model.bandwidth_bps, f"calibrated:{os.path.basename(str(path))}",
                        model.gamma_s_per_element, model.tcp)
        return model

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NetworkModel":
        """Inverse of :meth:`to_dict`; also accepts ``alpha_s``/``beta_s_per_byte`` keys and
        an optional ``tcp`` dict (:meth:`TcpTerms.to_dict`)."""
        if not isinstance(data, dict):
            raise TypeError(f"data has type {type(data).__name__}: expected dict")
        name = str(data.get("name", ""))
        gamma = float(data.get("gamma_s_per_element", 0.0))
        tcp = None if data.get("tcp") is None else TcpTerms.from_dict(data["tcp"])
        if "latency_s" in data and "bandwidth_bps" in data:
            bw = data["bandwidth_bps"]
            bandwidth_bps = math.inf if bw is None or bw == "inf" else float(bw)
            return cls(float(data["latency_s"]), bandwidth_bps, name, gamma, tcp)
        if "alpha_s" in data and "beta_s_per_byte" in data:
            model = cls.from_alpha_beta(float(data["alpha_s"]), float(data["beta_s_per_byte"]), name)
            return cls(model.latency_s, model.bandwidth_bps, name, gamma, tcp)
        raise ValueError(
            f"network dict keys {sorted(data)} are invalid: expected latency_s and bandwidth_bps "
            "(or alpha_s and beta_s_per_byte)"
        )

    @classmethod
    def from_inline(cls, text: str) -> "NetworkModel":
        """Parse :meth:`to_inline` (a JSON object in a string)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"bandwidth={text[:60]!r} is invalid: inline model is not JSON ({exc.msg}); "
                             f"expected {_BANDWIDTH_FORMS}") from None
        if not isinstance(data, dict):
            raise ValueError(f"bandwidth={text[:60]!r} is invalid: expected {_BANDWIDTH_FORMS}")
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bandwidth={text[:60]!r} is invalid: {exc}") from None

    def to_inline(self) -> str:
        """This model as a one-line JSON string that :meth:`from_strings` parses back.

        The client sends a calibration file's constants this way, so Dask workers need no
        copy of the file and ``config.json`` records the constants themselves.
        """
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict; ``bandwidth_bps`` is ``None`` when unthrottled (JSON has no inf);
        ``tcp`` only when the model carries TCP terms (so plain models' dicts are unchanged)."""
        out: dict[str, Any] = {
            "name": self.name,
            "latency_s": self.latency_s,
            "bandwidth_bps": None if math.isinf(self.bandwidth_bps) else self.bandwidth_bps,
            "alpha_s": self.latency_s,
            "beta_s_per_byte": self.beta_s_per_byte,
            "gamma_s_per_element": self.gamma_s_per_element,
        }
        if self.tcp is not None:
            out["tcp"] = self.tcp.to_dict()
        return out

    def to_strings(self) -> tuple[str, str]:
        """(bandwidth, latency) strings that :meth:`from_strings` parses back to ``== self``.

        (``gamma_s_per_element`` and ``tcp`` have no string form; use :meth:`to_dict` to keep them.)
        """
        return format_bandwidth(self.bandwidth_bps, exact=True), format_latency(self.latency_s, exact=True)

    def __str__(self) -> str:
        label = f"{self.name}: " if self.name else ""
        terms = "" if self.tcp is None else " + TCP terms"
        if self.unthrottled and self.latency_s == 0:
            return f"{label}unthrottled{terms}"
        return f"{label}{format_bandwidth(self.bandwidth_bps)}, {format_latency(self.latency_s)} latency{terms}"

    # --- basic quantities -------------------------------------------------------------
    @property
    def alpha_s(self) -> float:
        """Per-message latency (alias of ``latency_s``)."""
        return self.latency_s

    @property
    def beta_s_per_byte(self) -> float:
        """Seconds per byte, ``8 / bandwidth_bps`` (0 when unthrottled)."""
        return 0.0 if math.isinf(self.bandwidth_bps) else 8.0 / self.bandwidth_bps

    @property
    def unthrottled(self) -> bool:
        """True when the bandwidth is infinite."""
        return math.isinf(self.bandwidth_bps)

    def message_time_s(self, nbytes: float) -> float:
        """One point-to-point message: ``alpha + beta * nbytes`` (+ the TCP terms of a one-way round)."""
        return self.round_time_s(nbytes, 0)

    def round_time_s(self, sent: float, recv: float) -> float:
        """One round in which this rank sends ``sent`` and receives ``recv`` bytes:
        ``alpha + beta * max(sent, recv)``, plus ``tcp.extra_round_s`` when the model has TCP terms."""
        t = self.latency_s + self.beta_s_per_byte * float(max(sent, recv))
        if self.tcp is not None:
            t += self.tcp.extra_round_s(self, sent, recv)
        return t

    def ab_steps_time_s(self, steps: Sequence[tuple[int, int]]) -> float:
        """The plain alpha-beta time of one rank's rounds, ``sum(alpha + beta * max(sent, recv))``
        (no TCP terms). O(rounds)."""
        alpha, beta = self.latency_s, self.beta_s_per_byte
        total = 0.0
        for step in steps:
            sent, recv = step
            total += alpha + beta * max(sent, recv)
        return total

    def steps_time_s(self, steps: Sequence[tuple[int, int]]) -> float:
        """Time of one rank's rounds: ``sum(alpha + beta * max(sent, recv))``, plus the TCP
        terms of every round when the model has them (``tcp``; one sender per round).

        ``steps`` is ``CommStats.steps``: per round, (bytes sent, bytes received) by
        this rank. Full-duplex link, so a round costs the larger direction. O(rounds).
        The virtual clock and the pacer charge this.
        """
        total = self.ab_steps_time_s(steps)
        if self.tcp is not None:
            total = self.tcp.steps_time_s(self, steps)
        return total


def portable_bandwidth(bandwidth: str) -> str:
    """``bandwidth`` as every machine of a cluster can read it.

    A calibration-file path becomes its model inline (:meth:`NetworkModel.to_inline`),
    read here on the client; rates, presets and inline models come back unchanged.
    Raises ``ValueError`` for a path that cannot be read.
    """
    text = bandwidth.strip() if isinstance(bandwidth, str) else bandwidth
    if (isinstance(text, str) and not text.startswith("{") and text.lower() not in _PRESET_ALIASES
            and _is_calibration_path(text)):
        return NetworkModel.from_json(text).to_inline()
    return bandwidth


def network_model(bandwidth: str, latency: str | None = None) -> NetworkModel:
    """:meth:`NetworkModel.from_strings`, parsed once per process for each input.

    ``RunConfig`` validation, the training loops (``training.replica.network_of``), the
    metric rows and the provenance record all ask for the run's link model; they share
    this cache instead of parsing the same string each time. A calibration file is keyed
    by its modification time and size too, so recalibrating into the same path (a
    notebook session) is read again. Errors are not cached: they raise every time.
    """
    if not isinstance(bandwidth, str) or (latency is not None and not isinstance(latency, str)):
        return NetworkModel.from_strings(bandwidth, latency)  # its TypeError names the field
    return _cached_network(bandwidth, latency, _file_stamp(bandwidth))


def _file_stamp(bandwidth: str) -> tuple[int, int] | None:
    """(mtime_ns, size) of the calibration file ``bandwidth`` names; None for anything else."""
    text = bandwidth.strip()
    if text.startswith("{") or text.lower() in _PRESET_ALIASES or not _is_calibration_path(text):
        return None
    try:
        st = os.stat(text)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=64)
def _cached_network(bandwidth: str, latency: str | None, stamp: tuple[int, int] | None) -> NetworkModel:
    # NetworkModel is frozen, so every caller can share one instance.
    return NetworkModel.from_strings(bandwidth, latency)


def _is_calibration_path(text: str) -> bool:
    """A ``bandwidth`` string naming a calibration JSON (checked after presets and inline)."""
    return text.lower().endswith(".json") or (bool(text) and os.path.isfile(text))


def bandwidth_label(bandwidth: str) -> str:
    """Short label of a ``bandwidth`` string for tables: an inline model shows its name."""
    if isinstance(bandwidth, str) and bandwidth.strip().startswith("{"):
        try:
            model = NetworkModel.from_inline(bandwidth.strip())
        except ValueError:
            return bandwidth
        return model.name or str(model)
    return bandwidth


def link_text(bandwidth: str, latency: str | None = None) -> str:
    """The link a run is charged, in one line as summaries print it: ``1GbE: 888.9 Mbit/s,
    436 us latency`` (``str`` of its :func:`network_model`); a bandwidth that does not parse
    comes back as typed."""
    try:
        return str(network_model(bandwidth, latency))
    except (TypeError, ValueError):
        return f"{bandwidth}" + (f", {latency}" if latency else "")
