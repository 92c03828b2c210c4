"""House rules that a reviewer would otherwise have to remember."""

import pathlib
import re

PACKAGE_DIRS = [pathlib.Path(__file__).resolve().parents[1] / d for d in ("qkm", "export", "serve")]


def _sources():
    for d in PACKAGE_DIRS:
        yield from sorted(d.rglob("*.py"))


def test_every_numba_kernel_takes_the_shared_settings():
    # cache, nogil and fastmath come from qkm._config (stumpy's check_fastmath rule)
    offenders = []
    for path in _sources():
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*@(numba\.)?njit\b", line) and "**_JIT" not in line:
                offenders.append(f"{path.name}:{lineno}: {line.strip()}")
            if "fastmath=" in line and "_config.FASTMATH" not in line:
                offenders.append(f"{path.name}:{lineno}: hard-coded fastmath")
    assert not offenders, "\n".join(offenders)


def test_kernels_live_in_private_modules():
    for path in _sources():
        if "@njit" in path.read_text() or "@numba.njit" in path.read_text():
            assert path.name.startswith("_"), f"{path.name} defines numba kernels but is a public module"


def test_thread_count_is_only_set_in_one_place():
    for path in _sources():
        if path.name != "_threads.py":
            assert "set_num_threads" not in path.read_text(), f"{path.name} sets numba threads outside _threads.py"
