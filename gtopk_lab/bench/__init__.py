"""Benchmark implementations behind ``benchmarks/*.py`` and ``gtopk-lab bench``.

Each module has ``main(argv) -> int``; :mod:`.collectives` also exposes ``add_arguments`` and
``run`` for the CLI plug-in in :mod:`gtopk_lab.cli.bench`.
"""
