"""Command-line flags built from :class:`~gtopk_lab.config.RunConfig`: one builder for every entry.

``gtopk-lab run`` and ``sweep`` (client side) and ``python -m gtopk_lab.training.torchrun``
(worker side) both call :func:`add_config_flags`, so a field has one flag, one syntax and
one help text wherever it is typed: ``--max-iterations 20``, ``--throttle/--no-throttle``,
``--lr-milestones 80,120`` (``80 120`` also parses), ``--density-warmup 0.004,1``
(``0.004 1`` too), ``--density-schedule 0.015625,0.004``, ``--preset paper``, ``--selector
none``, ``--compute-charge compute_time_s=0.01`` (an option group's fields, repeatable),
``--method-options sync_every=4``, ``--extra key=json`` (the legacy keys, repeatable). A value that does not parse ends in argparse's
usage error (exit 2, one line naming the flag); a value that
parses but :class:`RunConfig` rejects raises its ``ValueError`` when the config is built.

The module sits beside ``config.py``, below ``training``: the worker-side torchrun entry
may import it, and it imports nothing client-side (see the import-linter layers in
``pyproject.toml``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import typing
from collections.abc import Callable, Sequence
from typing import Any

from gtopk_lab.config import RunConfig
from gtopk_lab.counts import split_list
from gtopk_lab.methods import available_methods

__all__ = ["FIELD_HELP", "FLAG_FIELDS", "add_config_flags", "config_kwargs", "flag_of", "flag_spec"]

#: One line of help per RunConfig field (the flag adds its default). A test checks that
#: every field has one, so a new field cannot become an undocumented flag.
FIELD_HELP: dict[str, str] = {
    "method": "registered method ('gtopk-lab methods' lists them)",
    "algorithm": "gTop-k pattern: butterfly (recursive doubling) or tree (reduce + broadcast)",
    "selector": "top-k selector from the selector registry; none = the method's own",
    "residual_rule": "error-feedback rule: mass (mass-conserving) or paper (the reference code's)",
    "density": "fraction rho of the parameters each worker selects, in (0, 1]; k = max(1, floor(rho d))",
    "density_warmup": "RHO,EPOCHS: density RHO for the first EPOCHS epochs, e.g. 0.004,1 (none: off)",
    "density_schedule": "comma-separated density per epoch before --density, e.g. 0.015625,0.004 (none: off)",
    "workers": "ranks P",
    "model": "model name ('gtopk-lab models' lists them)",
    "dataset": "dataset name",
    "data_dir": "local folder of a dataset that is not generated (cifar10, mnist, ptb, imagenet)",
    "train_samples": "training samples used (generated datasets)",
    "test_samples": "test samples used (generated datasets)",
    "data_split": "iid (equal random shards) or dirichlet (non-IID label skew, see dirichlet_alpha)",
    "dirichlet_alpha": "Dirichlet concentration per class for data_split=dirichlet (> 0; small = skewed)",
    "epochs": "epochs to train",
    "max_iterations": "stop after this many iterations in total (none: all epochs)",
    "batch_size": "samples per worker and iteration",
    "lr": "learning rate",
    "momentum": "SGD momentum",
    "weight_decay": "L2 weight decay",
    "lr_warmup_epochs": "linear LR warm-up from lr/P to lr over this many epochs (0: off)",
    "lr_milestones": "comma-separated epochs at which the LR is multiplied by lr_decay, e.g. 80,120",
    "lr_decay": "LR factor at each milestone",
    "grad_clip": "L2-norm clip threshold (none: off); where it acts: --grad-clip-mode",
    "grad_clip_mode": "aggregated (clip the synchronised update G/P, as the references) or local "
                      "(each rank's gradient before compression at grad_clip/sqrt(P), as DGC)",
    "momentum_correction": "DGC momentum correction: a local velocity replaces the gradient (sparse methods)",
    "seed": "random seed (initial weights, data order, per-rank generators)",
    "preset": "named configuration: paper = the seed paper's gTop-k (tree, paper residual rule, its "
              "warm-ups and the model's recipe); flags given win (none: off)",
    "recipe": "training recipe for the fields not given: auto = the model's on its dataset (cnn on mnist1d: "
              "cnn-mnist1d), a recipe name (the torchrun entry takes its model, dataset and density too), "
              "or none (off)",
    "bandwidth": "link rate, preset or calibration JSON (1GbE, 1Gbps, 10GbE, net.json; none: no "
                 "communication cost)",
    "latency": "per-message latency, e.g. 0.5ms or 50us (none: the preset's or calibrated value)",
    "throttle": "sleep so that every collective lasts at least its modelled time",
    "virtual_merge_cpu": "virtual time charges the merges' CPU time inside sparse collectives",
    "device": "auto, cpu or cuda",
    "eval_every_epochs": "evaluate on the test split every this many epochs (and at the end)",
    "sink_every": "flush metric rows every this many iterations",
    "checkpoint": "write epoch checkpoints (a failed run can then be resumed)",
    "max_restarts": "Dask runs: restarts (from the newest checkpoint) when a rank's worker leaves or dies",
    "scheduler_timeout_s": "Dask runs: seconds a rank trains on while its worker has no scheduler connection",
    "run_id": "name of the run's results folder (none: a fresh id)",
    "simulator": "KEY=JSON simulator option (rows=all|rank0, compute=median|max|straggler, "
                 "batched=auto|on|off), repeatable",
    "compute_charge": "KEY=JSON fixed compute charge (compute_time_s, selection_time_s, merge_gamma_s_per_element), "
               "repeatable",
    "optimiser": "KEY=JSON optimiser option (name=sgd|adamw, betas=[0.9,0.95], eps), repeatable",
    "model_options": "KEY=JSON model/data option (kwargs={...}, tokenizer=byte|char, validation_fraction), "
                     "repeatable",
    "output": "KEY=JSON output option (return_weights=true, warmup_iterations=N), repeatable",
    "collective_options": "KEY=JSON keyword of the collective's state (Ok-Topk: warmup, tau, tau_r), repeatable",
    "method_options": "KEY=JSON option the method declares (sync_every, ef_decay, powersgd_rank, ...), repeatable",
    "custom": "KEY=JSON setting of a custom training function, repeatable",
    "extra": "KEY=JSON legacy option key (sim_rows, compute_time_s, optimizer, sync_every, ...), repeatable; "
             "an unknown key is refused",
}
#: Every RunConfig keyword that has a flag: the fields, then the legacy ``extra`` dict.
FLAG_FIELDS: tuple[str, ...] = (*(f.name for f in dataclasses.fields(RunConfig)), "extra")

_NONE_WORDS = ("none", "null", "")


def flag_of(name: str) -> str:
    """The flag of the RunConfig field ``name``: ``max_iterations`` -> ``--max-iterations``."""
    return "--" + name.replace("_", "-")


def _none_or(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` that also reads ``none``/``null``/empty as None (Optional fields)."""

    def convert(text: str) -> Any:
        return None if text.strip().lower() in _NONE_WORDS else parse(text)

    # argparse names the converter in its message ("invalid int value: 'x'")
    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _int_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in split_list(text))


def _float_tuple(text: str) -> tuple[float, ...] | None:
    if text.strip().lower() in _NONE_WORDS:
        return None
    return tuple(float(t) for t in split_list(text))


def _density_warmup(text: str) -> tuple[float, int] | None:
    if text.strip().lower() in _NONE_WORDS:
        return None
    parts = split_list(text)
    if len(parts) != 2:
        raise ValueError(text)
    return float(parts[0]), int(parts[1])


class _Joined(argparse.Action):
    """A list-valued field: its tokens joined by commas, then parsed as one value.

    So ``--lr-milestones 80,120`` and ``--lr-milestones 80 120`` (the torchrun entry's
    older form) give the same tuple; a bad token is argparse's usage error naming the flag.
    """

    def __init__(self, *args: Any, convert: Callable[[str], Any], expected: str, **kwargs: Any) -> None:
        self.convert, self.expected = convert, expected
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        text = ",".join(values)
        try:
            setattr(namespace, self.dest, self.convert(text))
        except ValueError:
            raise argparse.ArgumentError(self, f"invalid value {' '.join(values)!r}: expected {self.expected}") \
                from None


class _ExtraItem(argparse.Action):
    """``--extra KEY=VALUE``, repeatable, into one dict; VALUE is JSON when it parses."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        key, sep, value = str(values).partition("=")
        if not sep or not key:
            raise argparse.ArgumentError(self, f"invalid value {values!r}: expected KEY=VALUE")
        extra = dict(getattr(namespace, self.dest, None) or {})
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            extra[key] = value
        setattr(namespace, self.dest, extra)


@functools.lru_cache(maxsize=1)
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(RunConfig)


def flag_spec(name: str) -> dict[str, Any]:
    """The ``add_argument`` keywords of the RunConfig field ``name`` (flag name aside).

    Derived from the field's annotation: ``bool`` -> ``--x/--no-x``; ``X | None`` ->
    X or ``none``; ``tuple`` -> comma-separated; ``dict`` -> repeatable ``KEY=JSON``.
    Defaults are suppressed, so a flag that is not given leaves the field to RunConfig
    (or to a recipe).
    """
    if name == "extra":  # not a field: the legacy dict RunConfig maps onto its options
        return {"dest": name, "default": argparse.SUPPRESS, "action": _ExtraItem, "metavar": "KEY=JSON",
                "help": FIELD_HELP[name]}
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    f = fields[name]
    hint = _hints()[name]
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if optional else hint
    origin = typing.get_origin(base)
    default = f.default if f.default is not dataclasses.MISSING else None
    text = FIELD_HELP[name]
    if name == "method":
        text = f"one of {', '.join(available_methods())}; {text}"
    spec: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
    if base is bool:
        return spec | {"action": argparse.BooleanOptionalAction, "help": f"{text} (default {default})"}
    if origin is dict or base is dict or dataclasses.is_dataclass(base):  # an option group takes a dict
        return spec | {"action": _ExtraItem, "metavar": "KEY=JSON", "help": text}
    if name == "density_warmup":
        return spec | {"action": _Joined, "nargs": "+", "metavar": "RHO,EPOCHS",
                       "convert": _density_warmup, "expected": "RHO,EPOCHS (e.g. 0.004,1) or none",
                       "help": f"{text} (default {default!r})"}
    if name == "density_schedule":
        return spec | {"action": _Joined, "nargs": "+", "metavar": "RHO,RHO",
                       "convert": _float_tuple, "expected": "comma-separated densities (e.g. 0.015625,0.004) "
                       "or none", "help": f"{text} (default {default!r})"}
    if origin is tuple:
        return spec | {"action": _Joined, "nargs": "*", "metavar": "N,N",
                       "convert": _int_tuple, "expected": "comma-separated integers (e.g. 80,120)",
                       "help": f"{text} (default {','.join(map(str, default or ())) or 'none'})"}
    conv: Callable[[str], Any] = {int: int, float: float, str: str}.get(base, str)
    return spec | {"type": _none_or(conv) if optional else conv, "metavar": name.upper(),
                   "help": f"{text} (default {default!r})"}


def add_config_flags(parser: argparse.ArgumentParser, exclude: Sequence[str] | set[str] = frozenset(),
                     title: str = "run configuration (RunConfig fields)") -> None:
    """Add one flag per RunConfig field (but ``exclude``) to ``parser``, in a group."""
    group = parser.add_argument_group(title)
    for name in FLAG_FIELDS:
        if name not in exclude:
            group.add_argument(flag_of(name), **flag_spec(name))


def config_kwargs(args: argparse.Namespace, exclude: Sequence[str] | set[str] = frozenset()) -> dict[str, Any]:
    """The RunConfig keyword arguments given on the command line (flags not given are absent)."""
    return {name: getattr(args, name) for name in FLAG_FIELDS if name not in exclude and hasattr(args, name)}
