"""What a test's child process needs to be interrupted as a person would (not a test module).

A shell runs a background job (``make test &``, a CI step that backgrounds it) with SIGINT
ignored, its children inherit that, and Python keeps an inherited SIG_IGN instead of raising
KeyboardInterrupt: a test that sends SIGINT to a child would then see it ignored. Passed as
``preexec_fn``, :func:`interruptible` gives the child the default disposition back, which
Python turns into KeyboardInterrupt at start-up.
"""

from __future__ import annotations

import signal


def interruptible() -> None:
    """Runs in the child between fork and exec: SIGINT back to its default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
