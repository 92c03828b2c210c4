"""Run the service under uvicorn (what ``qkm serve`` calls).

With one worker the application is built in this process and handed to
uvicorn. With several, uvicorn spawns fresh worker processes that each call
:func:`app_from_env`, which reads the settings from the environment and loads
the model itself, after the process started (no model, thread pool or
onnxruntime session is ever shared across a fork). In both cases the model is
first loaded once here, so that a missing or broken file fails at once with a
clear message instead of inside a worker.

With several workers, ``/metrics`` must answer for all of them:
:func:`run` points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh temporary directory
(unless it is set already) before the workers start, so prometheus_client in
each keeps its values in files there; the directory is removed when the server
stops.

SIGINT and SIGTERM stop the server gracefully (no new connections, in-flight
requests finish, at most ``graceful_timeout`` seconds) and :func:`run` then
returns normally, so ``qkm serve`` exits with status 0.
"""

import contextlib
import inspect
import logging
import os
import shutil
import signal
import socket
import tempfile

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from .app import create_app
from .backend import load_model_file
from .metrics import MULTIPROC_ENV
from .settings import ServeSettings

__all__ = ["run", "app_from_env", "NoDelayHTTPProtocol", "WORKER_HEALTHCHECK_SECONDS"]

log = logging.getLogger("qkm.serve")

#: Seconds a worker may take to answer uvicorn's health ping before it is killed and restarted. uvicorn's
#: default, 5 s, can be shorter than a worker's start: a spawned worker first re-imports ``qkm.cli`` (numpy,
#: scipy, scikit-learn, numba) before its ping thread runs (see docs/decisions.md, 'Worker health check').
WORKER_HEALTHCHECK_SECONDS = 60


class NoDelayHTTPProtocol(AutoHTTPProtocol):
    """uvicorn's HTTP protocol with ``TCP_NODELAY`` on every connection.

    With ``--workers N`` uvicorn binds the listening socket itself, with
    ``proto=0``, so asyncio does not set ``TCP_NODELAY`` on the accepted
    connections; the headers and body of a response then leave as two
    segments and Nagle's algorithm holds the second until the client's
    delayed ACK: 40 ms per request on Linux. Setting it here fixes that.
    """

    def connection_made(self, transport):
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - closed already
                pass
        super().connection_made(transport)


def _log_config():
    """uvicorn's logging configuration, plus the ``qkm.serve`` logger on uvicorn's handler."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["qkm.serve"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


def _stopped(signum, frame):
    log.info("qkm serve: stopped by %s", signal.Signals(signum).name)


def app_from_env():
    """uvicorn application factory of a worker: the app of the :class:`ServeSettings` in the environment."""
    return create_app(settings=ServeSettings.from_env())


def run(settings, *, host="127.0.0.1", port=8000, workers=1, log_level="info", access_log=True,
        graceful_timeout=10.0):
    """Serve ``settings.model_path`` until SIGINT or SIGTERM.

    Parameters
    ----------
    settings : ServeSettings
    host : str, default="127.0.0.1"
        Interface to listen on (loopback by default; ``0.0.0.0`` for all).
    port : int, default=8000
        TCP port (0: any free port, printed in the log).
    workers : int, default=1
        Worker processes, each with its own copy of the model.
    log_level : str, default="info"
    access_log : bool, default=True
        uvicorn's access log: one line per request with method, path and
        status (never headers or bodies).
    graceful_timeout : float, default=10.0
        Seconds in-flight requests get to finish after a stop signal.
    """
    import uvicorn

    model = load_model_file(settings.model_path, settings.trust_pickle)  # fail here, with a clear message
    options = dict(host=host, port=port, log_level=log_level, access_log=access_log,
                   timeout_graceful_shutdown=graceful_timeout, log_config=_log_config(),
                   http="qkm.serve.runner:NoDelayHTTPProtocol")
    metrics_dir = None
    if workers == 1:
        target = create_app(model, settings=settings)
    else:
        del model  # each worker loads its own
        os.environ.update(settings.to_env())
        if not os.environ.get(MULTIPROC_ENV):  # prometheus_client's multiprocess mode, read by each new worker
            metrics_dir = os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="qkm-serve-metrics-")
        target = "qkm.serve.runner:app_from_env"
        options.update(factory=True, workers=workers)
        if "timeout_worker_healthcheck" in inspect.signature(uvicorn.Config).parameters:  # uvicorn >= 0.30
            options["timeout_worker_healthcheck"] = WORKER_HEALTHCHECK_SECONDS
    # uvicorn re-raises the stop signal once it has shut down gracefully; these no-op handlers take it, so a
    # requested stop ends with status 0 instead of a KeyboardInterrupt traceback or death by SIGTERM.
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.run(target, **options)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if metrics_dir is not None:
            with contextlib.suppress(KeyError):
                del os.environ[MULTIPROC_ENV]
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0
