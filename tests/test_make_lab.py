"""``make lab`` starts JupyterLab from the venv on notebooks/, bound to 127.0.0.1, the
quickstart first (issue 26 item 1).

The test runs the real target on a free port, with ``VENV`` pointed at the venv of the
interpreter running the tests (its install stamps marked old with ``make -o``, so nothing
is reinstalled: a dry run proves it first), waits until the server's ``/api/status``
answers with the token, checks what a person meets (the URL printed, the token required,
``/`` opening the quickstart, notebooks/ served), then stops the whole process group.
Every wait has a deadline; the group is killed whatever happens.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)
STAMPS = [VENV / ".installed", VENV / ".installed-dev"]
START_DEADLINE_S = 180.0  # a loaded 2-core box starts JupyterLab in ~10 s; a wide margin

pytestmark = [
    pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed"),
    pytest.mark.skipif(not (VENV / "bin" / "jupyter").exists(), reason="no jupyter in this venv"),
    pytest.mark.skipif(not all(s.exists() for s in STAMPS),
                       reason=f"{VENV} was not installed by the Makefile (no .installed stamps): "
                              "make lab would install into it"),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _make(port: int, *extra: str) -> list[str]:
    old = [f"--old-file={s}" for s in STAMPS]  # never remade: no install into this venv
    return ["make", "-C", str(ROOT), *old, *extra, "lab", f"VENV={VENV}", f"PORT={port}"]


def _get(url: str) -> tuple[int, str, str]:
    """(status, body, final URL) without following redirects."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, timeout=10) as resp:
            return resp.status, resp.read().decode(), resp.headers.get("Location", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace"), exc.headers.get("Location", "")


@pytest.mark.timeout(420)
def test_make_lab_serves_the_quickstart_on_localhost(tmp_path: Path) -> None:
    port = _free_port()
    dry = subprocess.run(_make(port, "-n"), capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "pip install" not in dry.stdout and "jupyter\" lab" in dry.stdout, dry.stdout

    token = secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_TOKEN=token, JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"))
    log_path = tmp_path / "lab.log"
    with open(log_path, "w") as log:
        # its own session: the group (make, jupyter, any kernel) is stopped as one
        proc = subprocess.Popen(_make(port), stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        status = None
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                code, body, _ = _get(f"http://127.0.0.1:{port}/api/status?token={token}")
                if code == 200:
                    status = json.loads(body)
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)
        log_text = log_path.read_text()
        assert status is not None, f"no /api/status within {START_DEADLINE_S:.0f} s " \
                                   f"(exit {proc.poll()}):\n{log_text[-3000:]}"
        assert {"started", "last_activity", "kernels"} <= set(status)
        # the token is required, and / opens the quickstart
        assert _get(f"http://127.0.0.1:{port}/api/status")[0] == 403
        code, _, location = _get(f"http://127.0.0.1:{port}/?token={token}")
        assert code == 302 and location.split("?")[0].endswith("/lab/tree/00_quickstart.ipynb")
        # what the terminal shows: our URL line, the server on 127.0.0.1, notebooks/ served
        ours = [ln for ln in log_text.splitlines() if ln.startswith("JupyterLab: ")]
        assert ours and f"http://127.0.0.1:{port}/lab/tree/00_quickstart.ipynb" in ours[0]
        assert f"http://127.0.0.1:{port}/lab" in log_text.split("is running at:", 1)[1]
        assert f"Serving notebooks from local directory: {ROOT / 'notebooks'}" in log_text
    finally:
        _stop_group(proc)
    assert proc.poll() is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _serving(port):
        time.sleep(0.5)
    assert not _serving(port), "the server still answers after its group was stopped"


def _serving(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return True
    except OSError:
        return False


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the group (Jupyter shuts its kernels down), SIGKILL to what is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    time.sleep(1.0)  # Jupyter's own shutdown after make is gone
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
