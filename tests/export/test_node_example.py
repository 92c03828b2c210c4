"""examples/node: the Node.js program (onnxruntime-node) gives the labels Python gives.

Skipped when ``node`` / ``npm`` are missing, or when ``npm ci`` cannot reach the
registry (no network). A failing install for any other reason, or a label
mismatch, fails.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node"
NETWORK_ERRORS = re.compile(r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|"
                            r"ENOTCACHED|getaddrinfo|network|socket hang up|proxy|certificate|ERR_SOCKET",
                            re.IGNORECASE)

pytestmark = pytest.mark.skipif(shutil.which("node") is None or shutil.which("npm") is None,
                                reason="node and npm are needed for the Node.js example")


@pytest.fixture(scope="module")
def node_example():
    """examples/node with its dependencies installed (``npm ci`` once, from package-lock.json)."""
    probe = ["node", "-e", "require('onnxruntime-node')"]
    if subprocess.run(probe, cwd=EXAMPLE, capture_output=True, timeout=60).returncode != 0:
        env = dict(os.environ, ONNXRUNTIME_NODE_INSTALL="skip", ONNXRUNTIME_NODE_INSTALL_CUDA="skip",
                   npm_config_audit="false", npm_config_fund="false", npm_config_update_notifier="false")
        try:
            proc = subprocess.run(["npm", "ci"], cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            pytest.skip("npm ci did not finish in 300 s (no or slow network?)")
        if proc.returncode != 0:
            log = proc.stdout + proc.stderr
            if NETWORK_ERRORS.search(log):
                pytest.skip(f"npm ci could not reach the registry (no network?): {log.strip()[-300:]}")
            pytest.fail(f"npm ci failed in {EXAMPLE}:\n{log[-2000:]}")
    return EXAMPLE


def _run(example, *args):
    return subprocess.run(["node", str(example / "predict.js"), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def qk_model():
    from sklearn.datasets import make_blobs

    import qkm

    X, _ = make_blobs(n_samples=600, n_features=40, centers=12, cluster_std=1.0, center_box=(-6, 6), random_state=0)
    est = qkm.QKMeans(12, sparsity_level=3, max_iter=10, random_state=0).fit(X)
    rng = np.random.default_rng(1)
    Xq = (X[rng.choice(len(X), 50, replace=False)] + rng.normal(0, 0.5, size=(50, 40))).astype(np.float32)
    return est, Xq


@pytest.mark.parametrize("encoding", ["hybrid", "sparse", "dense"])
def test_node_labels_match_python(node_example, qk_model, encoding, tmp_path):
    from qkm.export import as_model, to_onnx

    est, X = qk_model
    model = as_model(est)
    to_onnx(est, tmp_path / "model.onnx", encoding=encoding)
    labels_ref, dist_ref = model.assign(X)

    np.save(tmp_path / "batch.npy", X)
    proc = _run(node_example, tmp_path / "model.onnx", tmp_path / "batch.npy")
    assert proc.returncode == 0, proc.stderr
    assert [int(v) for v in proc.stdout.split()] == labels_ref.tolist()

    proc = _run(node_example, tmp_path / "model.onnx", tmp_path / "batch.npy", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["labels"] == labels_ref.tolist()
    np.testing.assert_allclose(out["distances"], dist_ref, rtol=1e-4, atol=1e-6 * float(dist_ref.max()))

    # one row (another branch of the hybrid graph), written as a version 2.0 .npy
    with open(tmp_path / "row.npy", "wb") as f:
        np.lib.format.write_array(f, X[3:4], version=(2, 0))
    proc = _run(node_example, tmp_path / "model.onnx", tmp_path / "row.npy", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["labels"] == labels_ref[3:4].tolist()


def test_node_rejects_bad_batches(node_example, qk_model, tmp_path):
    from qkm.export import to_onnx

    est, X = qk_model
    to_onnx(est, tmp_path / "model.onnx", encoding="dense")
    cases = {
        "f64.npy": (X.astype(np.float64), "float32"),
        "fortran.npy": (np.asfortranarray(X), "Fortran"),
        "3d.npy": (X[None], "2-D"),
    }
    for name, (array, message) in cases.items():
        np.save(tmp_path / name, array)
        proc = _run(node_example, tmp_path / "model.onnx", tmp_path / name)
        assert proc.returncode == 2 and message in proc.stderr, (name, proc.stderr)
    (tmp_path / "cut.npy").write_bytes((tmp_path / "f64.npy").read_bytes()[:60])
    proc = _run(node_example, tmp_path / "model.onnx", tmp_path / "cut.npy")
    assert proc.returncode == 2 and "truncated" in proc.stderr
    np.save(tmp_path / "narrow.npy", X[:, :5])
    proc = _run(node_example, tmp_path / "model.onnx", tmp_path / "narrow.npy")
    assert proc.returncode == 1 and "(50, 5)" in proc.stderr
