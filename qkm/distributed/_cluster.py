"""Connecting to a Dask cluster: ``local:N`` or ``tcp://HOST:PORT``, with version checks (private)."""

import contextlib

__all__ = ["connect", "check_versions", "SchedulerUnreachable", "VersionMismatch"]


class SchedulerUnreachable(ConnectionError):
    """The Dask scheduler could not be reached."""


class VersionMismatch(RuntimeError):
    """The client and the workers run different versions of qkm or of its numeric stack."""


def local_versions():
    """Versions that must agree between the client and every worker for identical results."""
    import platform

    import numba
    import numpy
    import scipy

    from .._version import __version__

    return {"qkm": __version__, "numpy": numpy.__version__, "scipy": scipy.__version__,
            "numba": numba.__version__, "python": platform.python_version()}


def _worker_versions():
    from qkm.distributed._cluster import local_versions

    return local_versions()


def check_versions(client, expected=None):
    """Raise :class:`VersionMismatch` unless every worker runs what the client runs.

    Dask's own check (``get_versions(check=True)``) covers dask, distributed
    and their serialisation stack; this one adds qkm and the numeric packages
    whose last bits decide results.
    """
    try:
        client.get_versions(check=True)
    except ValueError as exc:
        raise VersionMismatch(f"Dask versions differ between the client and the cluster: {exc}") from exc
    mine = local_versions() if expected is None else expected
    try:
        theirs = client.run(_worker_versions)
    except (ImportError, ModuleNotFoundError) as exc:  # pragma: no cover - raised remotely
        raise VersionMismatch(f"qkm is not importable on every worker: {exc}") from exc
    bad = {w: {k: (mine[k], v.get(k)) for k in mine if v.get(k) != mine[k]} for w, v in theirs.items()}
    bad = {w: d for w, d in bad.items() if d}
    if bad:
        lines = "; ".join(f"{w}: " + ", ".join(f"{k} {c} here, {r} there" for k, (c, r) in d.items())
                          for w, d in sorted(bad.items()))
        raise VersionMismatch(f"workers run other versions than this client ({lines}); install the same "
                              "qkm, numpy, scipy and numba everywhere.")
    if not theirs:
        raise SchedulerUnreachable("the Dask cluster has no workers.")


@contextlib.contextmanager
def connect(scheduler, *, timeout=10, threads_per_worker=1):
    """A ``distributed.Client`` for ``scheduler``; a local cluster is closed on exit.

    Parameters
    ----------
    scheduler : str
        ``"local"`` / ``"local:N"``: a new ``LocalCluster`` of N worker
        processes (default 2) listening on 127.0.0.1 only, no dashboard;
        ``"tcp://HOST:PORT"`` (or ``HOST:PORT``): an existing scheduler.
    timeout : float, default=10
        Seconds to wait for the scheduler.
    """
    from distributed import Client, LocalCluster

    scheduler = str(scheduler)
    cluster = None
    try:
        if scheduler == "local" or scheduler.startswith("local:"):
            n = scheduler.partition(":")[2] or "2"
            if not n.isdigit() or int(n) < 1:
                raise ValueError(f"--scheduler local:N needs N >= 1 workers; got {scheduler!r}.")
            cluster = LocalCluster(n_workers=int(n), threads_per_worker=threads_per_worker, processes=True,
                                   host="127.0.0.1", dashboard_address=None, worker_dashboard_address=None)
            client = Client(cluster, timeout=timeout)
        else:
            address = scheduler if "://" in scheduler else "tcp://" + scheduler
            try:
                client = Client(address, timeout=timeout)
            except (OSError, TimeoutError) as exc:
                raise SchedulerUnreachable(f"cannot reach the Dask scheduler at {address} within {timeout} s "
                                           f"({type(exc).__name__}: {exc}).") from exc
    except BaseException:
        if cluster is not None:
            cluster.close()
        raise
    try:
        check_versions(client)
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
