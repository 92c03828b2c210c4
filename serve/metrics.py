"""Request metrics of one worker, rendered in the Prometheus text format (version 0.0.4).

Written by hand (the format is a few lines of text) so that the service needs
no Prometheus client library. All updates happen on the event loop thread, so
no lock is needed. Each uvicorn worker keeps its own counters; ``/metrics``
answers for the worker that takes the scrape (its ``pid`` is in ``qkm_worker_info``).
"""

import bisect
import math
import os
import time

__all__ = ["Histogram", "Metrics", "LATENCY_BUCKETS", "ROW_BUCKETS", "CONTENT_TYPE"]

#: Content type of the Prometheus text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Upper bounds (seconds) of the request latency histogram.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: Upper bounds of the rows-per-request histogram.
ROW_BUCKETS = tuple(float(2**i) for i in range(0, 15, 1))


def _escape(value):
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs):
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in pairs) + "}" if pairs else ""


def _number(value):
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if isinstance(value, float) else str(value)


class Histogram:
    """Observations counted into fixed buckets, with their sum (one label set).

    Examples
    --------
    >>> h = Histogram((1.0, 5.0))
    >>> for v in (0.5, 2.0, 7.0):
    ...     h.observe(v)
    >>> h.cumulative(), h.total, h.count
    ([(1.0, 1), (5.0, 2), (inf, 3)], 9.5, 3)
    """

    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value):
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self):
        """``[(upper bound, observations <= bound), ..., (inf, count)]``."""
        out, running = [], 0
        for bound, n in zip(self.bounds + (math.inf,), self.counts):
            running += n
            out.append((bound, running))
        return out


class Metrics:
    """Counters and histograms of the service.

    Parameters
    ----------
    info : dict
        Labels of the constant ``qkm_model_info`` gauge (model name, kind, K, D, backend, checksum).

    Examples
    --------
    >>> m = Metrics({"name": "demo"})
    >>> m.observe_request("/assign", 200, 0.002)
    >>> m.observe_rows("/assign", 3)
    >>> text = m.render()
    >>> 'qkm_requests_total{endpoint="/assign",status="200"} 1' in text
    True
    >>> 'qkm_rows_total{endpoint="/assign"} 3' in text
    True
    """

    def __init__(self, info=None):
        self.info = dict(info or {})
        self.requests = {}   # (endpoint, status) -> count
        self.latency = {}    # endpoint -> Histogram
        self.rows = {}       # endpoint -> rows answered
        self.batch_rows = {}  # endpoint -> Histogram
        self.in_flight = 0
        self.started = time.time()

    def observe_request(self, endpoint, status, seconds):
        key = (endpoint, int(status))
        self.requests[key] = self.requests.get(key, 0) + 1
        hist = self.latency.get(endpoint)
        if hist is None:
            hist = self.latency[endpoint] = Histogram(LATENCY_BUCKETS)
        hist.observe(seconds)

    def observe_rows(self, endpoint, n_rows):
        self.rows[endpoint] = self.rows.get(endpoint, 0) + int(n_rows)
        hist = self.batch_rows.get(endpoint)
        if hist is None:
            hist = self.batch_rows[endpoint] = Histogram(ROW_BUCKETS)
        hist.observe(n_rows)

    def render(self):
        """All metrics in the Prometheus text format."""
        lines = []

        def family(name, kind, help_text):
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")

        def histogram(name, hists):
            for endpoint, hist in sorted(hists.items()):
                for bound, n in hist.cumulative():
                    lines.append(f"{name}_bucket{_labels([('endpoint', endpoint), ('le', _number(bound))])} {n}")
                lines.append(f"{name}_sum{_labels([('endpoint', endpoint)])} {_number(hist.total)}")
                lines.append(f"{name}_count{_labels([('endpoint', endpoint)])} {hist.count}")

        family("qkm_requests_total", "counter",
               "HTTP requests answered, by endpoint (route template) and status code.")
        for (endpoint, status), n in sorted(self.requests.items()):
            lines.append(f"qkm_requests_total{_labels([('endpoint', endpoint), ('status', status)])} {n}")
        family("qkm_request_duration_seconds", "histogram", "Time from request start to the end of the response.")
        histogram("qkm_request_duration_seconds", self.latency)
        family("qkm_rows_total", "counter", "Rows answered (assigned, searched or featurised), by endpoint.")
        for endpoint, n in sorted(self.rows.items()):
            lines.append(f"qkm_rows_total{_labels([('endpoint', endpoint)])} {n}")
        family("qkm_batch_rows", "histogram", "Rows per answered inference request.")
        histogram("qkm_batch_rows", self.batch_rows)
        family("qkm_in_flight_requests", "gauge", "Inference requests being read, queued or computed.")
        lines.append(f"qkm_in_flight_requests {self.in_flight}")
        family("qkm_model_info", "gauge", "The model this worker serves (always 1).")
        lines.append(f"qkm_model_info{_labels(sorted(self.info.items()))} 1")
        family("qkm_worker_info", "gauge", "The worker process that answered this scrape (always 1).")
        lines.append(f"qkm_worker_info{_labels([('pid', os.getpid())])} 1")
        family("qkm_process_start_time_seconds", "gauge", "Start time of the worker since the Unix epoch.")
        lines.append(f"qkm_process_start_time_seconds {_number(self.started)}")
        return "\n".join(lines) + "\n"
