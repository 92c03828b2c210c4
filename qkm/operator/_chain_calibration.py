"""Measured choice of the execution path of a factor chain (private; see :mod:`qkm.operator._chain`).

:class:`ChainCalibration` keeps, per kind of batch (dense or CSR) and batch-size
bucket, the seconds per row of every candidate path, measured by
:func:`measure` (interleaved rounds, best of), and the path chosen.
"""

import time

import numpy as np

__all__ = ["BUCKETS", "PATHS", "ChainCalibration", "bucket_of", "measure"]

#: Every execution path; "fused" (forcing only) means the fused kernel picked by batch size.
PATHS = ("fused-sample", "fused-block", "scipy", "dense")

#: Batch-size buckets: (name, largest batch size, rows timed, candidate paths).
BUCKETS = (
    ("1", 1, 1, PATHS),
    ("2-16", 16, 16, PATHS),
    ("17-256", 256, 256, ("fused-block", "scipy", "dense")),
    (">256", None, 512, ("fused-block", "scipy", "dense")),
)


def bucket_of(n_samples):
    for bucket in BUCKETS:
        if bucket[1] is None or n_samples <= bucket[1]:
            return bucket
    raise AssertionError  # pragma: no cover


class ChainCalibration:
    """Measured speed of the execution paths, shareable between operators.

    Entries are keyed by ``"<dense|csr>/<bucket>"`` (not by thread count, so
    the path, hence every result, is the same for any number of threads;
    ``threads`` records the count the timing ran with). An operator
    built with ``calibration=old.calibration`` (or ``calibration=old``)
    reuses the choices of ``old`` when its chain has the same shape, dtype
    and number of factors and an nnz within ``nnz_tolerance`` (relative);
    otherwise it starts a fresh calibration.

    Parameters
    ----------
    nnz_tolerance : float, default=0.25
    bit_identical : bool, default=False
        Only consider the paths that agree bit for bit (the fused kernels and
        scipy), never the BLAS-rounded dense path. The trainers use this so
        that a fit is reproducible from ``random_state`` whatever the timings.

    Attributes
    ----------
    signature : dict or None
        ``n_clusters``, ``n_features``, ``dtype``, ``n_factors``, ``nnz`` of
        the chain first measured.
    entries : dict
        key -> ``{"path", "seconds_per_row": {path: s}, "rows_timed", "threads", "timing_seconds"}``.
    """

    def __init__(self, nnz_tolerance=0.25, bit_identical=False):
        self.nnz_tolerance = nnz_tolerance
        self.bit_identical = bit_identical
        self.signature = None
        self.entries = {}

    def accepts(self, signature):
        """Whether measurements for ``self.signature`` hold for a chain with ``signature``."""
        mine = self.signature
        if mine is None:
            return True
        same = all(mine[k] == signature[k] for k in ("n_clusters", "n_features", "dtype", "n_factors"))
        ratio = signature["nnz"] / max(mine["nnz"], 1)
        return same and abs(ratio - 1.0) <= self.nnz_tolerance

    def report(self):
        """The entries as Markdown table lines."""
        lines = ["| input / batch | chosen | " + " | ".join(f"{p} µs/row" for p in PATHS) + " |",
                 "|---|---|" + "---|" * len(PATHS)]
        for key, e in sorted(self.entries.items()):
            cells = [f"{e['seconds_per_row'][p] * 1e6:.3g}" if p in e["seconds_per_row"] else "-" for p in PATHS]
            lines.append(f"| {key} | {e['path']} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def measure(runners, rounds=3, min_seconds=1e-3, max_reps=50, drop_factor=5.0):
    """Best-of-``rounds`` seconds per call of each runner, the rounds interleaved.

    Each runner is called twice untimed-for-choice first (the first call may
    compile), then calls are repeated so each measurement lasts at least
    ``min_seconds``. Runners more than ``drop_factor`` times slower than the
    fastest on the warm-up call are not timed further (their warm-up time is kept).
    """
    est = {}
    for name, run in runners.items():
        run()
        t0 = time.perf_counter()
        run()
        est[name] = max(time.perf_counter() - t0, 1e-9)
    fastest = min(est.values())
    best = {name: t for name, t in est.items()}
    live = [name for name, t in est.items() if t <= drop_factor * fastest]
    reps = {name: int(min(max_reps, max(1, np.ceil(min_seconds / est[name])))) for name in live}
    for _ in range(rounds):
        for name in live:
            run = runners[name]
            t0 = time.perf_counter()
            for _ in range(reps[name]):
                run()
            best[name] = min(best[name], (time.perf_counter() - t0) / reps[name])
    return best
