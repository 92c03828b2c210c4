"""Atomic file writes: write to a temporary file beside the target, then rename.

A failed or interrupted write never leaves a half-written target and never
touches the file the user already had.
"""

import contextlib
import os
import tempfile

__all__ = ["atomic_open"]


@contextlib.contextmanager
def atomic_open(path, mode="wb"):
    """Open a temporary file next to ``path``; rename it onto ``path`` on success.

    Parameters
    ----------
    path : str or os.PathLike
        Final destination.
    mode : {"wb", "w"}, default="wb"
        Binary or text mode.

    Yields
    ------
    file object
        The temporary file. On an exception inside the ``with`` block the
        temporary file is removed and ``path`` is left as it was.

    Examples
    --------
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with atomic_open(os.path.join(d, "a.txt"), "w") as f:
    ...     _ = f.write("hello")
    >>> open(os.path.join(d, "a.txt")).read()
    'hello'
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
