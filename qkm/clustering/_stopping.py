"""Stopping rules and per-iteration records shared by every algorithm."""

import sys

import numpy as np


class StoppingRule:
    """scikit-learn's rules plus SystemML's relative WCSS change.

    ``check`` returns ``(strict, stop)``: ``strict`` when the labels did not
    change (no final E-step needed), ``stop`` when any rule fired:

    * labels unchanged since the previous iteration;
    * total squared centre shift ``<= tol`` (``tol`` already scaled by the
      mean feature variance, as scikit-learn does);
    * ``(wcss_prev - wcss) <= tol_wcss * wcss`` when ``tol_wcss > 0``.
    """

    def __init__(self, tol, tol_wcss=0.0):
        self.tol = float(tol)
        self.tol_wcss = float(tol_wcss)
        self._wcss_prev = None

    def check(self, labels, labels_old, shift_total, wcss=None):
        return self.check_changed(0 if np.array_equal(labels, labels_old) else 1, shift_total, wcss)

    def check_changed(self, n_changed, shift_total, wcss=None):
        """:meth:`check` given the number of labels that changed (data spread over shards)."""
        if n_changed == 0:
            return True, True
        if shift_total <= self.tol:
            return False, True
        if self.tol_wcss > 0 and wcss is not None:
            prev, self._wcss_prev = self._wcss_prev, wcss
            if prev is not None and (prev - wcss) <= self.tol_wcss * wcss:
                return False, True
        return False, False


class IterationLog:
    """Per-iteration records; printed to stderr when ``verbose`` is set.

    ``first`` (a dict, e.g. the seeding's cost and time) is merged into the
    first record, which becomes ``history_[0]``.
    """

    def __init__(self, verbose=0, stream=None, prefix="", callback=None, first=None):
        self.verbose = verbose
        self.callback = callback
        self.stream = stream if stream is not None else sys.stderr
        self.prefix = prefix
        self.first = dict(first or {})
        self.records = []

    def record(self, iteration, **fields):
        rec = {"iteration": iteration + 1, **fields, **(self.first if not self.records else {})}
        self.records.append(rec)
        if self.callback is not None:
            self.callback(rec)
        if self.verbose:
            parts = []
            for key, value in rec.items():
                if value is None:
                    continue
                parts.append(f"{key}={value:.10g}" if isinstance(value, float) else f"{key}={value}")
            print(self.prefix + " ".join(parts), file=self.stream, flush=True)
