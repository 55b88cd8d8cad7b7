"""Named training recipes and the ``paper`` preset: plain data below :mod:`gtopk_lab.config`.

Recipes reproduce the reference configurations (Shi et al. 2019 and its code,
hclhkbu/gtopkssgd; docs/background):

==================  =========================================================================
``resnet20-cifar10``  lr 0.1, batch 32/worker, momentum 0.9, wd 1e-4, 141 epochs, rho 0.001,
                      LR warm-up 10 epochs (the reference's ``_adjust_learning_rate_general``)
``vgg16-cifar10``     same recipe as ResNet-20
``lstm-ptb``          lr 1.0, batch 20, momentum 0, rho 0.001, the aggregated update clipped at
                      L2 norm 0.25 (``clip_grad_norm_`` after ``synchronize()`` in the
                      reference), no LR warm-up (its PTB schedule has none)
``cnn-mnist1d``       MNIST-1D 4000/1000, CNN, lr 0.05, batch 32, 120 epochs, rho 0.001,
                      LR warm-up 1 epoch (the project's: the references have no MNIST-1D)
==================  =========================================================================

The CIFAR and PTB recipes use the density warm-up of the seed paper's code (density 0.004 in
epoch 0, then rho: its ``_dynamic_densities = [0.004, density]``); ``cnn-mnist1d`` starts
denser (0.05 for 10 epochs), which closes gTop-k's gap to dense on MNIST-1D at 40 epochs. The CIFAR milestones (81, 122) are the
reference's first two LR steps (its third, 155, lies past 141 epochs).

The ``paper`` preset (:data:`PRESETS`) is the seed paper's gTop-k (Shi et al., ICDCS 2019):
the tree pattern (reduce to rank 0 + broadcast), the reference code's residual rule, its
density warm-up, and the recipe of the run's model when one exists (:data:`MODEL_RECIPES`).
:func:`preset_values` resolves it; :class:`~gtopk_lab.config.RunConfig` applies it to every
field the caller did not give. A method may add collective options of its own under a preset
(``Method.preset_options``: Ok-Topk's reference warm-up under ``paper``, 512 iterations, 128
for language models); :func:`with_preset_options` merges them under the run's
``extra["collective_options"]``, whose entries win, and :func:`without_preset_options`
takes them out again when the config is derived anew.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RECIPES", "MODEL_RECIPES", "PRESETS", "preset_values", "with_preset_options",
           "without_preset_options", "method_field_values"]

RECIPES: dict[str, dict[str, Any]] = {
    "resnet20-cifar10": dict(
        model="resnet20", dataset="cifar10", train_samples=50_000, test_samples=10_000,
        epochs=141, batch_size=32, lr=0.1, momentum=0.9, weight_decay=1e-4,
        lr_warmup_epochs=10.0, lr_milestones=(81, 122), lr_decay=0.1,
        density=0.001, density_warmup=(0.004, 1),
    ),
    "vgg16-cifar10": dict(
        model="vgg16", dataset="cifar10", train_samples=50_000, test_samples=10_000,
        epochs=141, batch_size=32, lr=0.1, momentum=0.9, weight_decay=1e-4,
        lr_warmup_epochs=10.0, lr_milestones=(81, 122), lr_decay=0.1,
        density=0.001, density_warmup=(0.004, 1),
    ),
    "lstm-ptb": dict(
        model="lstm", dataset="ptb", train_samples=1_000_000, test_samples=1_000_000,
        epochs=40, batch_size=20, lr=1.0, momentum=0.0, weight_decay=0.0,
        grad_clip=0.25, grad_clip_mode="aggregated",
        lr_warmup_epochs=0.0, lr_milestones=(20, 30), lr_decay=0.25,
        density=0.001, density_warmup=(0.004, 1),
    ),
    "cnn-mnist1d": dict(
        model="cnn", dataset="mnist1d", train_samples=4000, test_samples=1000,
        # 120 epochs (3,720 iterations at P=4): with 60, gTop-k at rho 0.01 (it applies k
        # entries of the sum per iteration, Top-k up to P*k) had not converged yet
        # (benchmarks/RESULTS.md, Training).
        epochs=120, batch_size=32, lr=0.05, momentum=0.9, weight_decay=0.0,
        lr_warmup_epochs=1.0, lr_milestones=(90,), lr_decay=0.1,
        # a denser start (rho 0.05 for 10 epochs) instead of the CIFAR recipes' 0.004 for one:
        # at rho = 0.01 and 40 epochs it brings gTop-k from 90.4% to 94.0% (dense 94.0%, two
        # seeds), at rho = 0.001 from 29% to 59% (benchmarks/RESULTS.md, "Time to accuracy")
        density=0.001, density_warmup=(0.05, 10),
    ),
}

#: The recipe a preset applies for a model (models without one get the preset's own fields).
MODEL_RECIPES: dict[str, str] = {"resnet20": "resnet20-cifar10", "vgg16": "vgg16-cifar10",
                                 "lstm": "lstm-ptb", "cnn": "cnn-mnist1d"}

#: Preset name -> the fields it sets on top of its model's recipe.
PRESETS: dict[str, dict[str, Any]] = {
    "paper": dict(algorithm="tree", residual_rule="paper", density=0.001, density_warmup=(0.004, 1)),
}

#: Fields that say the same thing: a preset sets none of a group the caller gave one of
#: (a given ``density_schedule`` would otherwise meet the preset's ``density_warmup``).
_EXCLUSIVE: tuple[frozenset[str], ...] = (frozenset({"density_warmup", "density_schedule"}),)


def preset_values(name: str, model: str, given: frozenset[str] | set[str]) -> dict[str, Any]:
    """The fields preset ``name`` sets for ``model`` when the caller gave the fields ``given``.

    1. the recipe of ``model`` (:data:`MODEL_RECIPES`), if any, then the preset's own fields
       on top (so ``paper`` with ``model="lstm"`` is the reference's PTB run with gTop-k's tree)
    2. a field in ``given`` is left out (explicit values win), and so is every field of an
       exclusive group one of whose fields is in ``given``; ``model`` is never set (it chose
       the recipe)

    Unknown ``name`` raises ``ValueError`` naming it and the presets there are. O(fields).
    """
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is invalid: expected one of {', '.join(PRESETS)} or None")
    values = {**RECIPES.get(MODEL_RECIPES.get(model, ""), {}), **PRESETS[name]}
    blocked = set(given) | {"model"}
    for group in _EXCLUSIVE:
        if group & blocked:
            blocked |= group
    return {key: value for key, value in values.items() if key not in blocked}


def with_preset_options(extra: dict[str, Any], options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(extra, applied)``: the run's ``extra`` with a preset's collective ``options`` added.

    1. ``extra["collective_options"]`` (a dict, or absent) keeps every entry it has: an option
       the run gives wins over the preset's;
    2. the preset's other options are added; ``applied`` is what was added ({}: ``extra``
       is returned as it is, the same object).

    ``TypeError`` naming ``extra['collective_options']`` when it is not a dict. O(options).
    """
    given = extra.get("collective_options")
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise TypeError(f"extra['collective_options']={given!r} has type {type(given).__name__}: expected dict")
    applied = {key: value for key, value in options.items() if key not in given}
    if not applied:
        return extra, {}
    return {**extra, "collective_options": {**applied, **given}}, applied


def without_preset_options(extra: dict[str, Any], applied: dict[str, Any]) -> dict[str, Any]:
    """The ``extra`` the caller gave: :func:`with_preset_options`'s ``applied`` options taken
    out again (an entry changed since is kept; an emptied ``collective_options`` is dropped)."""
    options = extra.get("collective_options")
    if not applied or not isinstance(options, dict):
        return extra
    left = {key: value for key, value in options.items() if key not in applied or applied[key] != value}
    out = {key: value for key, value in extra.items() if key != "collective_options"}
    return {**out, "collective_options": left} if left else out


def method_field_values(method: Any, preset: str | None, given: frozenset[str] | set[str],
                        fields: frozenset[str] | set[str]) -> dict[str, Any]:
    """The ``RunConfig`` fields a method sets for a run that gave the fields ``given``.

    1. the method's ``config_defaults`` (EF21's plain step, ``momentum=0``), over whatever a
       preset's recipe set;
    2. under the ``paper`` preset, ``selector`` = the method's ``paper_selector`` (the paper's
       own rule where the method's default selector is the project's: ``gaussiank`` ->
       ``gaussiank-paper``);
    3. a field in ``given`` is left out (explicit values win).

    ``method`` is a registered :class:`~gtopk_lab.methods.base.Method`; a default naming no
    field of ``fields`` raises ``ValueError`` naming it. O(fields).
    """
    values = dict(method.config_defaults)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"config_defaults of method {method.name!r} name unknown RunConfig field(s): "
                         f"{', '.join(unknown)}")
    if preset == "paper" and method.paper_selector is not None:
        values["selector"] = method.paper_selector
    return {key: value for key, value in values.items() if key not in given}
