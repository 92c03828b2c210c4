"""Request metrics of the service, kept and exposed by ``prometheus_client``.

Every :class:`Metrics` has its own ``CollectorRegistry`` (several applications
can live in one process, as in the tests). With ``qkm serve --workers N`` the
runner sets ``PROMETHEUS_MULTIPROC_DIR`` before the workers start, so
prometheus_client keeps the values in files there and ``/metrics`` answers for
all workers at once (counters and histograms summed; the in-flight gauge
summed over live workers). With one worker the values live in memory, and the
standard ``process_*`` metrics of the process are added.
"""

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, values
from prometheus_client.exposition import choose_encoder

__all__ = ["Metrics", "LATENCY_BUCKETS", "ROW_BUCKETS", "CONTENT_TYPE", "MULTIPROC_ENV", "multiprocess_mode"]

#: Content type of the Prometheus text exposition format (the answer of ``/metrics`` to a plain Accept header).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: The environment variable that turns prometheus_client's multiprocess mode on (read when it is imported).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

#: Upper bounds (seconds) of the request latency histogram.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: Upper bounds of the rows-per-request histogram.
ROW_BUCKETS = tuple(float(2**i) for i in range(0, 15, 1))


def multiprocess_mode():
    """Whether prometheus_client keeps its values in ``PROMETHEUS_MULTIPROC_DIR`` files (set before its import)."""
    return values.ValueClass is not values.MutexValue


class Metrics:
    """Counters, histograms and gauges of one worker, in their own registry.

    Parameters
    ----------
    info : dict
        Labels of the constant ``qkm_model_info`` gauge (model name, kind, K, D, backend, checksum).

    Examples
    --------
    >>> m = Metrics({"name": "demo"})
    >>> m.observe_request("/assign", 200, 0.002)
    >>> m.observe_rows("/assign", 3)
    >>> text = m.render()[0].decode()
    >>> 'qkm_requests_total{endpoint="/assign",status="200"} 1.0' in text
    True
    >>> 'qkm_rows_total{endpoint="/assign"} 3.0' in text
    True
    """

    def __init__(self, info=None):
        self.multiprocess = multiprocess_mode()
        self.registry = registry = CollectorRegistry()
        self._requests = Counter("qkm_requests", "HTTP requests answered, by endpoint (route template) and "
                                 "status code.", ["endpoint", "status"], registry=registry)
        self._latency = Histogram("qkm_request_duration_seconds", "Time from request start to the end of the "
                                  "response.", ["endpoint"], buckets=LATENCY_BUCKETS, registry=registry)
        self._rows = Counter("qkm_rows", "Rows answered (assigned, searched or featurised), by endpoint.",
                             ["endpoint"], registry=registry)
        self._batch_rows = Histogram("qkm_batch_rows", "Rows per answered inference request.", ["endpoint"],
                                     buckets=ROW_BUCKETS, registry=registry)
        self.in_flight = Gauge("qkm_in_flight_requests", "Inference requests being read, queued or computed "
                               "(summed over the live workers).", registry=registry, multiprocess_mode="livesum")
        self._workers = Gauge("qkm_workers", "Live worker processes serving the model.", registry=registry,
                              multiprocess_mode="livesum")
        self._workers.set(1)
        info = {name: str(value) for name, value in sorted((info or {}).items())}
        model_info = Gauge("qkm_model_info", "The model the workers serve (always 1).", list(info),
                           registry=registry, multiprocess_mode="max")
        (model_info.labels(**info) if info else model_info).set(1)
        if not self.multiprocess:  # process_cpu_seconds_total, memory, open fds, start time of this process
            ProcessCollector(registry=registry)
        self._children = {}

    def follow_in_flight(self, count):
        """Let the in-flight gauge read ``count()`` when scraped; the gauge to update per request, or None.

        With one process the gauge calls ``count`` at each scrape (nothing to
        do per request); in multiprocess mode it is returned, to be moved by
        ``inc``/``dec`` (its values live in files summed over the live workers).
        """
        if self.multiprocess:
            return self.in_flight
        self.in_flight.set_function(count)
        return None

    def _child(self, metric, *labels):
        """The labelled child of ``metric`` (cached: ``labels()`` costs a lock and a dict lookup)."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_request(self, endpoint, status, seconds):
        """One answered request: its route template, status code and duration."""
        self._child(self._requests, endpoint, str(int(status))).inc()
        self._child(self._latency, endpoint).observe(seconds)

    def observe_rows(self, endpoint, n_rows):
        """Rows answered by one inference request."""
        self._child(self._rows, endpoint).inc(n_rows)
        self._child(self._batch_rows, endpoint).observe(n_rows)

    def render(self, accept=None):
        """``(body, content type)`` of every metric: Prometheus text, or OpenMetrics if ``accept`` asks for it.

        In multiprocess mode the values of all workers (read from their files) are answered.
        """
        registry = self.registry
        if self.multiprocess:
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        encoder, content_type = choose_encoder(accept)
        return encoder(registry), content_type

    def close(self):
        """Forget this process's live gauges (multiprocess mode): called when the worker stops."""
        if self.multiprocess:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid())
