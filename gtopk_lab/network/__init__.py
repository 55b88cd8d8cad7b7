"""Network model (alpha-beta-gamma), virtual time / throttling and calibration.

- :mod:`~gtopk_lab.network.model`: :class:`NetworkModel`, string parsing, presets,
  closed-form collective times;
- :mod:`~gtopk_lab.network.clock`: :class:`VirtualClock` around every collective;
- :mod:`~gtopk_lab.network.calibrate`: ping-pong alpha/beta fit, gamma of merges;
- :mod:`~gtopk_lab.analysis.predict`: predicted scaling efficiency per method.

Worker-side package: no plotting or notebook imports. ``clock`` and ``calibrate`` import
torch lazily through their own modules; importing this package only loads the model.
"""

from __future__ import annotations

from gtopk_lab.network.model import DEFAULT_NETWORK, PRESETS, NetworkModel

__all__ = ["DEFAULT_NETWORK", "NetworkModel", "PRESETS"]
