"""Atomic file writes: write to a temporary file beside the target, then rename.

A failed or interrupted write never leaves a half-written target and never
touches the file the user already had. The file gets the permissions any
other tool would give it: a new file those of the user's umask (created with
``0o666`` like ``open``), a replaced file keeps its own.
"""

import contextlib
import os
import secrets
import stat

__all__ = ["atomic_open", "check_destination"]


def check_destination(path):
    """Raise a clear ``OSError`` if ``path`` cannot be a file written here: a directory, or in a missing one.

    Callers that work long before writing (``qkm train``) check first, so a
    typo in ``-o`` costs nothing.

    Examples
    --------
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> check_destination(os.path.join(d, "model.qkm"))
    >>> try:
    ...     check_destination(d)
    ... except IsADirectoryError as exc:
    ...     print("is a directory" in str(exc))
    True
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory; give the name of a file to write.")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {path}: the directory {directory} does not exist.")


def _create_temporary(directory, name):
    """``(fd, path)`` of a new file beside the target, created like ``open`` does (mode 0o666 minus the umask)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue
        except PermissionError as exc:
            raise PermissionError(exc.errno, f"cannot write in {directory} ({exc.strerror})") from None


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
    >>> import os, stat, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with atomic_open(os.path.join(d, "a.txt"), "w") as f:
    ...     _ = f.write("hello")
    >>> open(os.path.join(d, "a.txt")).read()
    'hello'
    >>> umask = os.umask(0o022); _ = os.umask(umask)  # read the umask: the new file's mode follows it
    >>> stat.S_IMODE(os.stat(os.path.join(d, "a.txt")).st_mode) == 0o666 & ~umask
    True
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
    path = os.fspath(path)
    check_destination(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = _create_temporary(directory, os.path.basename(path))
    try:
        with contextlib.suppress(FileNotFoundError):  # replacing a file: keep its permissions
            mode_bits = stat.S_IMODE(os.stat(path).st_mode)
            os.chmod(fd if os.chmod in os.supports_fd else tmp, mode_bits)
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
