"""The one registry of collectives and methods, and the plugins that add to it.

Every consumer (the training step, the simulator, the DDP hook, wait-free overlap, the
network predictions, the figures' byte formulas, ``RunConfig`` validation, the CLI and the
ControlPanel) reads methods from here and nothing else. That includes how a method is shown:
its display order, family, colour and kind (sparse or dense) are fields of its entry, filled
in here when the method leaves them unset (:func:`register_method`), and read through
:func:`display_order`, :func:`display_color`, :func:`family_of`, :func:`is_dense` and
:func:`patterns_of`, which also answer for a name no longer registered (a stored run of a
plugin that is not loaded), so no consumer keeps a list of method names.

Plugins: the modules named in the environment variable ``GTOPK_LAB_METHODS``
(comma-separated) and those of the entry-point group ``gtopk_lab.methods`` are imported on
the first read of the registry in each process (client, Dask worker, torchrun rank,
simulator), so a module that calls :func:`register_method` at import time adds its methods
everywhere. A plugin that fails to import raises ``ValueError`` naming the module.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import zlib
from collections.abc import Iterable

from gtopk_lab.compression.selection import available_selectors, get_selector, selects_exactly_k
from gtopk_lab.methods.base import Collective, Method

__all__ = ["register_collective", "get_collective", "available_collectives", "register_method", "selector_for",
           "get_method", "available_methods", "unregister_method", "load_plugins", "plugin_modules",
           "PLUGINS_ENV", "ENTRY_POINT_GROUP", "display_order", "display_color", "family_of", "is_dense",
           "patterns_of", "FALLBACK_COLORS"]

logger = logging.getLogger(__name__)

PLUGINS_ENV = "GTOPK_LAB_METHODS"
ENTRY_POINT_GROUP = "gtopk_lab.methods"

_COLLECTIVES: dict[str, Collective] = {}
_ALIASES: dict[str, str] = {}
_METHODS: dict[str, Method] = {}
_loaded_plugins: set[str] = set()
_loading = False
#: entry points are read from the installed distributions once per process (a scan of every
#: package's metadata: too slow for each registry read, which hooks and configs do often)
_entry_points_done = False
#: the display order the next method without one gets (never reused, so a plugin registered
#: after an unregister still sorts after the built-ins)
_next_order = 0
#: colours of methods that are neither given one nor a variant of a family with one: a
#: fixed cycle (none of the built-ins' colours), by registration, the same in every process
FALLBACK_COLORS: tuple[str, ...] = ("#1F77B4", "#FF7F0E", "#2CA02C", "#D62728", "#9467BD", "#E377C2",
                                    "#7F7F7F", "#BCBD22", "#17BECF", "#FF97FF")


# =========================================================================== collectives
def register_collective(collective: Collective, *, replace: bool = False) -> Collective:
    """Add ``collective`` (and its aliases) to the registry; returns it."""
    if not isinstance(collective, Collective):
        raise TypeError(f"collective has type {type(collective).__name__}: expected Collective")
    for name in (collective.name, *collective.aliases):
        owner = _ALIASES.get(name)
        if owner is not None and owner != collective.name and not replace:
            raise ValueError(f"collective name={name!r} is invalid: already registered for {owner!r}")
    if collective.name in _COLLECTIVES and not replace:
        raise ValueError(f"collective name={collective.name!r} is invalid: already registered "
                         "(pass replace=True to redefine it)")
    _COLLECTIVES[collective.name] = collective
    for name in (collective.name, *collective.aliases):
        _ALIASES[name] = collective.name
    return collective


def available_collectives() -> tuple[str, ...]:
    """Registered collective names (aliases not repeated)."""
    return tuple(_COLLECTIVES)


def get_collective(name: str | Collective) -> Collective:
    """The collective registered as ``name`` (or one of its aliases)."""
    if isinstance(name, Collective):
        return name
    key = _ALIASES.get(name) if isinstance(name, str) else None
    if key is None:
        names = sorted(_ALIASES)
        raise ValueError(f"collective={name!r} is invalid: expected one of {', '.join(names)} or a Collective")
    return _COLLECTIVES[key]


# =========================================================================== methods
def _resolve(method: Method) -> Method:
    """Check that the parts of ``method`` work together; returns it with them resolved."""
    collective = get_collective(method.collective)
    selector = method.selector
    if collective.input == "dense":
        if selector is not None:
            raise ValueError(f"selector={_label(selector)!r} is invalid with collective {collective.name!r}: "
                             "it aggregates the whole buffer; expected selector=None")
        select, exact_k = None, False
    else:
        if selector is None:
            raise ValueError(f"selector=None is invalid with collective {collective.name!r}: it aggregates "
                             f"(values, indices) selections; expected one of {', '.join(available_selectors())} "
                             "or a callable (x, k) -> (values, indices)")
        if isinstance(selector, str):
            select, exact_k = get_selector(selector), selects_exactly_k(selector)
        else:
            select, exact_k = selector, bool(getattr(selector, "exact_k", False))
        if collective.needs_exact_k and not exact_k:
            raise ValueError(f"selector={_label(selector)!r} is invalid with collective {collective.name!r}: "
                             "the collective needs exactly k pairs per rank and this selector does not "
                             "promise that (register it with exact_k=True)")
    if method.requires_lossless and not collective.lossless:
        raise ValueError(f"collective={collective.name!r} is invalid for method {method.name!r}: it drops "
                         "entries while merging and the method needs the exact sum (requires_lossless)")
    if method.algorithm is not None:
        collective.algorithm_for(method.algorithm)
    if method.paper_selector is not None:
        if collective.input == "dense" or method.paper_selector not in available_selectors():
            raise ValueError(f"paper_selector={method.paper_selector!r} is invalid for method {method.name!r}: "
                             f"expected one of {', '.join(available_selectors())} on a sparse collective")
        selector_for(method.with_parts(collective=collective), method.paper_selector)
    return method.with_parts(collective=collective, selector=select, exact_k=exact_k)


def selector_for(method: Method, selector: str | None = None) -> tuple[object, bool]:
    """``(select, exact_k)`` of ``method`` with an optional registered ``selector`` name in
    place of its own (``RunConfig.selector``); ``ValueError`` naming the selector when its
    collective needs exactly k and the override does not promise it. Dense-input methods
    ignore the override (nothing is selected); a leader's collective (CLT-k) takes it for its
    leader's selection."""
    if not method.selects or selector is None:
        return method.select, method.exact_k
    select, exact_k = get_selector(selector), selects_exactly_k(selector)
    if method.comm.needs_exact_k and not exact_k:
        raise ValueError(f"selector={selector!r} is invalid with method {method.name!r}: its collective "
                         "needs exactly k pairs per rank and this selector does not promise that")
    return select, exact_k


def _label(selector: object) -> str:
    return selector if isinstance(selector, str) else getattr(selector, "__name__", repr(selector))


def register_method(method: Method, *, replace: bool = False) -> Method:
    """Add ``method`` to the registry after checking its parts; returns the registered entry.

    Raises ``ValueError`` naming the field when the parts cannot work together (an unknown
    selector or collective, a selector that does not promise exactly k with a collective
    that needs it, a lossy collective for a method that needs the exact sum, ...) and when
    the name is taken (unless ``replace=True``).
    """
    if not isinstance(method, Method):
        raise TypeError(f"method has type {type(method).__name__}: expected Method")
    if not isinstance(replace, bool):
        raise TypeError(f"replace={replace!r} has type {type(replace).__name__}: expected bool")
    if method.name in _METHODS and not replace:
        raise ValueError(f"name={method.name!r} is invalid: a method of that name is already registered "
                         "(pass replace=True to redefine it)")
    entry = _with_display(_resolve(method))
    _METHODS[method.name] = entry
    return entry


def _with_display(method: Method) -> Method:
    """``method`` with its unset display facts filled in (see :class:`Method`):

    1. ``family``: its name;
    2. ``order``: the one it had when re-registered with ``replace=True``, else the next
       unused number (after every method registered so far);
    3. ``kind``: ``"sparse"`` when its collective takes a selection, else ``"dense"``;
    4. ``color``: for the j-th variant of a registered family head with a colour, that colour
       mixed 25% x j towards white (at most 75%); else the next of :data:`FALLBACK_COLORS`.
    O(registered methods)."""
    global _next_order
    family = method.family or method.name
    order = method.order
    previous = _METHODS.get(method.name)
    if order is None:
        if previous is not None and previous.order is not None:
            order = previous.order
        else:
            order = _next_order
    _next_order = max(_next_order, order + 1)
    kind = method.kind or ("sparse" if method.selects else "dense")
    color = method.color
    if not color:
        head = _METHODS.get(family)
        if head is not None and head.name != method.name and head.color:
            variants = sum(1 for m in _METHODS.values() if m.family == family and m.name not in (family, method.name))
            color = _lighter(head.color, min(0.75, 0.25 * (variants + 1)))
        else:
            own = sum(1 for m in _METHODS.values() if m.name != method.name and m.color in FALLBACK_COLORS)
            color = FALLBACK_COLORS[own % len(FALLBACK_COLORS)]
    return dataclasses.replace(method, family=family, order=order, kind=kind, color=color)


def _lighter(color: str, t: float) -> str:
    """``color`` (#rrggbb) mixed by ``t`` in [0, 1] towards white."""
    rgb = (int(color[j:j + 2], 16) for j in (1, 3, 5))
    return "#" + "".join(f"{int(round(c + (255 - c) * t)):02X}" for c in rgb)


# =========================================================================== display facts
def display_order(name: str) -> tuple[float, str]:
    """Sort key of a method in tables and legends: ``(order, name)``; a name not registered
    (a stored run of a plugin not loaded) sorts after every registered one, by name."""
    load_plugins()
    method = _METHODS.get(name) if isinstance(name, str) else None
    if method is None or method.order is None:
        return (float("inf"), str(name))
    return (float(method.order), name)


def display_color(name: str) -> str:
    """The method's colour in every figure; a name not registered gets one of
    :data:`FALLBACK_COLORS` chosen by its text, so it is the same in every figure and process."""
    load_plugins()
    method = _METHODS.get(name) if isinstance(name, str) else None
    if method is not None and method.color:
        return method.color
    return FALLBACK_COLORS[zlib.crc32(str(name).encode("utf-8")) % len(FALLBACK_COLORS)]


def family_of(name: str) -> str:
    """The method's family (its own name when it is the head of one or not registered)."""
    load_plugins()
    method = _METHODS.get(name) if isinstance(name, str) else None
    return method.family if method is not None and method.family else str(name)


def is_dense(name: str) -> bool:
    """True when density does not apply to the method (tables show "-"); False for a name not
    registered (its stored density is shown as it is)."""
    load_plugins()
    method = _METHODS.get(name) if isinstance(name, str) else None
    return method is not None and method.dense


def patterns_of(name: str) -> tuple[str, ...]:
    """The message patterns a run of the method may choose (``()``: its ``algorithm`` field means
    nothing for it, or the name is not registered)."""
    load_plugins()
    method = _METHODS.get(name) if isinstance(name, str) else None
    return method.patterns if method is not None else ()


def unregister_method(name: str) -> None:
    """Remove a method (tests and notebooks that redefine one)."""
    _METHODS.pop(name, None)


def available_methods() -> tuple[str, ...]:
    """Registered method names, built-ins first, plugins loaded."""
    load_plugins()
    return tuple(_METHODS)


def get_method(name: str) -> Method:
    """The method registered as ``name``; unknown names raise ``ValueError`` listing the known."""
    load_plugins()
    if isinstance(name, Method):
        return name
    method = _METHODS.get(name) if isinstance(name, str) else None
    if method is None:
        raise ValueError(f"method={name!r} is invalid: expected one of {', '.join(_METHODS)}")
    return method


# =========================================================================== plugins
def plugin_modules() -> list[str]:
    """Module names from ``$GTOPK_LAB_METHODS`` (comma-separated), in order."""
    return [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]


def _entry_point_modules() -> Iterable[tuple[str, object]]:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        yield ep.value.split(":")[0], ep


def load_plugins() -> None:
    """Import every plugin module not imported yet in this process (see the module docstring)."""
    global _loading, _entry_points_done
    if _loading:  # a plugin reading the registry while it registers
        return
    _loading = True
    try:
        for module in plugin_modules():
            if module not in _loaded_plugins:
                _import_plugin(module, f"{PLUGINS_ENV} names")
        if _entry_points_done:
            return
        _entry_points_done = True
        for module, ep in _entry_point_modules():
            if module not in _loaded_plugins:
                try:
                    ep.load()  # type: ignore[attr-defined]
                except Exception as exc:  # noqa: BLE001 - one line naming the plugin
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    raise ValueError(f"method plugin {module!r} (entry point group {ENTRY_POINT_GROUP}"
                                     f"{_file_of(module)}) failed to import: {type(exc).__name__}: "
                                     f"{first}") from None
                _loaded_plugins.add(module)
    finally:
        _loading = False


def _import_plugin(module: str, where: str) -> None:
    fresh = module not in sys.modules
    before = (len(_METHODS), len(_COLLECTIVES), len(available_selectors()))
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - one line naming the plugin and its file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"method plugin {module!r} ({where} it{_file_of(module)}) failed to import: "
                         f"{type(exc).__name__}: {first}") from None
    _loaded_plugins.add(module)
    if fresh and (len(_METHODS), len(_COLLECTIVES), len(available_selectors())) == before:
        # an empty or cut file, most likely
        logger.warning("method plugin %r (%s it%s) registered no method, collective or selector",
                       module, where, _file_of(module))


def _file_of(module: str) -> str:
    """``", file <path>"`` of an importable module, else "" (a module that is not there)."""
    try:
        origin = getattr(importlib.util.find_spec(module), "origin", None)
    except Exception:  # noqa: BLE001 - a parent package that fails to import
        return ""
    return f", file {origin}" if origin else ""
