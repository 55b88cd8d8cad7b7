"""The notebooks tests/test_notebooks.py does not execute, executed and checked the same way
(its ``notebook_execution_test``); together the two files cover every notebook (checked here)."""

from __future__ import annotations

from test_notebooks import CI_PARAMETERS, HERE, notebook_execution_test

OTHERS: tuple[str, ...] = tuple(name for name in sorted(CI_PARAMETERS) if name not in HERE)


def test_the_two_files_execute_every_notebook_once() -> None:
    assert sorted(HERE + OTHERS) == sorted(CI_PARAMETERS) and not set(HERE) & set(OTHERS)


test_notebook_executes = notebook_execution_test(OTHERS)
