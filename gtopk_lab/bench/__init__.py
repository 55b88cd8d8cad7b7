"""Benchmark implementations behind ``benchmarks/*.py`` and ``gtopk-lab bench``.

:mod:`.collectives` is the command line (``add_arguments``, ``run``, ``main``; the CLI
plug-in in :mod:`gtopk_lab.cli.bench` and ``benchmarks/collectives.py`` call it). The
work lives in :mod:`.collective_calls` (timed gloo calls), :mod:`.profile` (where a
gTop-k call's time goes), :mod:`.selection`, :mod:`.stalls` (host exchange-stall probe),
:mod:`.tables` (printing) and :mod:`.timing` (common start, host cores).
"""
