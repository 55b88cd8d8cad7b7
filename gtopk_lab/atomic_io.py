"""Atomic file writes and checked reads: a crash never leaves a half-written file under the
final name, and a damaged file is reported in one line naming it.

Used by the results store (client side) and by training checkpoints (worker side), so it
imports nothing beyond the standard library.

1. :func:`atomic_path` / :func:`atomic_write_bytes`: write beside the file, fsync (unless
   ``durable=False``: a heartbeat, worthless after a power loss), ``os.replace``.
2. :func:`read_json_file`: a JSON file that must hold an object (or a list): None when it
   is missing, else its value, or :class:`DamagedFile` saying in one line what is wrong
   (unreadable, empty, truncated, not JSON, the wrong kind of value). It never writes.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["DamagedFile", "atomic_path", "atomic_write_bytes", "read_json_file", "short_reason"]


class DamagedFile(ValueError):
    """A file that exists but cannot be used: ``path`` and a one-line ``reason``."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path, self.reason = Path(path), reason
        super().__init__(f"{self.path}: {reason}")


def short_reason(exc: BaseException, path: Path | None = None) -> str:
    """The first line of ``exc`` (at most 160 characters), naming ``path`` by its file name."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if path is not None:  # the file's name instead of its whole path, before shortening
        text = text.replace(f"'{path}'", path.name).replace(str(path), path.name)
    return text if len(text) <= 160 else text[:157] + "..."


@contextmanager
def atomic_path(path: str | os.PathLike[str], *, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` (os.replace).

    The temporary file is fsynced before the rename (so a power loss cannot leave a
    renamed but empty or truncated file; ``durable=False`` skips that) and removed if the
    body raises. Writers that take a file name (``DataFrame.to_parquet``, ``torch.save``)
    write to the yielded path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        if durable:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically, fsynced before the rename (unless not ``durable``)."""
    with atomic_path(path, durable=durable) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)


def read_json_file(path: str | os.PathLike[str], expect: type = dict) -> Any:
    """The JSON value in ``path`` (of type ``expect``: dict or list); None when the file is
    missing; :class:`DamagedFile` with a one-line reason when it is unreadable, empty,
    not JSON or holds another kind of value."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise DamagedFile(path, f"cannot be read: {exc.strerror or short_reason(exc)}") from exc
    if not data.strip():
        raise DamagedFile(path, f"empty file ({len(data)} bytes)")
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DamagedFile(path, f"not valid JSON ({len(data)} bytes): {short_reason(exc)}") from exc
    if not isinstance(value, expect):
        wanted = "a JSON object" if expect is dict else f"a JSON {expect.__name__}"
        raise DamagedFile(path, f"expected {wanted}, found {type(value).__name__}")
    return value
