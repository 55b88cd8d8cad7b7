"""What each worker sends: selection (selectors registry), merging of sparse vectors and
error-feedback residuals. Worker side, torch only.

- :mod:`.selection` — ``get_selector(name)``: topk, gaussiank, randomk, exactk-threshold
- :mod:`.merge` — ``index_dtype``, ``merge_sparse``, ``coalesce_sparse``
- :mod:`.residual` — ``ErrorFeedback`` with the "paper" and "mass" rules
"""

from __future__ import annotations

from gtopk_lab.compression.merge import coalesce_sparse, index_dtype, merge_sparse
from gtopk_lab.compression.residual import ErrorFeedback
from gtopk_lab.compression.selection import available_selectors, get_selector

__all__ = ["index_dtype", "merge_sparse", "coalesce_sparse", "ErrorFeedback", "get_selector",
           "available_selectors"]
