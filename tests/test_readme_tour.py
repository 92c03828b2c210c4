"""README.md's tour runs as written: every ```python block, in order, in one namespace.

Convention for README.md's code blocks:

- a block fenced ```` ```python ```` is executed by this test: all of them, in the order they appear, in one
  shared namespace (a later block may use the names an earlier one defined), with a fresh temporary
  directory as the working directory (files the tour writes, such as ``qk.qkm``, land there);
- a block whose info string has more words after ``python``, e.g. ```` ```python norun ````, is NOT executed
  (use it for code that needs something the test cannot provide: a running ``qkm serve``, a Dask
  scheduler). GitHub still highlights it as Python, since only the first word names the language;
- ```` ```bash ````, ```` ```text ```` and other blocks are never executed.

Keep the tour small (the bundled 2,000-row sample, small K and max_iter) so this test stays fast.
"""

import pathlib
import re
import warnings

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"

_FENCE = re.compile(r"^```(?P<info>[^`\n]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks(text):
    """``(line number, source)`` of every block fenced exactly ```python (no further words), in order."""
    blocks = []
    for m in _FENCE.finditer(text):
        if m.group("info").strip() == "python":
            line = text.count("\n", 0, m.start("body")) + 1
            blocks.append((line, m.group("body")))
    return blocks


def test_the_parser_sees_runnable_and_norun_blocks():
    text = "a\n```python\nx = 1\n```\n```python norun\nraise SystemExit\n```\n```bash\nls\n```\n```python\ny = x\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (12, "y = x\n")]


def test_readme_tour_runs(tmp_path, monkeypatch):
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.md has no ```python block"
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. LinearSVC's ConvergenceWarning on the tiny tour
        for line, source in blocks:
            code = compile(source, f"README.md (block at line {line})", "exec")
            try:
                exec(code, namespace)
            except Exception as exc:  # name the block in the failure
                pytest.fail(f"README.md's python block at line {line} failed: {type(exc).__name__}: {exc}")
