"""The public names and the module paths users import, old and new, and the artefacts they wrote before the move."""

import ast
import importlib
import pathlib
import sys

import numpy as np
import pytest

import qkm

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: module path -> the public names it must offer (the old paths are kept as aliases)
PUBLIC = {
    "qkm": ["ClusterIndex", "KMeans", "LowRankKMeans", "Nystroem", "QKMeans", "kernel_approximation_error",
            "kmeans_plusplus", "seed_centers", "__version__"],
    "qkm.clustering": ["KMeans", "LowRankKMeans", "QKMeans", "kmeans_plusplus", "seed_centers"],
    "qkm.approximate": ["ClusterIndex", "Nystroem", "kernel_approximation_error"],
    "qkm.operator": ["CentroidOperator", "DenseOperator", "FactorChainOperator", "make_operator"],
    "qkm.factorization": ["PalmResult", "chain_shapes", "factorize", "hierarchical_palm4msa", "palm4msa",
                          "project_splincol"],
    "qkm.io": ["DataFormatError", "load_data", "load_labels", "save_centroids", "save_labels"],
    "qkm.cli": ["main", "build_parser"],
    "qkm.export": ["FORMAT_VERSION", "LoadedModel", "Model", "ModelFormatError", "as_model", "data_fingerprint",
                   "load_joblib", "load_model", "save_joblib", "save_model", "to_onnx"],
    "qkm.serve": ["RequestError", "ServeSettings", "create_app", "demo_model_path", "run"],
    "qkm.metrics": ["clustering_scores", "format_scores"],
    "qkm.datasets": ["fashion_mnist_sample_path", "load_fashion_mnist_sample"],
    # old paths, kept importable
    "qkm.neighbors": ["ClusterIndex"],
    "qkm.nystroem": ["Nystroem", "kernel_approximation_error"],
    "qkm.palm4msa": ["PalmResult", "chain_shapes", "factorize", "hierarchical_palm4msa", "palm4msa",
                     "project_splincol"],
}
#: where the object behind each old path lives today
SAME_AS = {"qkm.neighbors": "qkm.approximate", "qkm.nystroem": "qkm.approximate", "qkm.palm4msa": "qkm.factorization"}


@pytest.mark.parametrize("path", sorted(PUBLIC))
def test_public_path_imports_its_names(path):
    module = importlib.import_module(path)
    missing = [name for name in PUBLIC[path] if not hasattr(module, name)]
    assert not missing, f"{path} lacks {missing}"
    if path in SAME_AS:
        today = importlib.import_module(SAME_AS[path])
        assert all(getattr(module, n) is getattr(today, n) for n in PUBLIC[path])
    for name in PUBLIC[path]:
        obj = getattr(module, name)
        if hasattr(obj, "__module__") and path in ("qkm", "qkm.clustering", "qkm.approximate"):
            assert getattr(qkm, name, obj) is obj  # one object whichever path it is reached by


def test_distributed_path_imports_where_dask_is_installed():
    pytest.importorskip("distributed")
    from qkm.distributed import SchedulerUnreachable, ShardedData, StateLost, VersionMismatch, check_versions, connect

    assert ShardedData.__module__ == "qkm.distributed._sharded_data"
    assert callable(connect) and callable(check_versions)
    assert issubclass(SchedulerUnreachable, Exception) and issubclass(VersionMismatch, Exception)
    assert issubclass(StateLost, Exception)


def _top_level_definitions():
    """``{name: [module file, ...]}`` of every function and class defined at the top of a qkm module."""
    found = {}
    for folder in ("qkm", "export", "serve"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    found.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    return found


def test_no_private_twin_shadows_a_public_name():
    # a public function or class is defined in one module only: no private function of the same name elsewhere
    definitions = _top_level_definitions()
    public = {name for names in PUBLIC.values() for name in names if not name.startswith("_")}
    twins = {name: files for name, files in definitions.items() if name in public and len(files) > 1}
    assert not twins, twins


def test_the_twin_check_sees_definitions():
    definitions = _top_level_definitions()
    assert definitions["make_operator"] == ["qkm/operator/__init__.py"]
    assert definitions["kmeans_plusplus"] == ["qkm/clustering/_kmeans.py"]
    assert definitions["chain_shapes"] == ["qkm/factorization/_shapes.py"]
    assert len(definitions["factorize"]) == 1


def test_joblib_artefact_written_before_the_move_loads(tmp_path, blobs):
    # an artefact of the earlier layout names its operator's class by the old module path
    # (qkm.factorization._chain); make the estimator pickle under that path, then load with it gone
    import joblib

    from qkm.export import load_joblib, save_joblib
    from qkm.operator import _chain

    X = blobs[0]
    est = qkm.QKMeans(4, sparsity_level=2, random_state=0, max_iter=3).fit(X)
    assert type(est.operator_) is _chain.FactorChainOperator
    cls = _chain.FactorChainOperator
    sys.modules["qkm.factorization._chain"] = _chain
    cls.__module__ = "qkm.factorization._chain"
    try:
        save_joblib(est, tmp_path / "old.joblib")
    finally:
        cls.__module__ = "qkm.operator._chain"
        del sys.modules["qkm.factorization._chain"]
    with pytest.raises(ModuleNotFoundError):  # plain joblib cannot read it today ...
        joblib.load(tmp_path / "old.joblib")
    loaded = load_joblib(tmp_path / "old.joblib")  # ... load_joblib can
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
    assert "qkm.factorization._chain" not in sys.modules


def test_every_package_folder_is_in_the_wheel():
    # pyproject.toml lists the packages by hand (export/ and serve/ are mapped into qkm): a new folder must be listed
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {"qkm." + ".".join(p.parent.relative_to(ROOT / "qkm").parts) if p.parent != ROOT / "qkm" else "qkm"
               for p in (ROOT / "qkm").rglob("__init__.py")}
    assert folders - listed == set(), f"package folders missing from pyproject.toml: {sorted(folders - listed)}"
