"""The ``qkm`` command line, run as a user would: in a subprocess."""

import os
import subprocess
import sys

import numpy as np
import pytest
from sklearn.datasets import dump_svmlight_file, make_blobs

from qkm.export import load_model

QKM = [sys.executable, "-m", "qkm.cli"]


def run(*args, cwd):
    return subprocess.run([*QKM, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    X, y = make_blobs(200, 6, centers=4, random_state=0)
    np.save(d / "X.npy", X)
    dump_svmlight_file(X, y, str(d / "X.svm"))
    return d, X, y


def test_train_predict_score_round_trip(files):
    d, X, y = files
    r = run("train", "X.svm", "-k", 4, "--seed", 0, "--algorithm", "elkan", "-o", "m.qkm", "--labels", "train.txt",
            "--json", cwd=d)
    assert r.returncode == 0, r.stderr
    assert "iteration" in r.stderr  # progress bar on stderr
    model = load_model(d / "m.qkm")
    assert model.n_clusters == 4 and model.n_features == 6
    r = run("predict", "m.qkm", "X.npy", cwd=d)
    assert r.returncode == 0, r.stderr
    predicted = np.array(r.stdout.split(), dtype=int)
    np.testing.assert_array_equal(predicted, np.loadtxt(d / "train.txt", dtype=int))
    np.testing.assert_array_equal(predicted, model.predict(X))
    r = run("score", "X.svm", "--model", "m.qkm", cwd=d)
    assert r.returncode == 0, r.stderr
    for name in ("WCSS_C", "TRUE_SAME_CT", "FALSE_DIFF_CT", "PAIR_PRECISION", "PAIR_RECALL", "AMI", "ARI"):
        assert name in r.stdout


@pytest.mark.parametrize("algorithm, extra", [("qkmeans", ["--sparsity-level", 2, "--n-factors", 2]),
                                               ("lowrank", ["--rank", 2])])
def test_train_structured_centroids(files, algorithm, extra):
    d, X, _ = files
    r = run("train", "X.npy", "-k", 4, "--seed", 0, "--algorithm", algorithm, *extra, "--max-iter", 10,
            "-o", f"{algorithm}.qkm", "--labels", f"{algorithm}.txt", "--json", cwd=d)
    assert r.returncode == 0, r.stderr
    model = load_model(d / f"{algorithm}.qkm")
    assert model.kind == "factor-chain" and model.metadata["algorithm"] == algorithm
    assert len(model.operator.factors) == 2
    if algorithm == "qkmeans":
        assert all(f.nnz <= 2 * max(f.shape) for f in model.operator.factors)  # given n_factors: s * max(rows, cols) each
    np.testing.assert_array_equal(model.predict(X), np.loadtxt(d / f"{algorithm}.txt", dtype=int))
    summary = __import__("json").loads(r.stdout)
    assert summary["nnz"] == model.operator.nnz and summary["algorithm"] == algorithm
    r = run("train", "X.npy", "-k", 4, "--algorithm", "qkmeans", "--sparsity-level", 0, "-o", "bad.qkm", cwd=d)
    assert r.returncode == 2 and "sparsity_level must be an integer >= 1" in r.stderr


def test_verbose_prints_every_iteration(files):
    d, _, _ = files
    r = run("train", "X.npy", "-k", 3, "--seed", 1, "-v", "-o", "v.qkm", cwd=d)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("wcss=") >= 1
    assert "iteration=1 " in r.stderr


def test_failed_run_keeps_existing_model(files):
    d, _, _ = files
    assert run("train", "X.npy", "-k", 3, "--seed", 1, "-q", "-o", "keep.qkm", cwd=d).returncode == 0
    before = (d / "keep.qkm").read_bytes()
    r = run("train", "X.npy", "-k", 0, "-o", "keep.qkm", cwd=d)
    assert r.returncode == 2
    assert "n_clusters=0 must be >= 1" in r.stderr
    assert (d / "keep.qkm").read_bytes() == before
    assert not [p for p in os.listdir(d) if p.endswith(".tmp")]


def test_bad_data_file_gives_clear_error(files):
    d, _, _ = files
    (d / "bad.csv").write_text("1,2,3\n4,5\n")
    r = run("train", "bad.csv", "-k", 2, "-o", "x.qkm", cwd=d)
    assert r.returncode == 2
    assert "bad.csv" in r.stderr and "line 2" in r.stderr
    assert "Traceback" not in r.stderr


def test_init_from_file_and_wrong_feature_count(files):
    d, X, _ = files
    np.save(d / "C0.npy", X[:3])
    r = run("train", "X.npy", "-k", 3, "--init", "C0.npy", "-q", "-o", "init.qkm", "--json", cwd=d)
    assert r.returncode == 0, r.stderr
    np.save(d / "narrow.npy", X[:, :4])
    r = run("predict", "init.qkm", "narrow.npy", cwd=d)
    assert r.returncode == 2
    assert "has 4 features" in r.stderr and "expecting 6" in r.stderr
    assert "Traceback" not in r.stderr


def test_help_texts_are_complete(files):
    d, _, _ = files
    for cmd in ("train", "predict", "score"):
        r = run(cmd, "--help", cwd=d)
        assert r.returncode == 0 and "usage: qkm " + cmd in r.stdout
    r = run("train", "--help", cwd=d)
    for option in ("--algorithm", "--init", "--n-init", "--max-iter", "--tol", "--tol-wcss", "--seed", "--labels"):
        assert option in r.stdout


def test_export_joblib_and_safe_and_trust_pickle(files):
    d, X, _ = files
    assert run("train", "X.npy", "-k", 3, "--seed", 0, "-o", "e.qkm", "-q", cwd=d).returncode == 0
    r = run("export", "e.qkm", "--format", "joblib", "-o", "e.joblib", "--json", cwd=d)
    assert r.returncode == 0, r.stderr
    assert __import__("json").loads(r.stdout)["format"] == "joblib"
    from qkm.export import load_joblib

    np.testing.assert_array_equal(load_joblib(d / "e.joblib").predict(X), load_model(d / "e.qkm").predict(X))
    r = run("export", "e.joblib", "--format", "safe", "-o", "again.qkm", cwd=d)
    assert r.returncode == 2 and "not a qkm model" in r.stderr  # pickle needs an explicit opt-in
    r = run("export", "e.joblib", "--format", "safe", "-o", "again.qkm", "--trust-pickle", cwd=d)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(load_model(d / "again.qkm").operator.to_dense(),
                                  load_model(d / "e.qkm").operator.to_dense())


def test_export_onnx_matches_predict(files):
    import onnxruntime as ort

    d, X, _ = files
    assert run("train", "X.npy", "-k", 4, "--seed", 0, "--algorithm", "qkmeans", "--sparsity-level", 2,
               "--max-iter", 5, "-o", "o.qkm", "-q", cwd=d).returncode == 0
    r = run("export", "o.qkm", "--format", "onnx", "--encoding", "sparse", "-o", "o.onnx", "--json", cwd=d)
    assert r.returncode == 0, r.stderr
    assert __import__("json").loads(r.stdout)["encoding"] == "sparse"
    session = ort.InferenceSession(str(d / "o.onnx"), providers=["CPUExecutionProvider"])
    labels, _ = session.run(["label", "distance"], {"X": X.astype(np.float32)})
    np.testing.assert_array_equal(labels, load_model(d / "o.qkm").predict(X.astype(np.float32)))
