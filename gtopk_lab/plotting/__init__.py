"""Client-side plotting for gtopk-lab (never imported by worker code).

- :mod:`gtopk_lab.plotting.figures`  pure builders: metrics / summaries DataFrames -> ``go.Figure``
- :mod:`gtopk_lab.plotting.live`     ``FigureWidget`` views that follow running ``RunHandle`` s,
  with a static fallback when no widget front end is attached (``GTOPK_LAB_STATIC=1``)
- :mod:`gtopk_lab.plotting.controls` the ipywidgets control panel over a ``Lab``

Nothing is imported here, so ``import gtopk_lab.plotting.figures`` pulls in plotly and
pandas only (no ipywidgets, IPython or Dask).
"""
