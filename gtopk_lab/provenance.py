"""Provenance of a stored run: which code, libraries, machine and network model made it.

:func:`provenance` returns the dict that ``orchestration.results.run_summary`` stores under the
summary's ``provenance`` key. Worker-safe: the standard library only (versions come from
``importlib.metadata``, so torch/Dask are never imported here); the git commit costs one
``git rev-parse HEAD`` per process (cached), and is None outside a git checkout.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

#: Distributions whose installed versions are recorded (None when not installed).
PACKAGES: tuple[str, ...] = ("torch", "dask", "distributed", "numpy", "pandas", "pyarrow")


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """HEAD of the git checkout this package runs from, or None (installed copy, no git)."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():  # a folder, or a file in a worktree
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=2.0, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    if done.returncode != 0 or len(commit) not in (40, 64):
        return None
    return commit


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str | None]:
    """``gtopk_lab`` and Python versions plus those of :data:`PACKAGES`."""
    from gtopk_lab import __version__

    found: dict[str, str | None] = {"gtopk_lab": __version__, "python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def network(bandwidth: str, latency: str | None) -> dict[str, Any]:
    """The network calibration a run used: its strings, the calibration file (when
    ``bandwidth`` names one) and the parsed model's constants (alpha/beta/...)."""
    from gtopk_lab.network.model import _PRESET_ALIASES, _is_calibration_path, network_model

    info: dict[str, Any] = {"bandwidth": bandwidth, "latency": latency, "calibration_file": None,
                            "model": None}
    text = bandwidth.strip() if isinstance(bandwidth, str) else ""
    if text and not text.startswith("{") and text.lower() not in _PRESET_ALIASES \
            and _is_calibration_path(text):
        info["calibration_file"] = os.path.abspath(text)
    try:
        info["model"] = network_model(bandwidth, latency).to_dict()
    except (TypeError, ValueError) as exc:  # an unreadable file: say so, do not fail the run
        info["error"] = str(exc)
    return info


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU a figure belongs to: its model name, with its family and model numbers where the
    name carries no model number (a VM's "AMD EPYC" was a family 25 model 17 one day and a
    family 26 model 2 the next: selection ratios and simulator costs differ by 1.5x between
    them), and "AVX-512" when it has AVX-512F (memory-bound kernels differ by both). Linux:
    /proc/cpuinfo; elsewhere ``platform.processor()``."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return platform.processor() or platform.machine() or "unknown CPU"
    first = text.split("\n\n", 1)[0]  # one processor's block: they are alike
    fields = {key.strip(): value.strip() for key, value in
              (line.split(":", 1) for line in first.splitlines() if ":" in line)}
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    if not any(ch.isdigit() for ch in name) and "cpu family" in fields and "model" in fields:
        name = f"{name} (family {fields['cpu family']} model {fields['model']})"
    flags = fields.get("flags", "").split()
    return f"{name}, {'AVX-512' if 'avx512f' in flags else 'no AVX-512'}" if flags else name


def short_commit() -> str:
    """The first 7 digits of :func:`git_commit`, or "unknown" (what a benchmark prints)."""
    return (git_commit() or "unknown")[:7]


def provenance(config: Any, device: str | None = None) -> dict[str, Any]:
    """Code version, git commit, library versions, host, device and network of a run.

    ``config`` is a ``RunConfig`` (or anything with its ``bandwidth``, ``latency`` and
    ``device``); ``device`` is the resolved device where the caller knows it (else the
    configured one, e.g. ``auto``). ``host`` is the machine that writes the summary (the
    client of a Dask run; its ranks' workers are in the summary's ``dask_workers``).
    """
    found = versions()
    return {
        "gtopk_lab_version": found["gtopk_lab"],
        "git_commit": git_commit(),
        "versions": dict(found),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "device": device or getattr(config, "device", None),
        "network": network(getattr(config, "bandwidth", ""), getattr(config, "latency", None)),
    }
