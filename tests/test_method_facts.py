"""Every fact about a method lives in the registry, and one prediction path prices it.

1. Display facts: each registered method carries its display order, family, colour and kind
   (sparse or dense); a plugin's method gets them without an edit elsewhere, and the tables
   and figures read them (sweep table order, figure colours).
2. One prediction path: ``gtopk-lab model`` and ``analysis.predict.predict_scaling`` equal
   ``Method.predicted_time_s`` for every registered method on a few (P, rho, link) points;
   Top-k at P = 8 on 1GbE applies exact-k (checked against the hand formula).
3. The guard: an AST walk over gtopk_lab (outside gtopk_lab/methods) fails on any registered
   method-name string literal compared with (==, !=, in, ... a literal or a tuple/list/set of
   them), used as a key of a dict literal, as a subscript key, as a ``match`` case or as the key
   of ``.get/.pop/.setdefault``, whatever the variable is called; it is shown to catch
   synthetic offending code.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from gtopk_lab.analysis.predict import collective_time_s, predict_scaling, scaling_rows
from gtopk_lab.methods import (Method, available_methods, display_color, display_order, family_of, get_method,
                               is_dense, patterns_of, register_method, unregister_method)
from gtopk_lab.methods.base import KINDS
from gtopk_lab.network.model import NetworkModel, network_model

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gtopk_lab"


# --- 1. display facts ---------------------------------------------------------------------------
def test_every_registered_method_carries_its_display_facts() -> None:
    names = available_methods()
    orders = []
    for name in names:
        m = get_method(name)
        assert isinstance(m.family, str) and m.family, name
        assert get_method(m.family).family == m.family, name  # a family is named after its head
        assert len(m.color) == 7 and m.color.startswith("#") and int(m.color[1:], 16) >= 0, name
        assert m.kind in KINDS, name
        assert isinstance(m.order, int), name
        orders.append(m.order)
    assert len(set(orders)) == len(orders)
    # the built-ins, in the registry's order: the paper's methods first
    assert sorted(names, key=display_order)[:5] == ["dense", "topk", "gtopk", "gaussiank", "oktopk"]
    colors = [get_method(n).color.lower() for n in names]
    assert len(set(colors)) == len(colors), "two methods share a colour"
    # kind: density applies to CLT-k (the leader's top-k) though it takes the whole buffer
    assert [n for n in names if is_dense(n)] == ["dense", "powersgd", "diloco"]
    assert get_method("clt-k").kind == "sparse" and not get_method("clt-k").sparse
    assert family_of("oktopk-balanced") == family_of("oktopk-exact") == "oktopk"
    assert family_of("ef21-sgdm") == "ef21" and family_of("gtopk") == "gtopk"
    assert patterns_of("gtopk") == ("butterfly", "tree") and patterns_of("oktopk") == () == patterns_of("topk")


def test_a_plugin_method_gets_its_facts_and_every_consumer_reads_them() -> None:
    from gtopk_lab.cli.sweep import format_table, sweep_table
    from gtopk_lab.plotting.figures_base import method_color

    last = max(get_method(n).order for n in available_methods())
    try:
        plug = register_method(Method(name="facts-plugin", selector="topk", collective="gtopk"))
        variant = register_method(Method(name="facts-plugin-v2", selector="topk", collective="allgather",
                                          family="facts-plugin"))
        placed = register_method(Method(name="facts-first", selector=None, collective="allreduce", memory=None,
                                        order=-1, color="#123456"))
        assert plug.order > last and variant.order > plug.order and plug.family == "facts-plugin"
        assert plug.kind == "sparse" and placed.kind == "dense" and is_dense("facts-first")
        # a variant takes a lighter shade of its family's colour: each channel moves towards 255
        head = [int(plug.color[j:j + 2], 16) for j in (1, 3, 5)]
        shade = [int(variant.color[j:j + 2], 16) for j in (1, 3, 5)]
        assert all(s >= h for s, h in zip(shade, head)) and shade != head
        assert method_color("facts-plugin") == plug.color and method_color("facts-first") == "#123456"
        assert sorted(["gtopk", "facts-plugin", "dense", "facts-first"], key=display_order) == [
            "facts-first", "dense", "gtopk", "facts-plugin"]
        assert [r[0] for r in scaling_rows(["facts-plugin"])] == ["facts-plugin-butterfly", "facts-plugin-tree"]
        # the sweep table sorts by the registry and shows the pattern of methods that have a choice
        summaries = pd.DataFrame([
            {"method": m, "workers": p, "density": 0.01, "algorithm": "tree", "bandwidth": "1Gbps",
             "status": "completed", "samples_per_s_virtual": 100.0 * p, "samples_per_s_wall": 90.0 * p,
             "virtual_time_s": 1.0, "iterations": 10, "final_test_accuracy": 0.5, "batch_size": 32,
             "model": "cnn", "dataset": "mnist1d", "numel": 1000, "bandwidth_bps": 1e9, "latency_s": 0.0}
            for m in ("facts-plugin", "topk", "facts-first", "dense") for p in (1, 2)])
        table = sweep_table(summaries)
        assert list(dict.fromkeys(table["method"])) == ["facts-first", "dense", "topk", "facts-plugin"]
        shown = format_table(table).splitlines()
        assert [line.split()[1] for line in shown[1:9]] == ["-"] * 6 + ["tree"] * 2
    finally:
        for name in ("facts-plugin", "facts-plugin-v2", "facts-first"):
            unregister_method(name)


def test_a_name_not_registered_still_has_facts() -> None:
    """A stored run of a plugin that is not loaded: sorted last, a stable colour, its density shown."""
    assert display_order("no-such-method") == (math.inf, "no-such-method")
    assert display_color("no-such-method") == display_color("no-such-method")
    assert display_color("no-such-method").startswith("#")
    assert not is_dense("no-such-method") and patterns_of("no-such-method") == ()
    assert family_of("no-such-method") == "no-such-method"


@pytest.mark.parametrize("field,value,error", [("color", "red", ValueError), ("kind", "lowrank", ValueError),
                                               ("order", 1.5, TypeError), ("family", 3, TypeError)])
def test_bad_display_facts_are_refused_naming_the_field(field: str, value: object, error: type) -> None:
    with pytest.raises(error, match=f"{field}="):
        Method(name="bad-facts", selector="topk", collective="gtopk", **{field: value})


# --- 2. one prediction path -------------------------------------------------------------------------
LINKS = ("1GbE", "10GbE")
POINTS = ((2, 0.01), (8, 0.001), (32, 0.01))
NUMEL = 200_000


def _expected_comm_s(method: Method, net: NetworkModel, rho: float, p: int, pattern: str | None,
                     numel: int = NUMEL) -> float:
    k = max(1, int(math.floor(rho * numel)))
    return method.predicted_time_s(net, numel, k, p, algorithm=pattern) / method.sync_every


@pytest.mark.parametrize("name", available_methods())
def test_predict_scaling_is_method_predicted_time_s(name: str) -> None:
    method = get_method(name)
    for link in LINKS:
        net = network_model(link)
        for p, rho in POINTS:
            for label, row_name, pattern in scaling_rows([name]):
                try:
                    expected = _expected_comm_s(method, net, rho, p, pattern)
                except ValueError:  # PowerSGD without a layout: both refuse
                    with pytest.raises(ValueError, match="layout"):
                        predict_scaling(NUMEL, rho, 0.1, net, [p], methods=[(label, row_name, pattern)])
                    continue
                (row,) = predict_scaling(NUMEL, rho, 0.1, net, [p], methods=[(label, row_name, pattern)])
                assert row["comm_s"] == pytest.approx(expected, rel=1e-12), (label, link, p, rho)
                assert row["iteration_s"] == pytest.approx(0.1 + expected, rel=1e-12)  # selection 0


def test_gtopk_lab_model_prints_method_predicted_time_s(capsys: pytest.CaptureFixture[str]) -> None:
    from gtopk_lab.cli import main

    for link in LINKS:
        for p, rho in POINTS:
            assert main(["model", "scaling", "--model-size", str(NUMEL), "--density", str(rho),
                         "--compute-time", "0.1", "--bandwidth", link, "--workers", str(p), "--json"]) == 0
            rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
            net = network_model(link)
            seen = set()
            for label, name, pattern in scaling_rows():
                if name not in available_methods():  # the lower bound
                    continue
                try:
                    expected = _expected_comm_s(get_method(name), net, rho, p, pattern)
                except ValueError:
                    assert label not in rows  # left out of the default table, and said so
                    continue
                assert rows[label]["comm_s"] == pytest.approx(expected, rel=1e-12), (label, link, p)
                seen.add(name)
            assert seen == set(available_methods()) - {"powersgd"}
    assert main(["model", "scaling", "--methods", "gtopk,no-such"]) == 2
    assert "no-such" in capsys.readouterr().err


def test_gtopk_lab_model_prices_powersgd_from_a_named_models_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    """``--model NAME``: d and the parameter shapes from the project's model, so PowerSGD (its
    default rank 1 and threshold 2) is priced beside every other method; with ``--model-size``
    or an unknown name, one line and exit 2."""
    from gtopk_lab.cli import main
    from gtopk_lab.training.models import build_model

    assert main(["model", "scaling", "--model", "cnn", "--density", "0.01", "--bandwidth", "1GbE",
                 "--workers", "4", "--json"]) == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    shapes = [tuple(p.shape) for p in build_model("cnn").parameters()]
    d = sum(math.prod(s) for s in shapes)
    assert rows["powersgd"]["numel"] == d == 5210
    assert rows["powersgd"]["comm_s"] == pytest.approx(get_method("powersgd").predicted_time_s(
        network_model("1GbE"), d, 50, 4, layout=shapes, rank=1, min_compression_rate=2.0), rel=1e-12)
    assert rows["gtopk-butterfly"]["comm_s"] == pytest.approx(
        _expected_comm_s(get_method("gtopk"), network_model("1GbE"), 0.01, 4, "butterfly", numel=d), rel=1e-12)
    assert main(["model", "scaling", "--model", "cnn", "--model-size", "1M"]) == 2
    assert main(["model", "scaling", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "--model and --model-size" in err and "--model: model='no-such-model' is invalid" in err


def test_topk_at_p8_on_1gbe_applies_exact_k() -> None:
    """Top-k's selector promises exactly k, so its allgather sends no counts: (P-1) rounds of
    8k bytes, where the counted allgather adds (P-1) rounds of an 8-byte count (6.61 ms)."""
    net = network_model("1GbE")
    a, b = net.alpha_s, net.beta_s_per_byte
    d, k, p = 1_000_000, 1000, 8
    hand = (p - 1) * (a + b * 8 * k)
    assert hand == pytest.approx(3.556e-3, rel=1e-3)
    assert get_method("topk").predicted_time_s(net, d, k, p) == pytest.approx(hand, rel=1e-12)
    assert collective_time_s(net, "topk", d, k, p) == pytest.approx(hand, rel=1e-12)
    (row,) = predict_scaling(d, k / d, 0.15, net, [p], methods=[("topk", "topk", None)])
    assert row["comm_s"] == pytest.approx(hand, rel=1e-12)
    counted = collective_time_s(net, "topk_allgather", d, k, p)
    assert counted == pytest.approx(hand + (p - 1) * (a + 8 * b), rel=1e-12)
    # bench's rows price bare collectives with exact_k=True: the methods' formula
    assert collective_time_s(net, "topk_allgather", d, k, p, exact_k=True) == pytest.approx(hand, rel=1e-12)
    assert collective_time_s(net, "gtopk_allreduce", d, k, p, "butterfly", exact_k=True) == pytest.approx(
        get_method("gtopk").predicted_time_s(net, d, k, p), rel=1e-12)


# --- 3. the guard -------------------------------------------------------------------------------
#: Allowed hits: (path, text on the line) -> why it is no method dispatch. Keep it minimal.
ALLOWED: dict[tuple[str, str], str] = {
    ("gtopk_lab/plotting/figures_scaling.py", '"dense": 0.'):
        "the seed paper's published scaling efficiencies, keyed by the paper's method names (data)",
    ("gtopk_lab/bench/selection.py", 'r["selector"] == "topk"'):
        "a selector's name (torch.topk, the speed-up's reference), which a method shares",
}


def _literal_names(node: ast.AST, names: set[str]) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for e in node.elts for n in _literal_names(e, names)]
    return []


def method_name_uses(source: str, names: set[str]) -> list[tuple[int, str, list[str]]]:
    """``(line, kind, names)`` for each method-name literal compared with, used as a dict
    literal's key, a subscript key, a ``match`` case or a ``.get/.pop/.setdefault`` key."""
    out = []
    for node in ast.walk(ast.parse(source)):
        found: list[str] = []
        if isinstance(node, ast.Compare):
            kind = "comparison"
            for side in (node.left, *node.comparators):
                found += _literal_names(side, names)
        elif isinstance(node, ast.Dict):
            kind = "dict key"
            for key in node.keys:
                if key is not None:
                    found += _literal_names(key, names)
        elif isinstance(node, ast.Subscript):
            kind = "subscript key"
            found += _literal_names(node.slice, names)
        elif isinstance(node, ast.MatchValue):
            kind = "match case"
            found += _literal_names(node.value, names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and node.args):
            kind = "mapping key"
            found += _literal_names(node.args[0], names)
        if found:
            out.append((node.lineno, kind, found))
    return out


def test_the_guard_catches_method_names_whatever_the_variable() -> None:
    names = {"gtopk", "dense", "topk"}
    offending = '''
if cfg.algo_name == "gtopk":
    pass
if "dense" != row.kind:
    pass
if name in ("dense", "topk"):
    pass
if label not in {"gtopk"}:
    pass
colours = {"gtopk": "#00CC96", other: 1}
x = frame["dense"]
y = frame[["model", "topk"]]
z = table.get("gtopk", 0)
match chosen:
    case "topk":
        pass
'''
    hits = sorted(method_name_uses(offending, names))
    assert [(line, kind) for line, kind, _ in hits] == [
        (2, "comparison"), (4, "comparison"), (6, "comparison"), (8, "comparison"), (10, "dict key"),
        (11, "subscript key"), (12, "subscript key"), (13, "mapping key"), (15, "match case")]
    fine = '''
"""Docs name gtopk and dense freely."""
config = RunConfig(method="gtopk", workers=4)
defaults = {"methods": ["dense", "topk"]}
if method == BASELINE_METHOD and mode == "fast" and frame["model"] is not None:
    pass
'''
    assert method_name_uses(fine, names) == []


def test_no_method_name_dispatch_outside_the_registry() -> None:
    names = set(available_methods())
    hits, used = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if PACKAGE / "methods" in path.parents:
            continue
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for line, kind, found in method_name_uses(text, names):
            allowed = [key for key in ALLOWED if key[0] == rel and key[1] in lines[line - 1]]
            if allowed:
                used.update(allowed)
                continue
            hits.append(f"{rel}:{line}: {kind} on {', '.join(found)}: {lines[line - 1].strip()}")
    assert hits == [], "method facts belong to the registry (gtopk_lab/methods):\n" + "\n".join(hits)
    assert used == set(ALLOWED), f"allow-list entries that match nothing: {set(ALLOWED) - used}"
