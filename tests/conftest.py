import os

# the 1-vs-2-thread tests need numba to allow 2 threads even on a 1-core machine; a NUMBA_NUM_THREADS set by the
# user (NUMBA_NUM_THREADS=1 make test) is kept, and the tests marked needs_threads(n) then skip
os.environ.setdefault("NUMBA_NUM_THREADS", str(max(2, os.cpu_count() or 1)))

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_blobs

CONTAINERS = {
    "dense": np.asarray,
    "csr_matrix": sp.csr_matrix,
    "csr_array": sp.csr_array,
}


def pytest_runtest_setup(item):
    """``@pytest.mark.needs_threads(n)``: skip the test when numba may use fewer than ``n`` threads."""
    marker = item.get_closest_marker("needs_threads")
    if marker is not None:
        import numba

        needed, available = int(marker.args[0]), numba.config.NUMBA_NUM_THREADS
        if available < needed:
            pytest.skip(f"needs {needed} numba threads; NUMBA_NUM_THREADS={available} here")


@pytest.fixture(scope="session")
def blobs():
    X, y = make_blobs(n_samples=600, n_features=12, centers=6, cluster_std=1.5, random_state=42)
    return X, y


@pytest.fixture(scope="session")
def sparse_text_like():
    """Random non-negative sparse rows (text-like), L2 normalised."""
    rng = np.random.RandomState(0)
    X = sp.random(500, 300, density=0.04, random_state=rng, format="csr")
    X.data = rng.exponential(size=X.nnz)
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    norms[norms == 0] = 1
    return sp.csr_matrix(sp.diags(1 / norms) @ X)


def through_npy(arrays, tmp_path):
    """``arrays`` after a trip through ``np.save`` / ``np.load`` (what the safe format does to them)."""
    out = {}
    for name, arr in arrays.items():
        np.save(tmp_path / f"{name}.npy", arr, allow_pickle=False)
        out[name] = np.load(tmp_path / f"{name}.npy", allow_pickle=False)
    return out
