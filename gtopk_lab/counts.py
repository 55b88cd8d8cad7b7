"""The one parser of counts and lists as people type them: ``25M`` parameters, ``1M,25M``
elements, ``1, 2 4`` (commas, spaces or both: :func:`split_list`, which the CLI's list flags
and the ControlPanel's list boxes share).

Model sizes (``gtopk-lab model --model-size``), benchmark buffer sizes
(``gtopk-lab bench --numel``, ``--workers``) and the benchmark scripts all read counts
here, so ``1.5K`` means the same everywhere. Multiples are decimal (K = 10^3, M = 10^6,
G = B = 10^9: "B" as in a 7B-parameter model); byte sizes with 1024-based multiples are a
different thing and stay with calibration (:func:`gtopk_lab.network.calibrate.parse_sizes_bytes`).
Standard library only, so any layer may import it.
"""

from __future__ import annotations

import math
import re

__all__ = ["parse_count", "parse_count_list", "split_list"]

_NUMBER_RE = re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$")
_UNIT_RE = re.compile(r"^[^\W\d_]")  # starts with a letter: "ms", "Gbit/s", "µs"


def split_list(text: object) -> list[str]:
    """``"1,2,4"``, ``"1 2 4"``, ``"1, 2;4"`` -> ``["1", "2", "4"]``: the items of a typed list.

    1. split at commas and semicolons, then each part at whitespace;
    2. inside a part, a word that starts with a letter right after a bare number is that
       number's unit: ``"2.5 Gbit/s 10GbE"`` -> ``["2.5 Gbit/s", "10GbE"]``, ``"0.5 ms"``
       stays one item;
    3. empty items are dropped (order and duplicates are kept: the caller decides).

    Cost: linear in the text's length. ``None`` reads as the empty list.
    """
    items: list[str] = []
    for part in re.split(r"[,;]", "" if text is None else str(text)):
        words = part.split()
        for i, word in enumerate(words):
            if i and _UNIT_RE.match(word) and _NUMBER_RE.match(words[i - 1]) and items:
                items[-1] = f"{items[-1]} {word}"
            else:
                items.append(word)
    return items

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
    """"1M,25M" (or "1M 25M") -> [1_000_000, 25_000_000]: :func:`parse_count` values of
    :func:`split_list`'s items.

    Empty entries are skipped; no entry at all, or a bad one, raises ``ValueError``
    naming ``field_name`` and the whole text.
    """
    out: list[int] = []
    for part in split_list(text):
        try:
            out.append(parse_count(part, field_name))
        except ValueError:
            raise ValueError(f"{field_name}={text!r} is invalid: expected counts >= 1 (commas or spaces) "
                             "with optional K/M/G suffix, e.g. 1M,25M") from None
    if not out:
        raise ValueError(f"{field_name}={text!r} is invalid: expected at least one value")
    return out
