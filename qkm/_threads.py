"""Thread control in one exception-safe place.

numba's thread count is process-global; :func:`numba_threads` sets it for the
duration of a ``with`` block and always restores the previous value.
"""

import contextlib

import numba

__all__ = ["effective_n_threads", "numba_threads"]


def effective_n_threads(n_jobs):
    """Resolve ``n_jobs`` to a thread count in ``[1, numba.config.NUMBA_NUM_THREADS]``.

    ``None`` means every thread numba may use; negative values count back
    from it (``-1`` = all, ``-2`` = all but one), as in joblib.
    """
    max_threads = numba.config.NUMBA_NUM_THREADS
    if n_jobs is None:
        return max_threads
    n_jobs = int(n_jobs)
    if n_jobs == 0:
        raise ValueError("n_jobs == 0 has no meaning; use None, a positive or a negative count.")
    if n_jobs < 0:
        n_jobs = max(1, max_threads + 1 + n_jobs)
    return min(n_jobs, max_threads)


@contextlib.contextmanager
def numba_threads(n_threads):
    """Run the block with ``n_threads`` numba threads, then restore the old count.

    Examples
    --------
    >>> import numba
    >>> before = numba.get_num_threads()
    >>> with numba_threads(1):
    ...     numba.get_num_threads()
    1
    >>> numba.get_num_threads() == before
    True
    """
    previous = numba.get_num_threads()
    numba.set_num_threads(int(n_threads))
    try:
        yield n_threads
    finally:
        numba.set_num_threads(previous)

