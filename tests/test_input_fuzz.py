"""Bad input in Python beyond RunConfig (issue 19 item 8; RunConfig itself: test_config_fuzz.py).

Every argument of ``Lab.submit`` / ``Lab.sweep`` / ``Lab.study``, the public collectives,
``register_method`` (and ``Method``), and the ControlPanel's fields is fed wrong types,
NaN, infinities, negative and huge values, empty lists and unknown names: each gives a
``ValueError``/``TypeError`` whose first line names the field, and the Lab's results
folder stays empty (nothing was written or submitted).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gtopk_lab.config import RunConfig

#: label -> bad value
BAD: dict[str, Any] = {"'x'": "x", "[1]": [1], "None": None, "object": object(), "nan": math.nan,
                       "inf": math.inf, "-inf": -math.inf, "-1": -1, "huge": 10**30, "[]": [],
                       "'nope'": "nope", "True": True, "1.5": 1.5}


def _feed(call: Callable[[Any], Any], names: tuple[str, ...], allowed: set[str] = frozenset()) -> None:
    """Call ``call(value)`` for every BAD value not in ``allowed``: a clean error naming one
    of ``names`` on its first line, or the test fails saying which value got through."""
    for label, value in BAD.items():
        if label in allowed:
            continue
        try:
            call(value)
        except (ValueError, TypeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            assert any(n in first for n in names), f"{names[0]}={label}: the message does not name it: {exc}"
        except Exception as exc:  # noqa: BLE001 - the wrong exception type is the finding
            pytest.fail(f"{names[0]}={label}: {type(exc).__name__} instead of ValueError/TypeError: {exc}")
        else:
            pytest.fail(f"{names[0]}={label} was accepted")


# --- the collectives ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    import torch.distributed as dist

    from gtopk_lab.comm.launch import free_port

    store = dist.TCPStore("127.0.0.1", free_port(), 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_collectives_reject_bad_arguments_naming_them(one_rank_group) -> None:
    from gtopk_lab.collectives import dense_allreduce, gtopk_allreduce, oktopk_allreduce, topk_allgather

    v, i = torch.tensor([1.0, 2.0]), torch.tensor([0, 3], dtype=torch.int32)
    _feed(lambda x: dense_allreduce(x), ("tensor",))
    _feed(lambda x: dense_allreduce(torch.ones(3), group=x), ("group",), {"None"})
    sparse = {"values": 0, "indices": 1, "numel": 2, "k": 3}
    for name, collective in (("gtopk_allreduce", gtopk_allreduce), ("oktopk_allreduce", oktopk_allreduce),
                             ("topk_allgather", topk_allgather)):
        for field, pos in sparse.items():
            if name == "topk_allgather" and field == "k":
                continue

            def call(x: Any, pos: int = pos, collective: Any = collective, name: str = name) -> None:
                args: list[Any] = [v, i, 10] if name == "topk_allgather" else [v, i, 10, 2]
                args[pos] = x
                collective(*args)
            # a tensor argument's message names it as "<collective>(values, indices)"
            _feed(call, (field, f"{name}(values, indices)"))
        _feed(lambda x, c=collective, n=name: c(v, i, 10, *([] if n == "topk_allgather" else [2]), group=x),
              ("group",), {"None"})
    _feed(lambda x: topk_allgather(v, i, 10, exact_count=x), ("exact_count",), {"None"})
    _feed(lambda x: gtopk_allreduce(v, i, 10, 2, algorithm=x), ("algorithm",))
    _feed(lambda x: gtopk_allreduce(v, i, 10, 2, exact_k=x), ("exact_k",), {"True"})
    _feed(lambda x: oktopk_allreduce(v, i, 10, 2, state=x), ("state",), {"None"})


# --- register_method and Method ------------------------------------------------------------
@pytest.mark.timeout(30)
def test_register_method_rejects_bad_methods_and_fields() -> None:
    from gtopk_lab.methods import Method, available_methods
    from gtopk_lab.methods.registry import register_method, unregister_method

    before = set(available_methods())
    _feed(lambda x: register_method(x), ("method",))
    _feed(lambda x: register_method(Method(name="fuzz-m", collective="gtopk"), replace=x), ("replace",),
          {"True"})
    #: values a field may take: a name is any string, None means "none" or "the run's"
    allowed = {"name": {"'x'", "'nope'"}, "memory": {"None"}, "algorithm": {"None"},
               "selector": {"'x'"} - {"'x'"}, "outer_optimizer": {"None"}, "time_s": {"None"},
               "bytes_per_rank": {"None"}, "check_options": {"None"}, "options": {"[]"} - {"[]"},
               "description": {"'x'", "'nope'"}, "sync_every": {"huge"}}  # H > any run: never syncs
    for field in ("name", "collective", "selector", "memory", "algorithm", "sync_every", "requires_lossless",
                  "outer_optimizer", "time_s", "bytes_per_rank", "check_options", "description", "options"):
        def call(x: Any, field: str = field) -> None:
            register_method(Method(**{"name": "fuzz-m", "collective": "gtopk", field: x}), replace=True)
        try:
            _feed(call, (field,), allowed.get(field, set()))
        finally:
            unregister_method("fuzz-m")
    assert set(available_methods()) == before


# --- the ControlPanel's fields --------------------------------------------------------------
#: study_request argument -> the label its errors start with (what the panel shows)
PANEL_LABELS = {"methods": "methods", "workers": "P list", "densities": "densities",
                "bandwidths": "bandwidths", "latencies": "latencies", "seeds": "seeds", "model": "model",
                "dataset": "dataset", "epochs": "epochs", "max_iterations": "max iters", "extra": "extra"}
#: what a text box may legitimately hold ("None"/"inf" are link names: unthrottled)
PANEL_ALLOWED = {"bandwidths": {"None", "inf"}, "latencies": {"None", "[]"}, "extra": {"None"},
                 "dataset": set()}


@pytest.mark.timeout(60)
def test_panel_fields_and_control_panel_reject_bad_values_naming_the_field() -> None:
    import pandas as pd

    from gtopk_lab.plotting.controls import ControlPanel
    from gtopk_lab.plotting.panel_fields import study_request

    good = dict(methods=["gtopk"], workers="1,2", densities="0.01", bandwidths="1GbE", latencies="",
                seeds=1, model="mlp", dataset="mnist1d", epochs=1, max_iterations=0)
    for field, label in PANEL_LABELS.items():
        _feed(lambda x, f=field: study_request(**{**good, f: x}), (label,), PANEL_ALLOWED.get(field, set()))

    class FakeLab:  # what the panel needs of a Lab; it never launches here
        out, closed = "unused", False

        def runs(self) -> pd.DataFrame:
            return pd.DataFrame()

        def study(self, **kwargs: Any) -> None:
            raise AssertionError("launched")

    allowed = {"workers": {"[1]"}, "density": {"[1]"}, "bandwidth": {"inf"}, "latency": {"None", "[]"},
               "max_iterations": {"None"}}
    for key in ("methods", "workers", "density", "bandwidth", "latency", "seeds", "model", "dataset",
                "epochs", "max_iterations"):
        _feed(lambda x, k=key: ControlPanel(FakeLab(), defaults={k: x}), (f"defaults[{key!r}]",),
              allowed.get(key, set()))
    _feed(lambda x: ControlPanel(FakeLab(), defaults=x), ("defaults",), {"None"})
    _feed(lambda x: ControlPanel(FakeLab(), extra=x), ("extra",), {"None"})
    _feed(lambda x: ControlPanel(FakeLab(), refresh_s=x), ("refresh_s",), {"1.5"})


# --- Lab.submit / sweep / study --------------------------------------------------------------
@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Any]:
    """A Lab on an in-process cluster (one thread worker: no process starts); nothing may run."""
    from distributed import Client, LocalCluster

    from gtopk_lab.orchestration.lab import Lab

    out = tmp_path_factory.mktemp("fuzz-out")
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client, Lab(client=client, out=str(out)) as lab:
        yield lab
    assert not any(Path(out).iterdir()), sorted(Path(out).rglob("*"))


@pytest.mark.timeout(60)
def test_lab_submit_sweep_and_study_reject_bad_arguments_and_write_nothing(lab) -> None:
    config = RunConfig(method="dense", workers=1, max_iterations=1)
    _feed(lambda x: lab.submit(x), ("config", "RunConfig"))
    for field, allowed in (("wait_for_workers", {"True"}), ("timeout_s", {"None", "1.5"}),
                           ("progress", {"None", "True"}), ("resume", {"True"}), ("simulate", {"True"})):
        _feed(lambda x, f=field: lab.submit(config, **{f: x}), (field,), allowed)
    _feed(lambda x: lab.sweep(x), ("configs",))
    _feed(lambda x: lab.sweep([x]), ("configs[0]",))
    for field, allowed in (("skip_completed", {"True"}), ("progress", {"None", "True"}), ("simulate", {"True"})):
        _feed(lambda x, f=field: lab.sweep([config], **{f: x}), (field,), allowed)
    grid = {"methods": ["dense"], "workers": [1], "max_iterations": 1}
    for field, allowed in (("base", {"None"}), ("real_max_workers", {"None", "huge"}),
                           ("both_ways", {"[1]", "[]"}), ("simulate", {"True"}), ("skip_completed", {"True"}),
                           ("progress", {"None", "True"}), ("refresh_s", {"1.5"})):
        _feed(lambda x, f=field: lab.study(**grid, **{f: x}), (field,), allowed)
    # the axes: RunConfig fields (their own checks) under the study's names, seeds, unknown names
    for field, names, allowed in (("methods", ("method",), set()), ("workers", ("workers",), {"[1]"}),
                                  ("density", ("density",), {"[1]"}), ("seeds", ("seeds", "seed"), {"[1]", "None"}),
                                  ("bandwidth", ("bandwidth",), {"None", "inf"}), ("no_such_field", ("no_such_field",), set())):
        _feed(lambda x, f=field: lab.study(**{**grid, f: x}), names, allowed)
    assert not any(Path(lab.out).iterdir())
