"""The one parser of counts as people type them: ``25M`` parameters, ``1M,25M`` elements.

Model sizes (``gtopk-lab model --model-size``), benchmark buffer sizes
(``gtopk-lab bench --numel``, ``--workers``) and the benchmark scripts all read counts
here, so ``1.5K`` means the same everywhere. Multiples are decimal (K = 10^3, M = 10^6,
G = B = 10^9: "B" as in a 7B-parameter model); byte sizes with 1024-based multiples are a
different thing and stay with calibration (:func:`gtopk_lab.network.calibrate.parse_sizes_bytes`).
Standard library only, so any layer may import it.
"""

from __future__ import annotations

import math

__all__ = ["parse_count", "parse_count_list"]

_COUNT_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9}


def parse_count(text: str, field_name: str = "count") -> int:
    """"25M" -> 25_000_000, "1.5k" -> 1500, "138357544" -> 138357544; rounds to an integer.

    Raises ``ValueError`` naming ``field_name`` (a field or a flag) for anything that is
    not a finite count >= 1.
    """
    s = str(text).strip().upper()
    number, suffix = (s[:-1], s[-1]) if s and s[-1] in _COUNT_SUFFIX else (s, "")
    try:
        value = float(number) * _COUNT_SUFFIX[suffix]
    except ValueError:
        raise ValueError(f"{field_name}={text!r} is invalid: expected a count like 25M, 1.5K or 270000") from None
    if not (value >= 1 and math.isfinite(value)):
        raise ValueError(f"{field_name}={text!r} is invalid: expected a count >= 1")
    return int(round(value))


def parse_count_list(text: str, field_name: str = "counts") -> list[int]:
    """"1M,25M" -> [1_000_000, 25_000_000]: comma-separated :func:`parse_count` values.

    Empty entries are skipped; no entry at all, or a bad one, raises ``ValueError``
    naming ``field_name`` and the whole text.
    """
    out: list[int] = []
    for part in str(text).split(","):
        if not part.strip():
            continue
        try:
            out.append(parse_count(part, field_name))
        except ValueError:
            raise ValueError(f"{field_name}={text!r} is invalid: expected comma-separated counts >= 1 "
                             "with optional K/M/G suffix, e.g. 1M,25M") from None
    if not out:
        raise ValueError(f"{field_name}={text!r} is invalid: expected at least one value")
    return out
