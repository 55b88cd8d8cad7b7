"""The one results home: where notebooks, the control panel, ``Lab()`` and every CLI command
keep their runs unless told otherwise.

:func:`results_home` decides, in this order:

1. ``$GTOPK_LAB_RESULTS`` when set and not empty (``~`` expanded, made absolute);
2. ``<project root>/results``, the project root being the nearest ancestor of the current
   folder (the folder itself included) holding a ``pyproject.toml`` whose ``[project]
   name`` is ``gtopk-lab`` (compared as PEP 503 normalises names). The notebooks run in
   ``notebooks/`` and the CLI usually in the repository's root: both find the same folder;
3. else ``./results`` of the current folder (absolute).

Cost: one ``stat`` per ancestor, and one small TOML parse per ``pyproject.toml`` found on the
way up (usually one). Standard library only, so every layer may import it.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

__all__ = ["ENV_VAR", "PROJECT_NAME", "RESULTS_DIR", "results_home", "project_root", "RULE"]

#: The environment variable that names the results home.
ENV_VAR = "GTOPK_LAB_RESULTS"
#: The ``[project] name`` of the pyproject.toml that marks the project root.
PROJECT_NAME = "gtopk-lab"
#: The results folder's name under the project root (and the fallback under the current folder).
RESULTS_DIR = "results"
#: The rule in one phrase, for help texts and messages.
RULE = (f"${ENV_VAR}, else {RESULTS_DIR}/ of the gtopk-lab project around the current folder, "
        f"else ./{RESULTS_DIR}")


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _is_project(pyproject: Path) -> bool:
    """Whether ``pyproject`` is gtopk-lab's (an unreadable or foreign one is not)."""
    try:
        with pyproject.open("rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError):
        return False
    project = data.get("project")
    name = project.get("name") if isinstance(project, dict) else None
    return isinstance(name, str) and _normalised(name) == PROJECT_NAME


def project_root(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The nearest ancestor of ``start`` (default: the current folder; itself included)
    holding gtopk-lab's ``pyproject.toml``, or None."""
    here = Path(start if start is not None else os.getcwd()).absolute()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and _is_project(candidate):
            return folder
    return None


def results_home(sub: str | os.PathLike[str] | None = None) -> Path:
    """The results home (steps 1-3 of the module docstring), an absolute path that need
    not exist yet; ``sub`` names a folder inside it (``results_home("demo")``)."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        home = Path(env).expanduser().absolute()
    else:
        root = project_root()
        home = (root if root is not None else Path.cwd().absolute()) / RESULTS_DIR
    return home / sub if sub is not None else home
