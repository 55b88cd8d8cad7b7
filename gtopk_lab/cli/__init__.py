"""The ``gtopk-lab`` command line: :func:`main` and one module per sub-command."""

from gtopk_lab.cli.main import main

__all__ = ["main"]
