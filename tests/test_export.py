"""save_figure / save_figures (gtopk_lab.plotting.export): PNG, SVG and PDF through kaleido
and the system's Chromium, checked by their magic bytes and SVG root; one clear line when
kaleido or a browser is missing."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import plotly.graph_objects as go
import pytest

from gtopk_lab.plotting import export
from gtopk_lab.plotting.export import browser_path, save_figure, save_figures

pytestmark = pytest.mark.timeout(120)


def _figure() -> go.Figure:
    return go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2], name="run")).update_layout(title="small")


def _needs_browser() -> None:
    pytest.importorskip("kaleido")
    if not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) \
            and not Path("/usr/bin/chromium").exists():
        pytest.skip("no chromium (apt-get install chromium)")


def test_png_svg_pdf_and_html_in_one_browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_browser()
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    fig = _figure()
    paths = save_figures([(fig, tmp_path / "a.png"), (fig, tmp_path / "sub" / "a.svg"),
                          (fig, tmp_path / "a.pdf"), (fig, tmp_path / "a.html")], width=400, height=300, scale=2)
    assert [p.name for p in paths] == ["a.png", "a.svg", "a.pdf", "a.html"]
    png = (tmp_path / "a.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # IHDR: width and height are the 4-byte big-endian ints at 16 and 20 (400 x 300 at scale 2)
    assert int.from_bytes(png[16:20], "big") == 800 and int.from_bytes(png[20:24], "big") == 600
    svg = (tmp_path / "sub" / "a.svg").read_text(encoding="utf-8")
    assert svg.startswith("<svg") and 'xmlns="http://www.w3.org/2000/svg"' in svg and "small" in svg
    assert (tmp_path / "a.pdf").read_bytes()[:5] == b"%PDF-"
    assert "plotly" in (tmp_path / "a.html").read_text(encoding="utf-8")[:2000].lower()
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind
    one = save_figure(fig, tmp_path / "b.svg")
    assert one.read_text(encoding="utf-8").startswith("<svg")


def test_bad_arguments_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"path='.*a\.jpg' is invalid: expected a name ending in \.png"):
        save_figure(_figure(), tmp_path / "a.jpg")
    with pytest.raises(ValueError, match="width=5 is invalid"):
        save_figure(_figure(), tmp_path / "a.png", width=5)
    with pytest.raises(ValueError, match="scale=0 is invalid"):
        save_figure(_figure(), tmp_path / "a.png", scale=0)


def test_missing_browser_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("kaleido")
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chrome"))
    with pytest.raises(RuntimeError, match="BROWSER_PATH=.*no-chrome.* is not an executable browser") as err:
        save_figure(_figure(), tmp_path / "a.png")
    assert "\n" not in str(err.value)
    monkeypatch.delenv("BROWSER_PATH")
    monkeypatch.setattr(export.shutil, "which", lambda name: None)
    monkeypatch.setattr(export, "_FALLBACKS", ())
    with pytest.raises(RuntimeError, match="no Chromium found to export figures") as err:
        browser_path()
    assert "\n" not in str(err.value)
    assert not (tmp_path / "a.png").exists()
    # HTML needs neither
    assert save_figure(_figure(), tmp_path / "a.html").exists()


def test_missing_kaleido_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kaleido", None)  # import kaleido -> ImportError
    with pytest.raises(RuntimeError, match=r"kaleido is not installed: pip install 'gtopk-lab\[export\]'"):
        save_figure(_figure(), tmp_path / "a.png")


def test_a_render_before_kaleidos_page_is_ready_is_tried_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kaleido's tab not yet ready (ReferenceError: kaleido_scopes is not defined, seen once under
    load) costs another try; any other error is one line at once."""
    _needs_browser()
    from kaleido.errors import JavascriptError

    real_run, calls = export._run, []

    def flaky_once(coroutine_function):
        calls.append(1)
        if len(calls) == 1:
            raise JavascriptError("{'description': 'ReferenceError: kaleido_scopes is not defined'}")
        return real_run(coroutine_function)

    monkeypatch.setattr(export, "_run", flaky_once)
    [path] = save_figures([(_figure(), tmp_path / "a.png")])
    assert len(calls) == 2 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def broken(coroutine_function):
        calls.append(1)
        raise JavascriptError("{'description': 'TypeError: x is not a function'}")

    calls.clear()
    monkeypatch.setattr(export, "_run", broken)
    with pytest.raises(RuntimeError, match="kaleido could not render") as info:
        save_figures([(_figure(), tmp_path / "b.png")])
    assert len(calls) == 1 and "\n" not in str(info.value)
