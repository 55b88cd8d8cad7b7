"""``python -m gtopk_lab``: the ``gtopk-lab`` command line (:func:`gtopk_lab.cli.main`)."""

import sys

from gtopk_lab.cli.main import main

# Dask's worker processes are spawned and import the main module again (as __mp_main__):
# the guard keeps them from running the command a second time.
if __name__ == "__main__":
    sys.exit(main())
