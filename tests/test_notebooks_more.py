"""The notebooks tests/test_notebooks.py does not execute, executed and checked the same way
(its ``execute_and_check``); together the two files cover every notebook (checked here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_notebooks import CI_PARAMETERS, HERE, execute_and_check

OTHERS: tuple[str, ...] = tuple(name for name in sorted(CI_PARAMETERS) if name not in HERE)


def test_the_two_files_execute_every_notebook_once() -> None:
    assert sorted(HERE + OTHERS) == sorted(CI_PARAMETERS) and not set(HERE) & set(OTHERS)


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", OTHERS)
def test_notebook_executes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    execute_and_check(name, tmp_path, monkeypatch)
