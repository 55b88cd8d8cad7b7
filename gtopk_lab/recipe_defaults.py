"""Model recipes as defaults: the recipe of a run's model fills the training fields it was not given.

A :class:`~gtopk_lab.config.RunConfig` has ``recipe="auto"`` by default: the recipe of its
model on its dataset (:data:`~gtopk_lab.config_presets.RECIPES`, ``cnn-mnist1d`` for the CNN on
MNIST-1D) supplies every field of :data:`RECIPE_FIELDS` the caller did not give, as per-model
reference recipes do (torchvision's and timm's training references, the seed paper's scripts).
``recipe="<name>"`` asks for one recipe by name; ``recipe=None`` turns recipes off (the
dataclass defaults). Fields the caller gave always win.

What a recipe supplies, and why not more:

- the optimiser and its schedules (epochs, batch, LR, momentum, weight decay, LR warm-up,
  milestones, decay, clipping) and the data sizes: they make a run train as its reference does;
- the density warm-up, only when it is denser than the run's density (a warm-up that starts
  sparser than the target would be no warm-up), the run gave no ``density_schedule``, it
  trains its epochs (no ``max_iterations``) and the warm-up takes at most half of them: a
  capped run is a throughput point or a quick look, and a run spent mostly inside the warm-up
  would measure another density than the one it records (a study's efficiency at rho = 0.01
  would be that of rho = 0.05; ``cnn-mnist1d``'s 10 warm-up epochs need >= 20 epochs);
- the LR milestones as fractions of the recipe's epochs: a run given ``epochs`` gets them scaled
  to its own (``cnn-mnist1d``'s x0.1 at epoch 90 of 120 is at epoch 30 of 40), as the recipe's
  schedule would be laid out for that budget; a milestone past the run's end would never act;
- never ``method``, ``density``, ``workers``, ``model``, ``dataset`` or the network: those are
  what a run compares, and a default density of the recipe's would change every comparison.

:func:`recipe_values` is the resolution (pure data in, fields out); RunConfig applies it after
a preset (whose own recipe fields it does not touch) and before the method's own defaults
(EF21's plain step wins over a recipe's momentum).
"""

from __future__ import annotations

from typing import Any

from gtopk_lab.config_presets import RECIPES

__all__ = ["AUTO", "RECIPE_FIELDS", "recipe_for", "recipe_values", "check_recipe"]

#: The ``recipe`` value that means "the recipe of the run's model on its dataset, if any".
AUTO = "auto"

#: The fields a recipe may supply (see the module docstring for the ones it never does).
RECIPE_FIELDS: tuple[str, ...] = (
    "train_samples", "test_samples", "epochs", "batch_size", "lr", "momentum", "weight_decay",
    "lr_warmup_epochs", "lr_milestones", "lr_decay", "grad_clip", "grad_clip_mode", "density_warmup",
)


def check_recipe(recipe: Any) -> None:
    """``TypeError``/``ValueError`` naming ``recipe`` unless it is None, ``"auto"`` or a recipe name."""
    if recipe is None:
        return
    if not isinstance(recipe, str):
        raise TypeError(f"recipe={recipe!r} has type {type(recipe).__name__}: expected str or None")
    if recipe != AUTO and recipe not in RECIPES:
        raise ValueError(f"recipe={recipe!r} is invalid: expected {AUTO!r} (the model's), one of "
                         f"{', '.join(RECIPES)}, or None (off)")


def recipe_for(recipe: str | None, model: str, dataset: str) -> str | None:
    """The recipe name a run uses: ``recipe`` itself when named; under ``"auto"`` the recipe
    whose model and dataset are the run's (None when there is none); None when off. O(recipes)."""
    check_recipe(recipe)
    if recipe is None:
        return None
    if recipe != AUTO:
        return recipe
    for name, values in RECIPES.items():
        if values.get("model") == model and values.get("dataset") == dataset:
            return name
    return None


def recipe_values(recipe: str | None, model: str, dataset: str, density: Any,
                  blocked: frozenset[str] | set[str], max_iterations: Any = None,
                  epochs: Any = None) -> tuple[str | None, dict[str, Any]]:
    """``(name, fields)``: the recipe a run uses and the fields it supplies.

    1. ``name`` = :func:`recipe_for` (None: nothing is supplied);
    2. its values of :data:`RECIPE_FIELDS`, less the fields in ``blocked`` (given by the caller,
       or set by a preset);
    3. ``density_warmup`` only when the caller set neither it nor ``density_schedule``, its
       density is above the run's ``density`` (a number; anything else: left out) and
       ``max_iterations`` is None (the run trains its epochs) and ``2 * warm-up epochs <= epochs``;
    4. ``lr_milestones`` scaled by ``epochs / recipe's epochs`` (rounded) when ``epochs`` is in
       ``blocked`` (the caller's budget) and differs from the recipe's.

    ``ValueError``/``TypeError`` naming ``recipe`` when it is not a known value. O(fields).
    """
    name = recipe_for(recipe, model, dataset)
    if name is None:
        return None, {}
    values = {key: value for key, value in RECIPES[name].items()
              if key in RECIPE_FIELDS and key not in blocked}
    warmup = values.get("density_warmup")
    run_epochs = values.get("epochs", epochs)
    if warmup is not None and ("density_schedule" in blocked or max_iterations is not None
                               or not isinstance(run_epochs, int) or 2 * warmup[1] > run_epochs
                               or isinstance(density, bool)
                               or not isinstance(density, (int, float)) or not warmup[0] > density):
        del values["density_warmup"]
    own_epochs = RECIPES[name].get("epochs")
    if ("lr_milestones" in values and "epochs" in blocked and isinstance(epochs, int)
            and not isinstance(epochs, bool) and epochs > 0 and own_epochs and epochs != own_epochs):
        values["lr_milestones"] = tuple(int(round(m * epochs / own_epochs)) for m in values["lr_milestones"])
    return name, values
