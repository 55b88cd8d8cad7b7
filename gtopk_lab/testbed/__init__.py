"""A multi-host testbed on one machine: network namespaces as hosts on one shaped switch,
with a real ``dask scheduler`` / ``dask worker`` deployment (client side, root only).

- :mod:`gtopk_lab.testbed.links`: namespaces, bridge, veth pairs, tbf/htb shaping, link
  up/down, removal (also of a stale testbed);
- :mod:`gtopk_lab.testbed.testbed`: :class:`Testbed`, the context manager that adds the
  Dask processes and runs commands inside hosts; ``gtopk-lab testbed`` drives it.
"""

from gtopk_lab.testbed.links import TestbedError, parse_rate_bps, testbed_names, testbed_problem
from gtopk_lab.testbed.testbed import SCHEDULER_PORT, Testbed, change_host, remove_testbed, testbed_status

__all__ = ["SCHEDULER_PORT", "Testbed", "TestbedError", "change_host", "parse_rate_bps", "remove_testbed",
           "testbed_names", "testbed_problem", "testbed_status"]
