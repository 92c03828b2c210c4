"""The wheel, as a user installs it: built from this checkout, installed into a fresh virtual environment,
``qkm serve`` with no model answers ``/assign`` with the demo model the wheel ships.

The fresh environment gets qkm from the wheel only; its dependencies (numpy, numba, onnxruntime, ...) are
borrowed from the test environment through a ``.pth`` path entry so that the test needs no network and
stays fast (dependency resolution is what ``pip install -e '.[dev]'`` of ``make test`` already exercises).
Nothing of the checkout is importable there: the test runs the installed ``qkm`` script from a temporary
directory and checks where the package was imported from.

It builds, installs and starts a server (the numba kernels compiled by the checkout's tests are shared with
the installed copy, see :func:`_share_numba_cache`), so it runs when ``QKM_TEST_WHEEL=1`` is set:
``.ci/run`` sets it, a developer's ``make test`` skips it (``QKM_TEST_WHEEL=1 make test`` runs everything).
"""

import json
import os
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest

from support import Server

REPO = Path(__file__).resolve().parents[1]


def _share_numba_cache(checkout, installed):
    """Copy numba's on-disk cache of the checkout's kernels next to the installed modules with the same source.

    numba keys its cache by the SHA-256 of the source file (numba >= 0.60), so for byte-identical sources
    these are exactly the entries it would reuse; without them the installed server spends minutes
    compiling every kernel before it answers (a user's first ``qkm serve`` does that once).
    """
    for source in checkout.rglob("*.py"):  # subpackages too
        target = installed / source.relative_to(checkout)
        if not target.is_file() or target.read_bytes() != source.read_bytes():
            continue
        cache = source.parent / "__pycache__"
        (target.parent / "__pycache__").mkdir(exist_ok=True)
        for entry in [*cache.glob(f"{source.stem}.*.nbi"), *cache.glob(f"{source.stem}.*.nbc")]:
            shutil.copy2(entry, target.parent / "__pycache__" / entry.name)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("QKM_TEST_WHEEL") != "1", reason="builds and installs the wheel (minutes): "
                    "set QKM_TEST_WHEEL=1, as .ci/run does")
def test_wheel_ships_the_demo_model_and_qkm_serve_answers(tmp_path):
    import httpx

    source, dist = tmp_path / "source", tmp_path / "dist"  # built from a copy: the build leaves no build/ here
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", ".cache", "node_modules", "__pycache__", ".pytest_cache",
        ".hypothesis", "demo_out", "*.nbi", "*.nbc"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("qkm-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    # every package of the source tree is in the wheel (pyproject lists them by hand)
    for top, prefix in (("qkm", "qkm"), ("export", "qkm/export"), ("serve", "qkm/serve"), ("models", "qkm/models")):
        for init in (REPO / top).rglob("__init__.py"):
            name = f"{prefix}/{init.relative_to(REPO / top).as_posix()}"
            assert name in names, f"{name} missing from the wheel: add its package to pyproject.toml"
    for name in ("qkm/models/fashion_mnist_qkmeans.qkm", "qkm/models/__init__.py", "qkm/serve/app.py",
                 "qkm/export/_safe.py", "qkm/datasets/fashion_mnist_2000.npz"):
        assert name in names, name

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    deps = [p for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                        *site.getsitepackages()} if Path(p).is_dir()]
    (purelib / "borrowed_dependencies.pth").write_text("\n".join(deps) + "\n")  # plain paths, after the wheel's
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr
    where = subprocess.run([str(python), "-c", "import qkm, qkm.serve; print(qkm.__file__); "
                            "print(qkm.serve.demo_model_path())"], cwd=tmp_path, capture_output=True, text=True,
                           check=True).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where  # the wheel's files, not the checkout's
    assert Path(where[1]).is_file()
    _share_numba_cache(REPO / "qkm", Path(where[0]).parent)

    server = Server(["--no-access-log"], tmp_path / "serve.log", program=[str(venv / "bin" / "qkm")],
                    cwd=tmp_path)
    try:
        server.wait_ready(timeout=300)  # kernels missing from the shared cache compile here
        rows = np.load(REPO / "qkm" / "datasets" / "fashion_mnist_2000.npz")["X"][:5].astype(np.float32)
        expected = subprocess.run([str(python), "-c", "import sys, json, numpy as np; from qkm.export import "
                                   "load_model; from qkm.serve import demo_model_path; X = np.array(json.load("
                                   "sys.stdin), np.float32); print(json.dumps(load_model(demo_model_path())"
                                   ".predict(X).tolist()))"], input=json.dumps(rows.tolist()), cwd=tmp_path,
                                  capture_output=True, text=True, check=True).stdout
        r = httpx.post(server.url + "/assign", json={"instances": rows.tolist()}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["labels"] == json.loads(expected)
        assert httpx.get(server.url + "/model", timeout=60).json()["name"] == "fashion_mnist_qkmeans"
    except BaseException:
        server.close()
        raise
    assert server.stop(signal.SIGINT) == 0, server.output()
    assert "Traceback" not in server.output()
