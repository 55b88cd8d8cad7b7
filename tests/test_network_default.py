"""One network default everywhere (issue 26 item 6): the paper's 1GbE with its latency.

Oracle: the seed paper's fitted constants written out here (alpha = 0.436 ms, beta = 9e-9 s/B,
i.e. 8 / 9e-9 bit/s = 888.9 Mbit/s), and every entry's default compared with the one constant
``gtopk_lab.network.DEFAULT_NETWORK``: RunConfig, ``run``, ``sweep``, ``study``, ``demo``,
``model`` and the ControlPanel. A summary states the link; ``none`` only when asked for.
"""

from __future__ import annotations

import argparse

import pytest

from gtopk_lab.cli.main import build_parser
from gtopk_lab.config import RunConfig
from gtopk_lab.config_flags import config_kwargs
from gtopk_lab.network import DEFAULT_NETWORK
from gtopk_lab.network.model import network_model

PAPER_ALPHA_S = 0.436e-3
PAPER_BANDWIDTH_BPS = 8.0 / 9e-9


def _sub(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


@pytest.mark.timeout(30)
def test_the_constant_is_the_papers_1gbe_with_its_latency() -> None:
    assert DEFAULT_NETWORK == "1GbE"
    net = network_model(DEFAULT_NETWORK)
    assert net.latency_s == pytest.approx(PAPER_ALPHA_S, rel=1e-12)
    assert net.bandwidth_bps == pytest.approx(PAPER_BANDWIDTH_BPS, rel=1e-12)


@pytest.mark.timeout(30)
def test_runconfig_and_run_default_to_the_constant() -> None:
    assert RunConfig().bandwidth == DEFAULT_NETWORK and RunConfig().latency is None
    args = _parse(["run"])
    assert "bandwidth" not in config_kwargs(args)  # the flag leaves RunConfig's default
    config = RunConfig(**config_kwargs(args))
    assert config.bandwidth == DEFAULT_NETWORK
    assert network_model(config.bandwidth, config.latency).latency_s == pytest.approx(PAPER_ALPHA_S)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv", [["sweep"], ["study"], ["demo"], ["model", "scaling"]])
def test_every_command_defaults_to_the_constant(argv: list[str]) -> None:
    args = _parse(argv)
    assert args.bandwidth == DEFAULT_NETWORK
    assert getattr(args, "latency", None) is None  # the link's own latency, 0.436 ms
    assert DEFAULT_NETWORK in _sub(argv[0]).format_help()


@pytest.mark.timeout(60)
def test_sweep_and_study_grids_are_charged_the_papers_latency() -> None:
    from gtopk_lab.cli import study, sweep

    configs = sweep.build_grid(_parse(["sweep", "--methods", "dense,gtopk", "--workers", "2"]))
    points = study.build_points(_parse(["study", "--methods", "dense,gtopk", "--workers", "2"]), 2)
    for config in configs + [p.config for p in points]:
        net = network_model(config.bandwidth, config.latency)
        assert (config.bandwidth, net.latency_s) == (DEFAULT_NETWORK, pytest.approx(PAPER_ALPHA_S))


@pytest.mark.timeout(60)
def test_the_panel_defaults_to_the_constant() -> None:
    from gtopk_lab.plotting.controls import DEFAULT_FIELDS
    from gtopk_lab.plotting.panel_fields import format_list, study_request

    assert DEFAULT_FIELDS["bandwidth"] == DEFAULT_NETWORK
    d = DEFAULT_FIELDS
    request = study_request(methods=d["methods"], workers=format_list(d["workers"]),
                            densities=format_list(d["density"]), bandwidths=format_list(d["bandwidth"]),
                            latencies=format_list(d["latency"]), seeds=d["seeds"], model=d["model"],
                            dataset=d["dataset"], epochs=d["epochs"], max_iterations=d["max_iterations"])
    assert request.axes["bandwidth"] == [DEFAULT_NETWORK] and "latency" not in request.axes


@pytest.mark.timeout(30)
def test_none_only_when_asked_for() -> None:
    assert RunConfig(bandwidth="none").bandwidth == "none"
    assert RunConfig(**config_kwargs(_parse(["run", "--bandwidth", "none"]))).bandwidth == "none"
    assert _parse(["sweep", "--bandwidth", "none"]).bandwidth == "none"


@pytest.mark.timeout(30)
def test_every_summary_states_the_link(capsys) -> None:
    from gtopk_lab.cli.run import print_summary
    from gtopk_lab.orchestration.results import run_summary

    summary = run_summary(RunConfig(run_id="r"), None, status="failed", error="x")  # no rank-0 summary
    assert summary["link"] == "1GbE: 888.9 Mbit/s, 436 us latency"
    assert run_summary(RunConfig(run_id="r", bandwidth="none"), None, status="failed")["link"] == "none: unthrottled"
    assert run_summary(RunConfig(run_id="r", bandwidth="10Gbps", latency="50us"), None,
                       status="failed")["link"].endswith("10 Gbit/s, 50 us latency")
    print_summary(summary, as_json=False)
    lines = [line.split(None, 1) for line in capsys.readouterr().out.splitlines()]
    assert ["link", "1GbE: 888.9 Mbit/s, 436 us latency"] in lines
