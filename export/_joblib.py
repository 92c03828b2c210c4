"""The joblib artefact: the fitted estimator itself, pickled.

Pickle runs code when it loads: load a joblib artefact only from a source you
trust. The safe format (:func:`qkm.export.save_model`) is the default and the
only one ``qkm serve`` loads without ``--trust-pickle``.

The file is a joblib dump of a small envelope
``{"format": "qkm-joblib", "format_version": 1, "qkm_version": ..., "estimator": est}``
so that loading can say what it found instead of returning any object.
"""

import contextlib
import importlib
import sys

import joblib

from qkm._version import __version__
from qkm.io._atomic import atomic_open

from ._model import _split_fitted
from ._safe import ModelFormatError

__all__ = ["JOBLIB_FORMAT_VERSION", "load_joblib", "save_joblib"]

#: Modules whose classes a pickle may name by the path they had before the package's folders were laid out
#: (old path -> today's): an artefact written then names its operator as ``qkm.factorization._chain...``.
MOVED_MODULES = {
    "qkm.factorization._operator_base": "qkm.operator._base",
    "qkm.factorization._chain": "qkm.operator._chain",
    "qkm.factorization._chain_calibration": "qkm.operator._chain_calibration",
    "qkm.factorization._chain_layout": "qkm.operator._chain_layout",
}


@contextlib.contextmanager
def _old_module_paths():
    """Make the old paths of :data:`MOVED_MODULES` importable while a pickle loads, then remove them."""
    added = [old for old in MOVED_MODULES if old not in sys.modules]
    for old in added:
        sys.modules[old] = importlib.import_module(MOVED_MODULES[old])
    try:
        yield
    finally:
        for old in added:
            sys.modules.pop(old, None)

JOBLIB_FORMAT = "qkm-joblib"
JOBLIB_FORMAT_VERSION = 1


def save_joblib(estimator, path, *, compress=3):
    """Pickle a fitted qkm estimator with joblib, atomically.

    Parameters
    ----------
    estimator : fitted qkm.KMeans, QKMeans, LowRankKMeans, ClusterIndex, Nystroem or qkm.export.Model
    path : str or os.PathLike
        Destination; an existing file is replaced only once the new one is complete.
    compress : int, default=3
        joblib's zlib compression level (0 to 9).

    Examples
    --------
    >>> import numpy as np, os, tempfile, qkm
    >>> from qkm.export import save_joblib, load_joblib
    >>> km = qkm.KMeans(2, random_state=0).fit(np.array([[0.0], [1.0], [10.0], [11.0]]))
    >>> path = os.path.join(tempfile.mkdtemp(), "m.joblib")
    >>> save_joblib(km, path)
    >>> load_joblib(path).predict([[10.5]]).tolist() == km.predict([[10.5]]).tolist()
    True
    """
    _split_fitted(estimator)  # raises a clear TypeError for anything that is not a fitted qkm model
    envelope = {"format": JOBLIB_FORMAT, "format_version": JOBLIB_FORMAT_VERSION,
                "qkm_version": __version__, "estimator": estimator}
    with atomic_open(path, "wb") as f:
        joblib.dump(envelope, f, compress=compress)


def load_joblib(path):
    """Unpickle a qkm joblib artefact. **Only for files from a trusted source.**

    Raises
    ------
    ModelFormatError
        Truncated or corrupted file, not a qkm artefact, or a newer format.
    """
    try:
        with _old_module_paths():
            envelope = joblib.load(path)
    except (EOFError, ValueError, KeyError, IndexError, OSError, ImportError, AttributeError, TypeError) as exc:
        raise ModelFormatError(f"{path}: not a readable joblib artefact (truncated or another kind of file: {exc!r}).") from exc
    except Exception as exc:  # unpickling can raise anything (e.g. UnpicklingError)
        raise ModelFormatError(f"{path}: not a readable joblib artefact ({exc!r}).") from exc
    if not isinstance(envelope, dict) or envelope.get("format") != JOBLIB_FORMAT:
        raise ModelFormatError(f"{path}: a joblib file, but not a qkm artefact (written by save_joblib).")
    version = envelope.get("format_version")
    if not isinstance(version, int) or version > JOBLIB_FORMAT_VERSION:
        raise ModelFormatError(f"{path}: qkm joblib format {version!r} is newer than this qkm reads "
                               f"({JOBLIB_FORMAT_VERSION}); written by qkm {envelope.get('qkm_version')}.")
    return envelope["estimator"]
