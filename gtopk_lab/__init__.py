"""gtopk-lab: sparsified distributed SGD (dense, Top-k, gTop-k, GaussianK) on Dask."""

__version__ = "0.1.0"
