#!/usr/bin/env python
"""Collectives and selection benchmark; see gtopk_lab/bench/collectives.py.

    python benchmarks/collectives.py                        # everything (slow on 2 cores)
    python benchmarks/collectives.py collectives --workers 2,4 --numel 1M --repeats 3
    python benchmarks/collectives.py selection --numel 25M --repeats 5
    python benchmarks/collectives.py collectives --bandwidth 1Gbps --latency 0.5ms
"""

from __future__ import annotations

import sys

from gtopk_lab.bench.collectives import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
