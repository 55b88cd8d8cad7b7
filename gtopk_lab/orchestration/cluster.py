"""The Dask side of a Lab: connecting, method plugins, and which workers a run may use.

Client side. What ``Lab.__init__`` and the Lab's monitor ask of the cluster:

1. **Connect** (:func:`connect`): an embedded ``LocalCluster`` (one process per worker,
   one thread each, everything on 127.0.0.1), or a ``Client`` to a scheduler address
   (``tcp://`` or ``tls://`` with a ``Security`` object or certificate files; an address
   that does not answer within the connect timeout raises :class:`SchedulerUnreachable`).
   The embedded cluster's workers fork from the preloaded forkserver of
   :mod:`~gtopk_lab.comm.process_start` (torch imported once, not once per worker) with
   the client's environment and working directory, unless Dask's
   ``multiprocessing-method`` or ``$GTOPK_LAB_START_METHOD`` asks otherwise. A script
   that would start the embedded cluster at its top level without a ``__main__`` guard
   ends with one line first (:mod:`~gtopk_lab.orchestration.script_guard`). A cluster
   whose event-loop thread misses distributed's 10 s start is started once more.
2. **Method plugins** (:func:`install_method_plugins`): the client's
   ``$GTOPK_LAB_METHODS`` modules are imported here first (a broken one fails on the
   client, with one line), single-file ones uploaded, and a worker plugin imports them
   on every worker before any rank starts (``gtopk_lab.worker.plugins``).
3. **Workers** (:func:`worker_info`): a fresh view of every worker and its resources.
4. **Eligibility** (:func:`wants_cuda`, :func:`eligible_workers`): a run wants CUDA when
   its config says so, or with ``device="auto"`` when there are P GPU workers (resource
   ``GPU >= 1``); CPU runs prefer CPU-only workers, so GPUs stay free for GPU runs.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

from gtopk_lab.config import RunConfig
from gtopk_lab.methods.registry import load_plugins, plugin_modules
from gtopk_lab.comm.process_start import child_state, process_context, start_method
from gtopk_lab.worker.plugins import ClientProcessState, MethodPlugins, single_file_plugins


class SchedulerUnreachable(ConnectionError):
    """The scheduler address could not be reached within the connect timeout."""


def security_from_files(tls_ca_file: str | None, tls_cert: str | None, tls_key: str | None) -> Any:
    """A ``Security`` for a ``tls://`` scheduler from the three files (or from the Dask
    config when it names them and no file is given); ValueError naming a missing one."""
    import dask.config
    from distributed.security import Security

    if tls_ca_file is None and tls_cert is None and tls_key is None \
            and dask.config.get("distributed.comm.tls.ca-file", None):
        # No files given, but the Dask config (e.g. cluster/dask/client.yaml in
        # DASK_CONFIG) names them: Security() reads it.
        return Security()
    for name, value in (("tls_ca_file", tls_ca_file), ("tls_cert", tls_cert), ("tls_key", tls_key)):
        if value is None:
            raise ValueError(f"{name}=None is invalid: a tls:// scheduler needs --tls-ca-file, "
                             "--tls-cert and --tls-key (or a Security object)")
        if not Path(value).is_file():
            raise ValueError(f"{name}={value!r} is invalid: no such file")
    return Security(tls_ca_file=tls_ca_file, tls_client_cert=tls_cert, tls_client_key=tls_key,
                    require_encryption=True)


def validate_scheduler_address(address: str) -> str:
    """``tcp://host:port`` / ``tls://host:port`` (``host:port`` means tcp); else ValueError."""
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"scheduler={address!r} is invalid: expected tcp://HOST:PORT or tls://HOST:PORT")
    address = address.strip()
    if "://" not in address:
        address = "tcp://" + address
    scheme, rest = address.split("://", 1)
    host, _, port = rest.rpartition(":")
    if scheme not in ("tcp", "tls") or not host or not port.isdigit() or not (0 < int(port) < 65536):
        raise ValueError(f"scheduler={address!r} is invalid: expected tcp://HOST:PORT or tls://HOST:PORT")
    return address


def connect(scheduler: str | None, n_workers: int | None, security: Any, *,
            tls_ca_file: str | None, tls_cert: str | None, tls_key: str | None,
            resources: dict[str, float] | None, connect_timeout_s: float) -> tuple[Any, Any]:
    """``(client, cluster)``: to ``scheduler``, or to a new embedded ``LocalCluster`` of
    ``n_workers`` (default 4) when it is None (``cluster`` is None for a scheduler)."""
    from distributed import Client

    if scheduler is None:
        import dask.config
        from distributed import LocalCluster

        from gtopk_lab.orchestration.script_guard import check_main_guard

        method = dask.config.get("distributed.worker.multiprocessing-method", "spawn")
        if method == "spawn" and start_method() == "forkserver":
            # Dask's default, not a choice: fork the workers from a server that imported
            # torch once (gtopk_lab.comm.process_start) instead of importing it per worker
            process_context()
            method = "forkserver"
        # one line instead of a page of spawn tracebacks for an unguarded script
        check_main_guard(method)
        state = child_state()
        # Dask's own pre-spawn variables (one OpenMP thread ...) keep precedence as with spawn
        pre_spawn = dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {}
        env = {k: v for k, v in state["env"].items() if k not in pre_spawn}
        with dask.config.set({"distributed.worker.multiprocessing-method": method}):
            cluster = _local_cluster(
                LocalCluster, n_workers=n_workers or 4, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address="127.0.0.1:0", resources=resources, silence_logs=logging.ERROR,
                security=security, env=env,
            )
        try:
            client = Client(cluster, security=security)
            client.register_plugin(ClientProcessState(state, sorted(pre_spawn)))
        except BaseException:
            cluster.close()
            raise
        return client, cluster
    address = validate_scheduler_address(scheduler)
    if address.startswith("tls://") and security is None:
        security = security_from_files(tls_ca_file, tls_cert, tls_key)
    try:
        return Client(address, security=security, timeout=connect_timeout_s), None
    except (OSError, TimeoutError) as exc:
        raise SchedulerUnreachable(
            f"scheduler={address!r} is unreachable within {connect_timeout_s:.0f} s: {exc}"
        ) from None


#: starts of an embedded cluster whose event-loop thread missed distributed's 10 s (the last one raises)
LOOP_START_TRIES = 2


def _loop_start_missed(exc: BaseException) -> bool:
    """Whether ``exc`` is distributed's ``LoopRunner`` giving up on its event-loop thread,
    which it waits for 10 s (a bare ``assert loop is not None`` in ``_start_unlocked``)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return isinstance(exc, AssertionError) and bool(frames) and frames[-1].name == "_start_unlocked"


def _local_cluster(factory: Any, **kwargs: Any) -> Any:
    """``factory(**kwargs)`` (a ``LocalCluster``), started again when its event-loop thread
    missed its 10 s: once in a whole suite on a 2-core box at load 5 (test_failures' Lab,
    which passes alone in 13 s); the last miss is a ``RuntimeError`` in one line."""
    for attempt in range(1, LOOP_START_TRIES + 1):
        try:
            return factory(**kwargs)
        except AssertionError as exc:
            if not _loop_start_missed(exc):
                raise
            if attempt == LOOP_START_TRIES:
                raise RuntimeError(f"the embedded Dask cluster's event loop did not start within 10 s, "
                                   f"{LOOP_START_TRIES} times: this machine is overloaded") from None
            logging.getLogger(__name__).warning("the embedded Dask cluster's event loop did not start "
                                                "within 10 s; starting it again")
    raise AssertionError("unreachable: the last attempt returns or raises")


def install_method_plugins(client: Any) -> None:
    """Make the client's ``$GTOPK_LAB_METHODS`` plugins importable and imported on every
    worker before any rank starts (gtopk_lab.worker.plugins)."""
    load_plugins()  # a broken plugin fails here, on the client, with one line
    modules = plugin_modules()
    if not modules:
        return
    for path in single_file_plugins(modules):
        # load=False: MethodPlugins imports it once; upload_file's own import would run a
        # module the workers already imported again, and its register_method refuse the name
        client.upload_file(path, load=False)
    client.register_plugin(MethodPlugins(modules))


def worker_info(client: Any) -> dict[str, dict[str, Any]]:
    """``{address: info}`` of all workers, fetched fresh from the scheduler.

    Not ``client.scheduler_info(n_workers=-1)``: that returns a cache which the
    client's periodic refresh (``n_workers=0``) may overwrite with an empty worker
    list between the fetch and the return, so live workers would look gone. A client that
    gave up on its scheduler raises :class:`SchedulerUnreachable` (not Dask's
    ``AttributeError`` on its dropped scheduler handle).
    """
    if getattr(client, "scheduler", None) is None or str(getattr(client, "status", "")) in ("closing", "closed"):
        raise SchedulerUnreachable(f"scheduler unreachable: the Dask client is "
                                   f"{getattr(client, 'status', 'closed')}")
    info = client.sync(client.scheduler.identity, n_workers=-1)
    return dict(info.get("workers", {}))


def is_gpu(info: dict[str, Any]) -> bool:
    """A GPU worker holds resource ``GPU >= 1``."""
    return float((info.get("resources") or {}).get("GPU", 0)) >= 1


def wants_cuda(config: RunConfig, workers: dict[str, dict[str, Any]]) -> bool:
    """Whether the run goes on GPU workers (``device="auto"``: when there are P of them)."""
    if config.device == "cuda":
        return True
    if config.device == "cpu":
        return False
    return sum(is_gpu(i) for i in workers.values()) >= config.workers


def eligible_workers(config: RunConfig, workers: dict[str, dict[str, Any]]) -> list[str]:
    """Workers the run may use, in the order they are picked."""
    if wants_cuda(config, workers):
        return sorted(a for a, i in workers.items() if is_gpu(i))
    # CPU runs prefer CPU-only workers so that GPUs stay free for GPU runs.
    return sorted(workers, key=lambda a: (is_gpu(workers[a]), a))
