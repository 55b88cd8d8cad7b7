"""``python -m gtopk_lab.cli``."""

import sys

from gtopk_lab.cli.main import main

sys.exit(main())
