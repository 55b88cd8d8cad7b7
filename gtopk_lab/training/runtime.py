"""The runtime plumbing a rank runs on: device, threads, the clock compute is timed with, the
link model and the run's dataset (shared by real ranks, the simulator and calibration).

- :func:`resolve_device`: the configured device ("auto" = cuda:LOCAL_RANK when CUDA is there)
- :func:`limit_threads`: each rank's share of the host's cores when ranks share it
- :func:`rank_cpu_timer` / :func:`rank_clock_s`: compute is timed as the training thread's
  CPU time with one torch thread, the process's otherwise, synchronised wall time on CUDA
- :func:`network_of`: the run's :class:`~gtopk_lab.network.model.NetworkModel`
- :func:`run_dataset`: the run's dataset, checked against the model's input shape

Cost: O(1) each, except :func:`run_dataset` (loading or generating the data).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.network.model import NetworkModel, network_model
from gtopk_lab.training.data import Dataset, check_model_fits, load_dataset, validation_split

__all__ = ["resolve_device", "sync_device", "rank_cpu_timer", "rank_clock_s", "limit_threads", "network_of",
           "run_dataset"]


def resolve_device(config: RunConfig, device: torch.device | str | None = None) -> torch.device:
    """``device`` if given, else from ``config.device``: "auto" = cuda:LOCAL_RANK if available."""
    if device is not None:
        return torch.device(device)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if config.device == "cpu":
        return torch.device("cpu")
    if config.device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' is invalid here: torch sees no CUDA device; use 'auto' or 'cpu'")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_cpu_timer(device: torch.device) -> Callable[[], float]:
    """The clock a rank's compute is measured with: the training thread's CPU time when
    torch computes on that one thread (a Dask worker's other threads are not the rank's
    compute), else the process's CPU time (intra-op threads count too)."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.process_time


def rank_clock_s(device: torch.device) -> float:
    """Now on the clock compute is timed with: synchronised wall time on CUDA, else
    :func:`rank_cpu_timer`'s CPU time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return rank_cpu_timer(device)()


def limit_threads(ranks_per_host: int) -> None:
    """Give each rank its share of the cores when ranks would oversubscribe them."""
    cores = os.cpu_count() or 1
    if ranks_per_host > 1:
        threads = max(1, cores // ranks_per_host)
        if threads < torch.get_num_threads():
            torch.set_num_threads(threads)


def network_of(config: RunConfig) -> NetworkModel:
    """The configured link model: the process-wide cache of :func:`~gtopk_lab.network.model.network_model`
    (the parse RunConfig's validation already made)."""
    return network_model(config.bandwidth, config.latency)


def run_dataset(config: RunConfig) -> Dataset:
    """The run's dataset (every rank loads the same; each trains on its own shard), checked
    against the model's input shape."""
    model_kwargs = config.model_options.kwargs or {}
    dataset = load_dataset(config.dataset, model=config.model, train_samples=config.train_samples,
                           test_samples=config.test_samples, seed=config.seed, data_dir=config.data_dir,
                           num_classes=model_kwargs.get("vocab_size"),
                           # a GPT built with another context trains on windows of that length
                           seq_len=model_kwargs.get("block_size"),
                           tokenizer=config.model_options.tokenizer or "byte")
    if config.model_options.validation_fraction is not None:  # LR tuning: evaluate on held-out training data
        dataset = validation_split(dataset, config.model_options.validation_fraction, config.seed)
    check_model_fits(config.model, dataset)
    return dataset
