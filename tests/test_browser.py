"""Real-browser test: JupyterLab + headless Chromium run 00_quickstart and watch it live.

Starts the venv's JupyterLab on 127.0.0.1 (free port, random token, a temporary root dir
holding a copy of the quickstart notebook with a run long enough to watch), opens the
notebook in Debian's ``chromium`` driven by Playwright, runs all cells, and asserts that
the plotly figure appears and that its number of points grows while the run is live: the
``FigureWidget`` path of gtopk_lab.plotting.live, end to end through the widget manager.
A screenshot goes to test-artifacts/ (gitignored).

Skipped when no ``chromium`` is on PATH (CI's .ci/run installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: The quickstart's parameters for this test: a 2-rank run that lasts at least ~8 s however
#: fast the machine is (throttled to a 40 ms-latency link: 200 iterations x >= 40 ms), so the
#: live figure has time to grow on screen. Throttling sleeps, so it costs no CPU.
LIVE_PARAMETERS = {"n_workers": 2, "workers": 2, "method": "gtopk", "density": 0.01, "model": "mlp",
                   "epochs": 4, "train_samples": 4000, "max_iterations": 200, "sink_every": 2,
                   "bandwidth": "1Gbps", "latency": "40ms", "throttle": True}

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _notebook_copy(root: Path) -> Path:
    """The quickstart with LIVE_PARAMETERS written into its parameters cell."""
    nb = nbformat.read(ROOT / "notebooks" / "00_quickstart.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    values = {**LIVE_PARAMETERS, "out": str(root / "results")}
    cell.source += "\n# test_browser overrides\n" + "\n".join(f"{k} = {v!r}" for k, v in values.items())
    path = root / "00_quickstart.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture()
def jupyter_lab(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(url with token, root dir) of a JupyterLab server started for this test only."""
    root = tmp_path / "root"
    root.mkdir()
    _notebook_copy(root)
    port, token = _free_port(), os.urandom(16).hex()
    env = {k: v for k, v in os.environ.items() if k not in ("GTOPK_LAB_STATIC", "GTOPK_LAB_LIVE")}
    env.update(JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
           f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}", "--LabApp.extension_manager=readonly",
           "--ServerApp.terminals_enabled=False"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI containers run as root
        cmd.append("--allow-root")
    log = open(tmp_path / "jupyter.log", "wb")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    json.load(r)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    raise RuntimeError("JupyterLab did not start:\n"
                                       + (tmp_path / "jupyter.log").read_text()[-3000:]) from None
                time.sleep(0.5)
        yield f"{base}/lab/tree/00_quickstart.ipynb?token={token}&reset", root
    finally:
        # The server, its kernel and the kernel's Dask processes share this session.
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        log.close()


_COUNT_POINTS = """() => Array.from(document.querySelectorAll('.jp-OutputArea .js-plotly-plot'))
    .map(div => (div.data || []).reduce((n, t) => n + (t.x ? t.x.length : 0), 0))"""


@pytest.mark.timeout(240)
def test_quickstart_live_figure_grows_in_jupyterlab(jupyter_lab: tuple[str, Path], tmp_path: Path) -> None:
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install chromium; .ci/run does this)")
    sync_api = pytest.importorskip("playwright.sync_api")
    url, root = jupyter_lab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            page.goto(url, timeout=90_000)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell"
                                   " && document.querySelector('.jp-Notebook .jp-Cell')", timeout=90_000)
            # wait for the kernel to be ready, then run every cell
            page.wait_for_function("""() => {
                const w = window.jupyterapp.shell.currentWidget;
                const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
                return k && k.status === 'idle';
            }""", timeout=90_000)
            # (not awaited: the command's promise resolves only when every cell has run)
            # The widget manager asks the kernel for its widgets (comm_info_request, a shell
            # message) once the kernel connects. Queued behind "run all"'s blocking cells it
            # would be answered only at the end, and no widget would render while the run is
            # live. Our own request returns after the manager's (shell messages are FIFO).
            page.evaluate("""async () => {
                const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
                await k.requestCommInfo({target_name: 'jupyter.widget'});
            }""")
            page.wait_for_timeout(1000)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            try:
                page.wait_for_selector(".jp-OutputArea .js-plotly-plot", timeout=120_000)
            except sync_api.TimeoutError:
                page.screenshot(path=str(ARTIFACTS / "browser_quickstart_failure.png"), full_page=True)
                outputs = page.evaluate("() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
                                        ".map(e => e.innerText.slice(0, 300))")
                log = (tmp_path / "jupyter.log").read_text()[-2000:]
                raise AssertionError(f"no plotly figure appeared; outputs: {outputs}\njupyter log: {log}") from None
            samples: list[tuple[float, int]] = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                counts = page.evaluate(_COUNT_POINTS)
                samples.append((time.monotonic(), max(counts) if counts else 0))
                growth = sorted({n for _, n in samples if n > 0})
                if len(growth) >= 3:
                    break
                page.wait_for_timeout(200)
            page.screenshot(path=str(ARTIFACTS / "browser_quickstart.png"), full_page=True)
            distinct = sorted({n for _, n in samples if n > 0})
            assert len(distinct) >= 2, f"the live figure did not grow: point counts {samples}"
            firsts = [n for _, n in samples if n > 0]
            assert firsts == sorted(firsts), f"point counts went down: {firsts}"
            # the run then completes and the notebook's last cells run
            page.wait_for_function("""() => {
                const w = window.jupyterapp.shell.currentWidget;
                const k = w.sessionContext.session.kernel;
                return k.status === 'idle' && w.content.widgets.every(c => c.model.type !== 'code'
                    || (c.model.executionCount !== null));
            }""", timeout=150_000)
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
                                  " :text('Traceback')").count()
            page.screenshot(path=str(ARTIFACTS / "browser_quickstart_done.png"), full_page=True)
            assert errors == 0
        finally:
            context.close()
