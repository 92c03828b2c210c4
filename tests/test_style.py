"""House rules that a reviewer would otherwise have to remember."""

import ast
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
            if "fastmath=" in line and "_config.FASTMATH" not in line and path.name != "_config.py":
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


# --------------------------------------------------------------------------- #
# The layers: every import (module level or inside a function) points down
# --------------------------------------------------------------------------- #
ROOT = pathlib.Path(__file__).resolve().parents[1]
#: where each installed package's sources live (``pyproject.toml``'s package-dir)
SOURCE_DIRS = {"qkm": ROOT / "qkm", "qkm.export": ROOT / "export", "qkm.serve": ROOT / "serve"}
#: rooms, bottom-up; a module may import its own room and the rooms below it, never one above
LAYERS = [
    ("core", ["qkm._config", "qkm._version", "qkm._threads", "qkm._validation", "qkm._kernels", "qkm._empty",
              "qkm._reduce", "qkm._data", "qkm.metrics", "qkm.datasets", "qkm.models"]),
    ("operator", ["qkm.operator"]),
    ("factorization", ["qkm.factorization"]),
    ("clustering", ["qkm.clustering"]),
    ("approximate", ["qkm.approximate"]),
    ("io", ["qkm.io"]),
    ("distributed", ["qkm.distributed"]),
    ("export", ["qkm.export"]),
    ("serve", ["qkm.serve"]),
    ("cli", ["qkm.cli"]),
    # the package root and the old module paths kept for compatibility: nothing inside qkm imports them
    ("public face", ["qkm", "qkm.neighbors", "qkm.nystroem", "qkm.palm4msa"]),
]


def _module_name(path):
    for package, folder in sorted(SOURCE_DIRS.items(), key=lambda kv: -len(kv[0])):
        if folder in path.parents:
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            return ".".join([package] + (parts[:-1] if is_package else parts)), is_package
    raise AssertionError(path)


def _room(module):
    best = None
    for rank, (name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[2]:
                    best = (rank, name, len(prefix))
    assert best is not None, f"{module} belongs to no room of LAYERS"
    return best[:2]


def _import_graph():
    """``{module: {imported qkm module, ...}}`` from every import statement of qkm, export and serve."""
    modules = {}
    for path in _sources():
        name, is_package = _module_name(path)
        modules[name] = (path, is_package)
    graph = {}
    for name, (path, is_package) in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif node.module and (node.module == "qkm" or node.module.startswith("qkm.")):
                    target = node.module
                else:
                    continue
                for alias in node.names:  # "from pkg import submodule" imports the submodule
                    sub = f"{target}.{alias.name}"
                    edges.add(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name == "qkm" or a.name.startswith("qkm."))
        for target in list(edges):  # importing a.b.c runs a.b's __init__ first (unless a.b is one's own package)
            parent = target.rsplit(".", 1)[0]
            if "." in target and parent in modules and not name.startswith(parent + ".") and parent != name:
                edges.add(parent)
        graph[name] = {t for t in edges if t in modules and t != name}
    return graph


def _upward(graph):
    upward = []
    for module, targets in graph.items():
        rank, room = _room(module)
        for target in targets:
            t_rank, t_room = _room(target)
            if t_rank > rank:
                upward.append(f"{module} ({room}) imports {target} ({t_room})")
    return sorted(upward)


def _circles(graph):
    state, stack, circles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return circles


def test_imports_point_down_the_layers():
    upward = _upward(_import_graph())
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


def test_no_import_circle():
    circles = _circles(_import_graph())
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_layer_checks_find_what_they_look_for():
    # the graph as the code has it, plus the two arrows this layout removed: the data view importing the
    # operator (a circle through the operator's own import of the data view) and export importing the root
    graph = _import_graph()
    assert "qkm._data" in graph["qkm.operator._base"]
    graph["qkm._data"] = graph["qkm._data"] | {"qkm.operator._base"}
    graph["qkm.export._safe"] = graph["qkm.export._safe"] | {"qkm"}
    assert _upward(graph) == ["qkm._data (core) imports qkm.operator._base (operator)",
                              "qkm.export._safe (export) imports qkm (public face)"]
    assert any(c.startswith("qkm._data -> qkm.operator._base") for c in _circles(graph))


def test_only_distributed_imports_dask():
    offenders = []
    for path in _sources():
        if _module_name(path)[0].startswith("qkm.distributed"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n.split(".")[0] in ("dask", "distributed") for n in names):
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, offenders
