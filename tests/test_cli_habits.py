"""The command line's habits (issue 26 item 8), each checked the way a person meets it.

- ``gtopk-lab --version`` prints the version pyproject.toml declares;
- abbreviated flags are errors on every parser (``--meth gtopk`` is not ``--method``);
- a reader that closes the pipe early leaves stderr empty (no BrokenPipeError traceback);
- tc's rate spellings (``1gbit``, ``100mbit``, ``10gbit``, ``500kbit``) parse wherever a
  bandwidth does, with the rate tc means;
- lists take commas, spaces or both, on the command line and in the panel alike;
- ``--debug`` shows the traceback behind the one-line error (exit 2 either way).

The pipe, version and debug checks run the real interpreter in a subprocess (through a
shell for the pipes); the rest call the parsers in-process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gtopk_lab.cli import study as study_cmd
from gtopk_lab.cli import sweep as sweep_cmd
from gtopk_lab.config import RunConfig
from gtopk_lab.counts import parse_count_list, split_list
from gtopk_lab.network.model import network_model, parse_bandwidth_bps
from gtopk_lab.plotting.panel_fields import parse_float_list, parse_int_list, parse_text_list, study_request

# the module (the package's ``main`` attribute is the function of the same name)
cli_main = importlib.import_module("gtopk_lab.cli.main")
ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _cli(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "gtopk_lab", *argv], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=timeout)


# --- --version ----------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_version_prints_the_declared_version() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    proc = _cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"gtopk-lab {declared}"
    assert proc.stderr == ""


# --- abbreviations off --------------------------------------------------------------------
def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_all_parsers(sub))
    return found


def test_every_parser_refuses_abbreviations() -> None:
    parsers = _all_parsers(cli_main.build_parser())
    # the top level, every sub-command and testbed's actions
    assert len(parsers) >= 1 + len(cli_main.COMMANDS) + 5
    assert [p.prog for p in parsers if p.allow_abbrev] == []
    from gtopk_lab.training.torchrun import build_parser as torchrun_parser

    assert torchrun_parser().allow_abbrev is False


@pytest.mark.parametrize("argv", [["run", "--meth", "gtopk"], ["sweep", "--meth", "gtopk"],
                                  ["study", "--work", "1,2"], ["model", "scaling", "--dens", "0.01"]])
def test_an_abbreviated_flag_is_a_one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gtopk-lab: error: unrecognized arguments: ")
    assert argv[-2] in err


# --- a closed pipe ------------------------------------------------------------------------
def _piped(reader: str, unbuffered: bool) -> subprocess.CompletedProcess[str]:
    env = _env()
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    # a table that needs no run: `methods` would say the same at twice the start-up (it
    # steps every method to count its state; 6 s of CPU against 2.6 s here)
    script = (f'"{PY}" -m gtopk_lab model scaling --bandwidth 1Gbps --workers 1,4,16 | {reader}; '
              f'echo "status=${{PIPESTATUS[0]}}"')
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("unbuffered", [False, True])
def test_a_table_into_head_leaves_stderr_empty(unbuffered: bool) -> None:
    # What a person types: the first line arrives, nothing else is said.
    proc = _piped("head -1", unbuffered)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("network 1Gbps: ") and lines[-1].startswith("status=")
    assert len(lines) == 2
    assert proc.stderr == ""
    # A reader gone before the first write (head -n 0 exits at once; the interpreter
    # needs seconds to import): every write meets a closed pipe, deterministically.
    proc = _piped("head -n 0", unbuffered)
    assert proc.stderr == ""
    assert proc.stdout.strip() == f"status={cli_main.BROKEN_PIPE_EXIT}"


# --- tc spellings -------------------------------------------------------------------------
TC_RATES = [("1gbit", 1e9), ("100mbit", 100e6), ("10gbit", 10e9), ("500kbit", 500e3),
            ("1.5gbit", 1.5e9), ("2tbit", 2e12), ("100Mbit", 100e6)]


@pytest.mark.parametrize("text, bits_per_s", TC_RATES)
def test_tc_spellings_are_bits_per_second(text: str, bits_per_s: float) -> None:
    assert parse_bandwidth_bps(text) == bits_per_s
    model = network_model(text)
    assert model.bandwidth_bps == bits_per_s and model.latency_s == 0.0
    assert RunConfig(bandwidth=text).bandwidth == text  # the config keeps what was typed


def test_tc_spelling_predicts_what_the_same_rate_in_gbps_does(capsys: pytest.CaptureFixture[str]) -> None:
    rows = {}
    for text in ("1gbit", "1Gbps"):
        assert cli_main.main(["model", "scaling", "--bandwidth", text, "--workers", "1 4 16", "--json"]) == 0
        rows[text] = json.loads(capsys.readouterr().out)["rows"]
    assert rows["1gbit"] == rows["1Gbps"] and {r["workers"] for r in rows["1gbit"]} == {1, 4, 16}


def test_tc_spellings_in_the_panel_and_the_sweep() -> None:
    request = study_request(methods=["dense", "gtopk"], workers="1 2", densities="0.01", bandwidths="1gbit 100mbit",
                            latencies="", seeds=1, model="mlp", dataset="mnist1d", epochs=1, max_iterations=2)
    assert request.axes["bandwidth"] == ["1gbit", "100mbit"]
    args = cli_main.build_parser().parse_args(["sweep", "--bandwidth", "10gbit", "--methods", "dense",
                                               "--max-iterations", "2"])
    assert {c.bandwidth for c in sweep_cmd.build_grid(args)} == {"10gbit"}


@pytest.mark.parametrize("text", ["1gbits/x", "gbit", "1 gbyte", "-1gbit", "0gbit"])
def test_bad_rates_stay_one_line_errors(text: str) -> None:
    with pytest.raises(ValueError, match=r"^bandwidth=.* is invalid: ") as info:
        parse_bandwidth_bps(text)
    assert "\n" not in str(info.value)


# --- lists: commas, spaces or both --------------------------------------------------------
@pytest.mark.parametrize("text, items", [
    ("1,2,4", ["1", "2", "4"]), ("1 2 4", ["1", "2", "4"]), ("1, 2 ,4", ["1", "2", "4"]),
    (" 1;2  4 ", ["1", "2", "4"]), ("dense topk,gtopk", ["dense", "topk", "gtopk"]),
    ("2.5 Gbit/s 10GbE", ["2.5 Gbit/s", "10GbE"]), ("0.5 ms, 5ms", ["0.5 ms", "5ms"]),
    ("1M 25M", ["1M", "25M"]), ("", []), (" , ", []),
])
def test_split_list(text: str, items: list[str]) -> None:
    assert split_list(text) == items


SPELLINGS = ["1,2,4", "1 2 4", "1, 2 4"]


@pytest.mark.parametrize("workers", SPELLINGS)
def test_cli_and_panel_read_the_same_list(workers: str) -> None:
    # the panel's box
    assert parse_int_list(workers, "P list") == [1, 2, 4]
    assert parse_float_list(workers.replace("1", "0.1").replace("2", "0.2").replace("4", "0.4"),
                            "densities") == [0.1, 0.2, 0.4]
    assert parse_text_list("1GbE 10GbE, 2.5 Gbit/s", "bandwidths") == ["1GbE", "10GbE", "2.5 Gbit/s"]
    # the command line: the list quoted as one argument, and unquoted as several
    parser = cli_main.build_parser()
    for argv in (["--workers", workers], ["--workers", *workers.replace(",", " ").split()]):
        study_args = parser.parse_args(["study", "--methods", "dense", "gtopk", *argv])
        axes = study_cmd.grid_axes(study_args)
        assert axes["workers"] == [1, 2, 4] and axes["method"] == ["dense", "gtopk"]
        sweep_args = parser.parse_args(["sweep", "--methods", "dense,gtopk", "--max-iterations", "2", *argv])
        assert sorted({(c.method, c.workers) for c in sweep_cmd.build_grid(sweep_args)}) == \
            [("dense", 1), ("dense", 2), ("dense", 4), ("gtopk", 1), ("gtopk", 2), ("gtopk", 4)]
    assert parse_count_list(workers) == [1, 2, 4]


def test_config_list_fields_take_spaces_too() -> None:
    parser = cli_main.build_parser()
    for text in ("80,120", "80 120", "80, 120"):
        args = parser.parse_args(["run", "--lr-milestones", text])
        assert args.lr_milestones == (80, 120)
    assert parser.parse_args(["run", "--lr-milestones", "80", "120"]).lr_milestones == (80, 120)


@pytest.mark.parametrize("argv, message", [
    (["study", "--workers", " "], "--workers=' ' is invalid: expected a list"),
    (["study", "--workers", "1 two"], "--workers='1 two' is invalid: expected integers"),
    (["sweep", "--density", "0.1 x"], "--density='0.1 x' is invalid: expected numbers"),
])
def test_bad_lists_are_one_line_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main([*argv, "--max-iterations", "1", "--out", "/nonexistent/never-written"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


# --- --debug ------------------------------------------------------------------------------
@pytest.mark.timeout(600)
def test_debug_shows_the_traceback_behind_the_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    # in this process (the CLI's main, which owns the one-line rule and --debug): a new
    # interpreter for each of the three calls would only add its imports
    def cli(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = cli_main.main(list(argv))
        return code, capsys.readouterr().err

    code, plain = cli("run", "--method", "nope", "--simulate")
    assert code == 2
    assert plain.count("\n") == 1 and "Traceback" not in plain
    line = plain.strip()
    assert line.startswith("gtopk-lab: error: method='nope' is invalid")
    for argv in (["--debug", "run", "--method", "nope", "--simulate"],
                 ["run", "--method", "nope", "--simulate", "--debug"]):
        code, debug = cli(*argv)
        assert code == 2
        assert debug.startswith("Traceback (most recent call last):")
        assert "ValueError: method='nope' is invalid" in debug
        assert debug.strip().splitlines()[-1] == line  # the same line closes it


# --- start-up: a command imports its own module only ---------------------------------------
_IMPORTED = ("import sys\nfrom gtopk_lab.cli.main import main\ntry:\n    main(sys.argv[1:])\nfinally:\n"
             "    print('\\nIMPORTED', sorted(m for m in sys.modules if m.startswith('gtopk_lab.cli.') or m in "
             "('torch', 'distributed', 'scipy.stats')))")


def _imported_by(*argv: str) -> list[str]:
    done = subprocess.run([PY, "-c", _IMPORTED, *argv], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=120)
    line = next(x for x in done.stdout.splitlines() if x.startswith("IMPORTED"))
    return eval(line.split(" ", 1)[1])  # a list literal this test printed


@pytest.mark.timeout(240)
def test_a_command_imports_its_own_module_and_version_imports_none() -> None:
    """``gtopk-lab --version`` needs no torch, and ``gtopk-lab model ...`` no other command's
    module: every process Dask spawns from a CLI process imports the main module again."""
    assert _imported_by("--version") == ["gtopk_lab.cli.errors", "gtopk_lab.cli.main"]
    model = _imported_by("model", "scaling", "--workers", "1,2")
    others = {f"gtopk_lab.cli.{c}" for c in cli_main.COMMANDS} - {"gtopk_lab.cli.model"}
    assert "gtopk_lab.cli.model" in model and not others & set(model), model
    assert "distributed" not in model and "scipy.stats" not in model, model
