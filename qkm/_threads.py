"""Thread control in one exception-safe place.

numba's thread count is process-global; :func:`numba_threads` sets it for the
duration of a ``with`` block and always restores the previous value.
:func:`single_threaded_blas` pins BLAS to one thread for code whose results
must not depend on BLAS's thread count (the factorisations: a multithreaded
BLAS may round small products differently, and the greedy supports then
diverge).
"""

import contextlib
from concurrent.futures import ThreadPoolExecutor

import numba
from threadpoolctl import threadpool_limits

__all__ = ["effective_n_threads", "numba_threads", "one_blas_thread", "pin_numba_threads", "run_concurrently",
           "single_threaded_blas"]


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


def pin_numba_threads(n_threads):
    """Set the calling thread's numba thread count for good (numba's count is per thread).

    For a thread that does one kind of work, such as the event loop of ``qkm serve``, so
    that its calls need no :func:`numba_threads` block each. Returns False,
    changing nothing, for a count numba refuses (``> NUMBA_NUM_THREADS``).
    """
    if not 1 <= int(n_threads) <= numba.config.NUMBA_NUM_THREADS:
        return False
    numba.set_num_threads(int(n_threads))
    return True


@contextlib.contextmanager
def single_threaded_blas():
    """Run the block with one BLAS thread (threadpoolctl), then restore the old count."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


_BLAS_CONTROLLER = []


@contextlib.contextmanager
def one_blas_thread():
    """:func:`single_threaded_blas` for hot paths: the BLAS libraries are listed once per process, not per call.

    numba's BLAS (SciPy's) is loaded first, so that it is among them.
    """
    if not _BLAS_CONTROLLER:
        import scipy.linalg.cython_blas  # noqa: F401  (numba's np.dot calls it)
        from threadpoolctl import ThreadpoolController

        _BLAS_CONTROLLER.append(ThreadpoolController())
    with _BLAS_CONTROLLER[0].limit(limits=1, user_api="blas"):
        yield


def run_concurrently(task, n_tasks, n_threads):
    """``[task(0), ..., task(n_tasks - 1)]``, run in up to ``n_threads`` Python threads.

    The numba kernels release the GIL, so independent runs (``n_init``) overlap.
    Each worker gets ``n_threads // workers`` numba threads; BLAS is held to
    one thread while several tasks run, so the threads never oversubscribe
    the cores and BLAS results do not depend on ``n_threads``. Results come
    back in task order whatever the timing. numba's workqueue threading layer
    cannot run parallel kernels from two threads at once: with it (or before
    any parallel kernel ran) the tasks run one after the other.

    Examples
    --------
    >>> run_concurrently(lambda i: i * i, 4, 2)
    [0, 1, 4, 9]
    """
    from threadpoolctl import threadpool_limits

    if n_tasks == 1:
        return [task(0)]
    try:
        layer_ok = numba.threading_layer() != "workqueue"
    except ValueError:  # no parallel kernel has run yet
        layer_ok = False
    workers = min(n_threads, n_tasks) if layer_ok else 1
    inner = max(1, n_threads // workers)

    def run(i):
        with numba_threads(inner):
            return task(i)

    with threadpool_limits(limits=1, user_api="blas"):
        if workers == 1:
            return [run(i) for i in range(n_tasks)]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="qkm-run") as pool:
            futures = [pool.submit(run, i) for i in range(n_tasks)]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
