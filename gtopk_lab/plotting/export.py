"""Figures to files: PNG, SVG and PDF through kaleido and the system's Chromium, HTML without.

Kaleido 1.x renders a figure in a headless Chrome-family browser it drives (through
choreographer), with the plotly.js of the installed plotly package and no MathJax, so
nothing is fetched from the network.

:func:`save_figures` (and :func:`save_figure`, one figure):

1. the format of each path from its suffix (``.png``, ``.svg``, ``.pdf``, ``.html``);
   anything else is a ``ValueError`` naming the path
2. ``.html`` is written by plotly itself (plotly.js inlined: the file opens offline)
3. for the others: kaleido must be importable (else one ``RuntimeError`` line: install the
   ``export`` extra) and a browser found (:func:`browser_path`: ``$BROWSER_PATH``, then
   chromium / chromium-browser / google-chrome on PATH, then ``/usr/bin/chromium``; else
   one ``RuntimeError`` line saying how to get one)
4. every figure is rendered by one browser started once (about 2-3 s on 2 cores, then
   tens of milliseconds per figure); each file is written atomically (temp + replace)

Example::

    from gtopk_lab.plotting.export import save_figure
    save_figure(fig, "figures/efficiency.png", width=1000, height=500, scale=2)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import plotly.graph_objects as go

__all__ = ["FORMATS", "browser_path", "save_figure", "save_figures"]

#: Suffixes save_figure writes -> the format kaleido is asked for (None: plotly's HTML).
FORMATS: dict[str, str | None] = {".png": "png", ".svg": "svg", ".pdf": "pdf", ".html": None}
_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
_FALLBACKS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/snap/bin/chromium")


def browser_path() -> str:
    """The Chrome-family browser kaleido drives (module docstring, step 3); ``RuntimeError``
    in one line when there is none."""
    env = os.environ.get("BROWSER_PATH")
    if env:
        if Path(env).is_file() and os.access(env, os.X_OK):
            return env
        raise RuntimeError(f"BROWSER_PATH={env!r} is not an executable browser: point it at Chromium or Chrome "
                           "(e.g. /usr/bin/chromium) to export figures")
    for name in _BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    for path in _FALLBACKS:
        if Path(path).is_file() and os.access(path, os.X_OK):
            return path
    raise RuntimeError("no Chromium found to export figures: install one (apt-get install chromium) or set "
                       "BROWSER_PATH=/path/to/chrome")


def _kaleido():  # -> module; lazy: kaleido is an optional extra and starts nothing on import
    try:
        import kaleido
    except ImportError as exc:
        raise RuntimeError("kaleido is not installed: pip install 'gtopk-lab[export]' (kaleido>=1) to export "
                           "figures as PNG, SVG or PDF") from exc
    return kaleido


def _formats(paths: Sequence[Path]) -> list[str | None]:
    formats = []
    for path in paths:
        suffix = path.suffix.lower()
        if suffix not in FORMATS:
            raise ValueError(f"path={str(path)!r} is invalid: expected a name ending in "
                             f"{', '.join(FORMATS)}")
        formats.append(FORMATS[suffix])
    return formats


#: Renders tried when kaleido's page had not defined its functions yet (see _page_not_ready).
RENDER_ATTEMPTS = 3


def _page_not_ready(exc: BaseException) -> bool:
    """kaleido 1.x evaluated its render call before the browser tab had run kaleido's own
    scripts (``ReferenceError: kaleido_scopes is not defined``): seen once on a 2-core box
    with two busy loops beside it; a fresh browser renders the same figure."""
    text = str(exc)
    return "JavascriptError" in type(exc).__name__ and "is not defined" in text and "kaleido" in text


def save_figures(items: Sequence[tuple[go.Figure, str | os.PathLike[str]]], *, width: int | None = None,
                 height: int | None = None, scale: float = 1.0) -> list[Path]:
    """Write each ``(figure, path)`` (module docstring, steps 1-4); returns the paths.

    ``width`` / ``height``: pixels (default: the figure's layout, else kaleido's 700 x 500);
    ``scale``: PNG resolution multiplier."""
    for name, value in (("width", width), ("height", height)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 10):
            raise ValueError(f"{name}={value!r} is invalid: expected pixels, an int >= 10")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 10:
        raise ValueError(f"scale={scale!r} is invalid: expected a number in (0, 10]")
    figs = [fig if isinstance(fig, go.Figure) else go.Figure(fig) for fig, _ in items]
    paths = [Path(path) for _, path in items]
    formats = _formats(paths)
    images = [i for i, f in enumerate(formats) if f is not None]
    rendered: dict[int, bytes] = {}
    if images:
        kaleido = _kaleido()
        browser = browser_path()
        opts = {k: v for k, v in (("width", width), ("height", height), ("scale", scale)) if v is not None}
        kopts = {"mathjax": False, "path": browser}  # mathjax=False: no CDN; path: this browser

        async def render() -> None:
            async with kaleido.Kaleido(**kopts) as k:
                for i in images:
                    rendered[i] = await k.calc_fig(figs[i], opts={**opts, "format": formats[i]})

        for attempt in range(RENDER_ATTEMPTS):
            try:
                _run(render)
                break
            except Exception as exc:  # noqa: BLE001 - kaleido's own errors: one line naming the browser
                if attempt + 1 < RENDER_ATTEMPTS and _page_not_ready(exc):
                    rendered.clear()
                    continue
                raise RuntimeError(f"kaleido could not render with {browser}: {type(exc).__name__}: "
                                   f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from exc
    for i, path in enumerate(paths):
        path.parent.mkdir(parents=True, exist_ok=True)
        data = rendered[i] if i in rendered else figs[i].to_html(include_plotlyjs=True, full_html=True).encode()
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    return paths


def _run(coroutine_function) -> None:  # noqa: ANN001 - an async def of no arguments
    """Run it to its end, also where an event loop runs already (a Jupyter kernel): then in
    a thread of its own."""
    import asyncio
    import threading

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coroutine_function())
        return
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(coroutine_function())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target, name="gtopk-lab-export")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def save_figure(fig: go.Figure, path: str | os.PathLike[str], *, width: int | None = None,
                height: int | None = None, scale: float = 1.0) -> Path:
    """Write one figure to ``path`` (.png, .svg, .pdf or .html); see :func:`save_figures`."""
    return save_figures([(fig, path)], width=width, height=height, scale=scale)[0]
