"""Methods: one registry that every consumer reads (docs/extending.md shows how to add one).

``from gtopk_lab.methods import Method, register_method`` and
``register_method(Method(name="my-method", selector="topk", collective="gtopk"))`` adds a
method to the training step, the simulator, the DDP hook, wait-free overlap, the
predictions, the figures, ``RunConfig``, the CLI and the ControlPanel. Modules named in
``$GTOPK_LAB_METHODS`` (or the entry-point group ``gtopk_lab.methods``) are imported on
every process's first read of the registry.

This package only registers: each family of built-in methods is one module that registers
its collectives and methods exactly as a plugin would (in this order, the registry's):
:mod:`~gtopk_lab.methods.dense` (S-SGD), :mod:`~gtopk_lab.methods.sparse` (Top-k, gTop-k,
GaussianK), :mod:`~gtopk_lab.methods.oktopk` (Ok-Topk), :mod:`~gtopk_lab.methods.powersgd`,
:mod:`~gtopk_lab.methods.cltk`, :mod:`~gtopk_lab.methods.diloco`,
:mod:`~gtopk_lab.methods.ef21`, :mod:`~gtopk_lab.methods.sparseloco`.
"""

from gtopk_lab.methods import dense, sparse, oktopk, powersgd, cltk, diloco, ef21, sparseloco  # noqa: F401,I001
from gtopk_lab.methods.base import Collective, CommCall, Contribution, Method, Selector
from gtopk_lab.methods.dense import BASELINE_METHOD
from gtopk_lab.methods.programs import program_collective
from gtopk_lab.methods.registry import (
    available_collectives, available_methods, display_color, display_order, family_of, get_collective, get_method,
    is_dense, load_plugins, patterns_of, register_collective, register_method, unregister_method,
)

__all__ = ["Method", "Collective", "CommCall", "Contribution", "Selector", "register_method", "get_method",
           "available_methods", "unregister_method", "register_collective", "get_collective",
           "available_collectives", "program_collective", "load_plugins", "BASELINE_METHOD", "display_order",
           "display_color", "family_of", "is_dense", "patterns_of"]
