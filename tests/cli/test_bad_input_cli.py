"""The bad-input catalogue, command line: every bad call is one line on stderr and exit status 2 (130 for Ctrl-C),
and nothing the user had is lost (split from ``test_bad_input.py``, whose docstring tells the whole catalogue)."""

import os
import signal
import stat
import subprocess
import sys

import numpy as np
import pytest

import qkm
from qkm.cli import main
from qkm.export import save_model
from support import run_cli

# -- command line ---------------------------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def cli_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    X = np.random.default_rng(0).random((30, 4))
    np.save(d / "X.npy", X)
    (d / "empty.npy").write_bytes(b"")
    (d / "empty.csv").write_text("")
    np.savetxt(d / "nan.csv", np.where(np.arange(120).reshape(30, 4) == 5, np.nan, X), delimiter=",")
    np.save(d / "inf.npy", np.where(np.arange(120).reshape(30, 4) == 7, np.inf, X))
    np.save(d / "oned.npy", X[:, 0])
    data = (d / "X.npy").read_bytes()
    (d / "truncated.npy").write_bytes(data[:len(data) // 2])
    (d / "malformed.csv").write_text("1,2,3,4\n5,6,x,8\n")
    (d / "garbage.npy").write_bytes(b"\x93NUMPY garbage")
    np.save(d / "object.npy", np.array([[object()]] * 3, dtype=object), allow_pickle=True)
    np.save(d / "strings.npy", np.array([["a"] * 4] * 3))
    np.save(d / "no_rows.npy", np.zeros((0, 4)))
    np.save(d / "no_columns.npy", np.zeros((5, 0)))
    np.save(d / "same_rows.npy", np.ones((5, 4)))
    np.savez(d / "no_X.npz", Z=X)
    (d / "a_dir").mkdir()
    save_model(qkm.KMeans(2, random_state=0).fit(X), d / "m.qkm")
    return d


CLI_CASES = {
    "missing file": (["train", "missing.npy", "-k", "2", "-o", "o.qkm"], "No such file"),
    "empty npy": (["train", "empty.npy", "-k", "2", "-o", "o.qkm"], "empty.npy", "cannot be read"),
    "empty csv": (["train", "empty.csv", "-k", "2", "-o", "o.qkm"], "empty.csv", "no rows"),
    "NaN": (["train", "nan.csv", "-k", "2", "-o", "o.qkm"], "1 NaN"),
    "inf": (["train", "inf.npy", "-k", "2", "-o", "o.qkm"], "1 infinite"),
    "1-D": (["train", "oned.npy", "-k", "2", "-o", "o.qkm"], "1-D", "2-D"),
    "truncated": (["train", "truncated.npy", "-k", "2", "-o", "o.qkm"], "truncated.npy", "cannot be read"),
    "malformed csv": (["train", "malformed.csv", "-k", "2", "-o", "o.qkm"], "line 2", "'x' is not a number"),
    "garbage npy": (["train", "garbage.npy", "-k", "2", "-o", "o.qkm"], "garbage.npy"),
    "object npy": (["train", "object.npy", "-k", "2", "-o", "o.qkm"], "object.npy"),
    "strings": (["train", "strings.npy", "-k", "2", "-o", "o.qkm"], "non-numeric"),
    "no rows": (["train", "no_rows.npy", "-k", "2", "-o", "o.qkm"], "no rows"),
    "no columns": (["train", "no_columns.npy", "-k", "2", "-o", "o.qkm"], "0 feature"),
    "npz without X": (["train", "no_X.npz", "-k", "2", "-o", "o.qkm"], "'X'"),
    "data is a directory": (["train", "a_dir", "-k", "2", "-o", "o.qkm"], "a_dir"),
    "K = 0": (["train", "X.npy", "-k", "0", "-o", "o.qkm"], "n_clusters=0"),
    "K < 0": (["train", "X.npy", "-k", "-3", "-o", "o.qkm"], "n_clusters=-3"),
    "K > rows": (["train", "X.npy", "-k", "31", "-o", "o.qkm"], "30 distinct", "-k 30"),
    "K > distinct rows": (["train", "same_rows.npy", "-k", "3", "-o", "o.qkm"], "1 distinct"),
    "output is a directory": (["train", "X.npy", "-k", "2", "-o", "a_dir"], "a_dir is a directory"),
    "output in a missing directory": (["train", "X.npy", "-k", "2", "-o", "nowhere/o.qkm"], "does not exist"),
    "init of the wrong shape": (["train", "X.npy", "-k", "2", "--init", "oned.npy", "-o", "o.qkm"], "2-D"),
    "sparsity level 0": (["train", "X.npy", "-k", "2", "--algorithm", "qkmeans", "--sparsity-level", "0",
                          "-o", "o.qkm"], "sparsity_level"),
    "predict: missing model": (["predict", "missing.qkm", "X.npy"], "No such file"),
    "predict: model is a directory": (["predict", "a_dir", "X.npy"], "a_dir"),
    "predict: data as model": (["predict", "X.npy", "X.npy"], "not a qkm model file"),
    "predict: wrong width": (["predict", "m.qkm", "oned.npy"], "oned.npy"),
    "export: missing model": (["export", "missing.qkm", "-o", "x.onnx"], "No such file"),
    "serve: model is a directory": (["serve", "a_dir", "--port", "0"], "a_dir"),
}




@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_catalogue(cli_dir, case, monkeypatch, capsys):
    argv, *words = CLI_CASES[case]
    before = (cli_dir / "m.qkm").read_bytes()
    status, err = run_cli(argv, cli_dir, monkeypatch, capsys)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"qkm {argv[0]}: error: "), err
    for word in words:
        assert word in err, err
    assert not (cli_dir / "o.qkm").exists() and (cli_dir / "m.qkm").read_bytes() == before
    assert not [p for p in os.listdir(cli_dir) if p.endswith(".tmp")]


def test_cli_bad_option_value_is_argparse_usage(cli_dir, monkeypatch, capsys):
    monkeypatch.chdir(cli_dir)
    with pytest.raises(SystemExit) as exc:
        main(["train", "X.npy", "-k", "abc", "-o", "o.qkm"])
    assert exc.value.code == 2 and "invalid int value: 'abc'" in capsys.readouterr().err


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_row_11_written_files_follow_the_umask(cli_dir, umask, monkeypatch, capsys):
    previous = os.umask(umask)
    try:
        status, err = run_cli(["train", "X.npy", "-k", "2", "--seed", "0", "-q", "-o", "u.qkm", "--labels",
                               "u.txt"], cli_dir, monkeypatch, capsys)
        assert status == 0, err
        for name in ("u.qkm", "u.txt"):
            assert stat.S_IMODE(os.stat(cli_dir / name).st_mode) == 0o666 & ~umask
        os.chmod(cli_dir / "u.qkm", 0o600)  # a file the user restricted keeps its mode when replaced
        assert run_cli(["train", "X.npy", "-k", "3", "-q", "-o", "u.qkm"], cli_dir, monkeypatch, capsys)[0] == 0
        assert stat.S_IMODE(os.stat(cli_dir / "u.qkm").st_mode) == 0o600
    finally:
        os.umask(previous)
        for name in ("u.qkm", "u.txt"):
            (cli_dir / name).unlink(missing_ok=True)


def test_row_13_thread_tests_skip_when_numba_has_fewer_threads(monkeypatch):
    import numba

    import conftest

    class Item:
        def get_closest_marker(self, name):
            return pytest.mark.needs_threads(2).mark if name == "needs_threads" else None

    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 1)
    with pytest.raises(pytest.skip.Exception, match="needs 2 numba threads; NUMBA_NUM_THREADS=1"):
        conftest.pytest_runtest_setup(Item())
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    conftest.pytest_runtest_setup(Item())  # runs


@pytest.mark.slow
def test_row_15_ctrl_c_during_train_is_one_line_and_status_130(tmp_path):
    X = np.random.default_rng(0).random((20000, 40))
    np.save(tmp_path / "X.npy", X)
    save_model(qkm.KMeans(2, random_state=0).fit(X[:50]), tmp_path / "keep.qkm")
    before = (tmp_path / "keep.qkm").read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "qkm.cli", "train", "X.npy", "-k", "60", "--max-iter", "1000",
                             "--tol", "0", "-v", "-o", "keep.qkm"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a user's Ctrl-C meets SIGINT at its default; a test run started in the background
                            # (`make test &`) would hand down SIG_IGN, and python keeps an ignored SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        seen = []
        for line in proc.stderr:  # training has started once an iteration is reported
            seen.append(line)
            if "iteration=" in line:
                break
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(seen) + rest
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1] == "qkm train: interrupted, nothing written"
    assert (tmp_path / "keep.qkm").read_bytes() == before
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
