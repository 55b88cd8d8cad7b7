"""Damaged files (issue 30 item 5), fuzzed like the input fuzz (tests/test_input_fuzz.py):
calibration JSON (a results folder's ``calibration.json`` and a network calibration file),
checkpoint files (``latest.json``, rank ``.pt`` files, their saved rows), method plugin
modules, and the state a study resumes from (a run's heartbeat and parts, point records).

Every file is damaged every way in :data:`DAMAGE` (and the JSON ones in :data:`JSON_VALUES`);
its consumer must then answer with exactly one line (an exception's message, a CLI's
stderr or one warning) that names the file and says what is wrong, and leave the damaged
file as it was: nothing is written over it (a file moved aside keeps its bytes).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gtopk_lab.atomic_io import DamagedFile
from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration import calibration, locks
from gtopk_lab.orchestration import results as store
from gtopk_lab.orchestration.run_stream import write_heartbeat, write_part
from gtopk_lab.training import checkpoint as ckpt
from gtopk_lab.training.simulator import simulate


def _cut_end(data: bytes) -> bytes:  # before its closing bracket, whatever whitespace follows
    return data[: max(len(data.rstrip()) - 1, 0)]


def _flip_middle(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]


#: label -> how a good file's bytes are damaged (a full disk, a cut copy, bit rot, a stray file)
DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda b: b"",
    "one-byte": lambda b: b[:1],
    "half": lambda b: b[: len(b) // 2],
    "end-cut": _cut_end,
    "garbage": lambda b: random.Random(0).randbytes(300),
    "nul-bytes": lambda b: b"\0" * 64,
    "not-utf8": lambda b: b"\xff\xfe" + b,
}
#: JSON files holding valid JSON of the wrong kind
JSON_VALUES: dict[str, bytes] = {"list": b"[1, 2]", "string": b'"x"', "null": b"null", "number": b"3"}


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line(text: str, path: Path) -> None:
    text = text.strip()
    assert text and "\n" not in text, f"not one line: {text!r}"
    assert path.name in text, f"does not name {path.name}: {text!r}"
    assert "Traceback" not in text and len(text) > len(str(path)) + 10, f"says nothing of what is wrong: {text!r}"


def _damages(json_file: bool) -> dict[str, bytes | Callable[[bytes], bytes]]:
    return {**DAMAGE, **(JSON_VALUES if json_file else {})}


def _apply(path: Path, damage: bytes | Callable[[bytes], bytes]) -> None:
    path.write_bytes(damage if isinstance(damage, bytes) else damage(path.read_bytes()))


# --- checkpoints ------------------------------------------------------------------------------
RUN_ID = "victim"


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory) -> Path:
    """A failed simulated run of 2 ranks whose epoch-1 checkpoint is there (results folder)."""
    out = tmp_path_factory.mktemp("golden")
    config = RunConfig(method="gtopk", workers=2, density=0.05, model="mlp", dataset="synthetic",
                       train_samples=128, test_samples=32, batch_size=16, epochs=1, checkpoint=True,
                       run_id=RUN_ID)
    result = simulate(config, checkpoint_dir=store.checkpoint_folder(out, RUN_ID))
    store.write_run(out, config.replace(epochs=3), store.rows_to_frame(list(result.rows)),
                    store.run_summary(config.replace(epochs=3), None, status="failed", error="boom"))
    return out


def _copy(stored_run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "res"
    shutil.copytree(stored_run, out)
    return out


CHECKPOINT_FILES = {"latest.json": True, "epoch00001-rank00000.pt": False, "epoch00001-rank00001.pt": False}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(CHECKPOINT_FILES))
def test_a_damaged_checkpoint_stops_the_resume_in_one_line_and_nothing_is_written(stored_run, tmp_path, capsys, name):
    from gtopk_lab.cli import main

    damages = _damages(CHECKPOINT_FILES[name])
    if name.endswith(".pt"):
        damages["one-flipped-byte"] = _flip_middle
    else:  # valid JSON objects that are no checkpoint record
        for label, value in (("epoch-text", {"epoch": "1", "iteration": 4, "workers": 2}),
                             ("no-workers", {"epoch": 1, "iteration": 4}),
                             ("epoch-0", {"epoch": 0, "iteration": 4, "workers": 2})):
            damages[label] = json.dumps(value).encode()
    for label, damage in damages.items():
        out = _copy(stored_run, tmp_path / label)
        path = Path(store.checkpoint_folder(out, RUN_ID)) / name
        _apply(path, damage)
        before = _digest(out / RUN_ID)
        rc = main(["run", "--resume", RUN_ID, "--out", str(out), "--simulate", "--json"])
        err = capsys.readouterr().err
        assert rc == 2, f"{name} {label}: exit {rc}\n{err[-2000:]}"
        _one_line(err, path)
        assert _digest(out / RUN_ID) == before, f"{name} {label}: something was written"
        # the rank's own reader says the same in one line
        if name.endswith(".pt") and label != "one-flipped-byte":  # torch.load checks no CRC
            with pytest.raises(DamagedFile) as info:
                ckpt.load_rank_state(path.parent, 1, int(name[-4]))
            _one_line(str(info.value), path)


@pytest.mark.timeout(60)
def test_damaged_saved_rows_are_left_out_with_one_warning(stored_run, tmp_path, caplog):
    for label, damage in _damages(True).items():
        out = _copy(stored_run, tmp_path / label)
        folder = store.checkpoint_folder(out, RUN_ID)
        path = ckpt.rows_file(folder, 1, 1)
        _apply(path, damage)
        before = _digest(out / RUN_ID)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            rows = store.rows_on_resume(store.RunStore(out, RUN_ID).read_metrics(), folder, ckpt.read_latest(folder))
        [line] = [r.getMessage() for r in caplog.records]
        _one_line(line, path)
        assert len(rows) > 0 and _digest(out / RUN_ID) == before


# --- calibration JSON -------------------------------------------------------------------------
class _Measured:
    def __init__(self, value: dict) -> None:
        self.value = value

    def result(self):
        return self.value


class _FakeLab:  # calibration measures on lab.client: fixed answers here
    class client:  # noqa: N801
        @staticmethod
        def submit(task, *args, **kwargs):
            if task is calibration.merge_calibration_task:
                return _Measured({"merge_gamma_s_per_element": 2e-9})
            if task is calibration.selection_calibration_task:
                return _Measured({"selection_time_s": 3e-4, "k": 10, "host": "here"})
            return _Measured({"compute_time_s": 0.0125, "numel": 1000, "host": "here"})


@pytest.mark.timeout(60)
def test_a_damaged_calibration_json_is_moved_aside_with_one_warning_and_measured_again(tmp_path, caplog):
    config = RunConfig(model="mlp", dataset="synthetic")
    good = json.dumps({"entries": [{"workload": calibration.workload_key(config), "compute_time_s": 0.5,
                                    "numel": 1000}]}, indent=2).encode() + b"\n"
    damages = {**_damages(True),
               "entries-not-list": b'{"entries": 3}',
               "time-text": good.replace(b"0.5", b'"fast"'),
               "time-negative": good.replace(b"0.5", b"-1"),
               "no-workload": b'{"entries": [{"compute_time_s": 0.5}]}',
               "gamma-text": b'{"entries": [{"merge_workload": {}, "merge_gamma_s_per_element": "x"}]}',
               "selection-negative": b'{"entries": [{"selection_workload": {}, "selection_time_s": -1}]}'}
    for label, damage in damages.items():
        out = tmp_path / label
        out.mkdir()
        path = out / calibration.CALIBRATION_FILE
        path.write_bytes(good)
        _apply(path, damage)
        damaged = path.read_bytes()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            seconds = calibration.calibrated_compute_time_s(_FakeLab(), config, out)
        assert seconds == 0.0125, label  # measured again
        [line] = [r.getMessage() for r in caplog.records]
        _one_line(line, path)
        [aside] = [p for p in out.iterdir() if p.name.startswith("calibration.json.damaged-")]
        assert aside.read_bytes() == damaged, label  # kept as it was
    # the good file is read, not measured again
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / calibration.CALIBRATION_FILE).write_bytes(good)
    assert calibration.calibrated_compute_time_s(_FakeLab(), config, tmp_path / "good") == 0.5


@pytest.mark.timeout(60)
def test_a_damaged_network_calibration_file_fails_its_config_in_one_line(tmp_path):
    good = json.dumps({"model": {"name": "lan", "alpha_s": 5e-5, "beta_s_per_byte": 8e-9}}).encode()
    damages = {**_damages(True), "alpha-text": good.replace(b"5e-05", b'"fast"'),
               "beta-negative": good.replace(b"8e-09", b"-1"), "no-constants": b'{"name": "x"}'}
    for label, damage in damages.items():
        path = tmp_path / f"{label}.json"
        path.write_bytes(good)
        _apply(path, damage)
        damaged = path.read_bytes()
        with pytest.raises(ValueError) as info:
            RunConfig(bandwidth=str(path))
        _one_line(str(info.value), path)
        assert str(info.value).startswith("bandwidth="), info.value
        assert path.read_bytes() == damaged


# --- method plugin modules --------------------------------------------------------------------
GOOD_PLUGIN = """from gtopk_lab.methods import Method, register_method

register_method(Method(name="fuzz-{n}", selector="topk", collective="allgather",
                       description="a plugin method of the bad-file fuzz"))
"""


@pytest.mark.timeout(60)
def test_a_damaged_plugin_module_fails_in_one_line_naming_its_file_and_the_registry_stays(tmp_path, monkeypatch,
                                                                                        caplog):
    from gtopk_lab.methods import registry

    damages = {**DAMAGE,
               "raises": lambda b: b + b"\nraise RuntimeError('plugin is broken')\n",
               "imports-nothing-there": lambda b: b"import no_such_module_anywhere\n" + b,
               "takes-a-builtin-name": lambda b: b.replace(b'name="fuzz-', b'name="topk" or "')}
    monkeypatch.syspath_prepend(str(tmp_path))
    builtin = {name: registry.get_method(name) for name in registry.available_methods()}
    for n, (label, damage) in enumerate(damages.items()):
        module = f"bad_plugin_{n}"
        path = tmp_path / f"{module}.py"
        path.write_text(GOOD_PLUGIN.format(n=n))
        _apply(path, damage)
        damaged = path.read_bytes()
        importlib.invalidate_caches()
        monkeypatch.setenv(registry.PLUGINS_ENV, module)
        caplog.clear()
        try:
            with caplog.at_level(logging.WARNING):
                registry.load_plugins()
        except ValueError as exc:
            _one_line(str(exc), path)
        else:  # it imported (an empty file): one warning that it registered nothing
            [line] = [r.getMessage() for r in caplog.records]
            _one_line(line, path)
            assert label == "empty", label
        assert path.read_bytes() == damaged
        monkeypatch.delenv(registry.PLUGINS_ENV)
        assert {name: registry.get_method(name) for name in builtin} == builtin  # nothing replaced
        sys.modules.pop(module, None)
        # a module that registered before it failed leaves its method: later tests in this
        # process (the conformance matrix iterates the registry) must not see it
        for name in set(registry.available_methods()) - set(builtin):
            registry.unregister_method(name)


# --- the state a study resumes from -----------------------------------------------------------
@pytest.mark.timeout(60)
def test_damaged_live_run_files_and_point_records_are_one_line_each(tmp_path, caplog):
    config = RunConfig(method="topk", workers=1, max_iterations=2, run_id="live")
    rows = [{"kind": "iter", "rank": 0, "iteration": i, "train_loss": 1.0} for i in range(2)]
    heartbeat_damages = {**_damages(True), "time-text": b'{"heartbeat_unix_s": "now", "timeout_s": 10}',
                         "no-timeout": b'{"heartbeat_unix_s": 1.0}'}
    for kind, damages in (("heartbeat.json", heartbeat_damages), ("parts/part-000001.parquet", DAMAGE)):
        for label, damage in damages.items():
            out = tmp_path / kind.replace("/", "-") / label
            s = store.RunStore(out, "live")
            s.write_config(config)
            s.write_summary(store.run_summary(config, None, status="running"))
            write_heartbeat(s.path, 10.0)
            write_part(s.path, rows, 1)
            path = s.path / kind
            _apply(path, damage)
            before = _digest(s.path)
            with pytest.raises(store.DamagedRun) as info:
                store.read_run(s.path)
            assert info.value.file == kind
            _one_line(str(info.value), path)
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                assert store.completed_runs(out, move_damaged=True) == {}
            [line] = [r.getMessage() for r in caplog.records]
            _one_line(line, path)
            [aside] = [p for p in out.iterdir() if p.name.startswith("live.damaged-")]
            assert _digest(aside) == before  # moved aside whole
    for label, damage in {**_damages(True), "run-id-number": b'{"run_id": 3}'}.items():
        out = tmp_path / "points" / label
        locks.record_point(out, "abc", "some-run")
        path = out / locks.POINTS_DIR / "abc.json"
        _apply(path, damage)
        damaged = path.read_bytes()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert locks.point_record(out, "abc") is None  # the point runs again
        if label != "run-id-number":  # valid JSON, no run id: nothing to warn about
            [line] = [r.getMessage() for r in caplog.records]
            _one_line(line, path)
        assert path.read_bytes() == damaged
