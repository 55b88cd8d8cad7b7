"""Methods: one registry that every consumer reads (docs/extending.md shows how to add one).

``from gtopk_lab.methods import Method, register_method`` and
``register_method(Method(name="my-method", selector="topk", collective="gtopk"))`` adds a
method to the training step, the simulator, the DDP hook, wait-free overlap, the
predictions, the figures, ``RunConfig``, the CLI and the ControlPanel. Modules named in
``$GTOPK_LAB_METHODS`` (or the entry-point group ``gtopk_lab.methods``) are imported on
every process's first read of the registry.
"""

from gtopk_lab.methods.base import Collective, CommCall, Contribution, Method, Selector
from gtopk_lab.methods.builtin import BASELINE_METHOD, program_collective
from gtopk_lab.methods.registry import (
    available_collectives, available_methods, get_collective, get_method, load_plugins, register_collective,
    register_method, unregister_method,
)

__all__ = ["Method", "Collective", "CommCall", "Contribution", "Selector", "register_method", "get_method",
           "available_methods", "unregister_method", "register_collective", "get_collective",
           "available_collectives", "program_collective", "load_plugins", "BASELINE_METHOD"]

# The post-2019 methods, one module each, registered exactly as a plugin would register them
# (imported here, not from builtin.py: they use builtin.program_collective, so that would be a cycle).
from gtopk_lab.methods import cltk, diloco, ef21, sparseloco  # noqa: E402,F401
