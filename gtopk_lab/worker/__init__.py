"""Worker side of a Dask run: the function each Dask worker runs for one rank
(:mod:`~gtopk_lab.worker.rank_task`). Never imports client-side code."""
