"""qkm.distributed: a fit over shards on Dask gives the in-memory result, bit for bit, and fails cleanly.

Oracle: ``qkm.KMeans.fit`` on the same data in memory, same seed, on this
machine (labels, centres, inertia and iteration count must be equal).
"""

import json
import os
import signal
import socket

import numpy as np
import pytest
import scipy.sparse as sp

pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402

import qkm  # noqa: E402
from qkm import _config  # noqa: E402
from qkm.io._shard_writer import write_shards  # noqa: E402
from qkm.io._shards import ShardError  # noqa: E402
from qkm.cli import main  # noqa: E402
from qkm.distributed import SchedulerUnreachable, ShardedData, VersionMismatch, check_versions, connect  # noqa: E402

pytestmark = pytest.mark.distributed

B = 64  # rows per summation block in these tests: several blocks and shards on tiny data
N, D, K = 420, 12, 5
LAYOUTS = {"1 shard": [N], "2 shards": [256, N - 256], "3 shards + empty": [128, 0, 128, N - 256]}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(_config, "REDUCE_BLOCK_ROWS", B)
    monkeypatch.setattr(_config, "DENSE_BLOCK_ROWS", B)  # BLAS blocks of dense data must divide B


@pytest.fixture(scope="module")
def inproc_client():
    # workers as threads of this process; every listener on 127.0.0.1 (tcp: inproc cannot bind a host)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, host="127.0.0.1", protocol="tcp",
                      dashboard_address=None, worker_dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def process_client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    centres = 3 * rng.standard_normal((K, D))
    X = centres[rng.integers(0, K, N)] + rng.standard_normal((N, D))
    return {"dense": X, "csr": sp.csr_matrix(np.where(rng.random((N, D)) < 0.35, np.abs(X), 0.0))}


def shards(tmp_path_factory, X, sizes):
    directory = tmp_path_factory.mktemp("shards") / "sh"
    write_shards(X, directory, sizes=sizes)
    return directory


def assert_same_fit(got, ref):
    np.testing.assert_array_equal(np.asarray(got.labels_.compute()), ref.labels_)
    np.testing.assert_array_equal(got.cluster_centers_, ref.cluster_centers_)
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-12)
    assert got.inertia_ == ref.inertia_  # the same summation order: the same bits
    assert got.n_iter_ == ref.n_iter_


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["dense", "csr"])
@pytest.mark.parametrize("algorithm", ["lloyd", "elkan"])
def test_same_result_as_in_memory(inproc_client, tmp_path_factory, data, kind, layout, algorithm):
    X = data[kind]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS[layout]), inproc_client)
    kw = dict(n_clusters=K, random_state=3, algorithm=algorithm, max_iter=30)
    assert_same_fit(qkm.KMeans(**kw).fit(sd), qkm.KMeans(**kw).fit(X))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["dense", "csr"])
def test_kmeans_parallel_seeding_on_the_shards(inproc_client, tmp_path_factory, data, kind, layout):
    """k-means|| runs where the rows are (one chunk per shard): the seeds and the fit of the in-memory run."""
    X = data[kind]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS[layout]), inproc_client)
    kw = dict(n_clusters=K, init="k-means||", random_state=11, oversampling_factor=1.0, init_rounds=3, max_iter=30)
    got, ref = qkm.KMeans(**kw).fit(sd), qkm.KMeans(**kw).fit(X)
    assert got.history_[0]["seeding"] == "k-means||"
    assert got.history_[0]["seeding_cost"] == pytest.approx(ref.history_[0]["seeding_cost"], rel=1e-12)
    assert_same_fit(got, ref)
    assert not any("kmpar" in str(k) for st in inproc_client.gather(sd._submit_each(_state_keys)) for k in st)


def _state_keys(shard):
    return list(shard.state)


@pytest.mark.parametrize("init", ["d2-seeding", "k-means++"])
def test_driver_seedings_on_the_whole_data(inproc_client, tmp_path_factory, data, init):
    X = data["csr"]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS["3 shards + empty"]), inproc_client)
    kw = dict(n_clusters=K, init=init, n_init=2, random_state=4, max_iter=30)
    got, ref = qkm.KMeans(**kw).fit(sd), qkm.KMeans(**kw).fit(X)
    assert got.history_[0]["seeding"] == init
    assert_same_fit(got, ref)


def test_init_sample_is_refused_on_shards(inproc_client, tmp_path_factory, data):
    sd = ShardedData(shards(tmp_path_factory, data["dense"], LAYOUTS["2 shards"]), inproc_client)
    with pytest.raises(ValueError, match="init_sample"):
        qkm.KMeans(n_clusters=K, init_sample=2.0).fit(sd)


@pytest.mark.parametrize("algorithm", ["lloyd", "elkan"])
def test_empty_cluster_repaired_from_the_shards_candidates(inproc_client, tmp_path_factory, data, algorithm):
    X = data["csr"]
    init = np.vstack([X[:K - 1].toarray(), np.full((1, D), 1e3)])  # nothing is near the last centre
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS["3 shards + empty"]), inproc_client)
    kw = dict(n_clusters=K, init=init, algorithm=algorithm, max_iter=20)
    got, ref = qkm.KMeans(**kw).fit(sd), qkm.KMeans(**kw).fit(X)
    assert got.history_[0]["relocated"] == 1
    assert_same_fit(got, ref)


def test_random_init_several_runs_and_tolerance(inproc_client, tmp_path_factory, data):
    X = data["dense"]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS["2 shards"]), inproc_client)
    kw = dict(n_clusters=K, init="random", n_init=3, random_state=7, tol=1e-2, tol_wcss=1e-3, max_iter=15)
    assert_same_fit(qkm.KMeans(**kw).fit(sd), qkm.KMeans(**kw).fit(X))


def test_labels_written_next_to_each_shard(inproc_client, tmp_path_factory, data):
    X = data["csr"]
    directory = shards(tmp_path_factory, X, LAYOUTS["3 shards + empty"])
    sd = ShardedData(directory, inproc_client)
    km = qkm.KMeans(n_clusters=K, random_state=0).fit(sd)
    paths = sd.write_labels("labels")
    assert [os.path.basename(p) for p in paths] == ["shard-00000.labels.npy", "shard-00002.labels.npy",
                                                    "shard-00003.labels.npy"]
    np.testing.assert_array_equal(np.concatenate([np.load(p) for p in paths]), km.labels_.compute())
    np.testing.assert_array_equal(sd.predict(km.cluster_centers_).compute(), km.predict(X))


def test_unaligned_shards_are_refused(inproc_client, tmp_path):
    os.makedirs(tmp_path / "sh")
    write_shards(np.ones((200, 3)), tmp_path / "ok", sizes=[128, 72])
    manifest = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    manifest["shards"][0]["n_rows"], manifest["shards"][1]["n_rows"] = 100, 100  # hand-edited layout
    manifest["shards"][1]["row_start"] = 100
    (tmp_path / "ok" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="not a whole node"):
        ShardedData(tmp_path / "ok", inproc_client)


def test_shards_placed_on_workers_by_work(inproc_client, tmp_path_factory, data):
    """Shards go to workers in contiguous runs balanced on stored entries + rows, not on rows alone; the same
    placement for the same manifest and workers; the fit is the in-memory one."""
    from qkm.distributed._sharded_data import _balanced_slots

    X = data["csr"].tolil()
    X[:128] = np.abs(data["dense"][:128]) + 1.0  # the first shard holds most of the entries
    X = X.tocsr()
    directory = shards(tmp_path_factory, X, [128, 128, 64, 64, N - 384])
    sd, again = ShardedData(directory, inproc_client), ShardedData(directory, inproc_client)
    workers = sorted(inproc_client.scheduler_info()["workers"])
    sd.load()
    again.load()
    assert sd.owners == again.owners == [workers[s] for s in _balanced_slots(sd.work(), 2)]
    assert sd.owners == [workers[0]] + [workers[1]] * 4  # by rows alone: the first two shards on one worker
    assert _balanced_slots(sd.sizes, 2).tolist() == [0, 0, 1, 1, 1]
    kw = dict(n_clusters=K, random_state=2, max_iter=5, tol=0)
    got, ref = qkm.KMeans(**kw).fit(sd), qkm.KMeans(**kw).fit(X)
    np.testing.assert_array_equal(inproc_client.compute(got.labels_, sync=True), ref.labels_)
    assert got.inertia_ == ref.inertia_


# --------------------------------------------------------------------------- worker processes


@pytest.mark.parametrize("kind, algorithm", [("csr", "lloyd"), ("dense", "elkan")])
def test_worker_processes(process_client, tmp_path_factory, data, kind, algorithm):
    X = data[kind]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS["3 shards + empty"]), process_client)
    kw = dict(n_clusters=K, random_state=5, algorithm=algorithm, max_iter=30)
    assert_same_fit(qkm.KMeans(**kw).fit(sd), qkm.KMeans(**kw).fit(X))


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["lloyd", "elkan"])
def test_worker_killed_mid_fit(process_client, tmp_path_factory, data, algorithm):
    """SIGKILL a worker process during the fit: the nanny restarts it, shards reload, the result is the same."""
    X = data["csr"]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS["2 shards"]), process_client)
    pids = process_client.run(os.getpid)
    killed = []

    def kill_one(record):
        if record["iteration"] == 2 and not killed:
            victim = sd.owners[-1]
            os.kill(pids[victim], signal.SIGKILL)
            killed.append(victim)

    kw = dict(n_clusters=K, init=X[:K].toarray(), algorithm=algorithm, max_iter=30, tol=0)
    ref = qkm.KMeans(**kw).fit(X)
    got = qkm.KMeans(**kw).fit(sd, callback=kill_one)
    assert killed and ref.n_iter_ > 3
    assert sd.n_retries >= 1
    assert_same_fit(got, ref)
    process_client.wait_for_workers(2, timeout=60)


def test_version_mismatch_is_a_clear_error(process_client):
    from qkm.distributed._cluster import local_versions

    expected = dict(local_versions(), qkm="0.0.0-other")
    with pytest.raises(VersionMismatch, match="qkm 0.0.0-other here"):
        check_versions(process_client, expected=expected)
    check_versions(process_client)  # the real versions agree


def test_shard_changed_during_fit(process_client, tmp_path_factory, data):
    X = data["dense"]
    directory = shards(tmp_path_factory, X, LAYOUTS["2 shards"])
    sd = ShardedData(directory, process_client)

    def rewrite(record):
        if record["iteration"] == 1:
            np.save(directory / "shard-00001.npy", np.zeros((N - 256, D)))

    with pytest.raises(ShardError, match="shard-00001 changed on disk"):
        qkm.KMeans(n_clusters=K, random_state=0, max_iter=10, tol=0).fit(sd, callback=rewrite)


def test_unreachable_scheduler(tmp_path, data):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SchedulerUnreachable, match=f"127.0.0.1:{port}"):
        with connect(f"tcp://127.0.0.1:{port}", timeout=1):
            pass
    write_shards(data["dense"], tmp_path / "sh", sizes=LAYOUTS["2 shards"])
    model = tmp_path / "m.qkm"
    assert main(["train", str(tmp_path / "sh"), "-k", "3", "-o", str(model), "-q",
                 "--scheduler", f"tcp://127.0.0.1:{port}"]) == 2
    assert not model.exists()


def train_on_cluster_and_in_memory(tmp_path, X, capsys, args):
    """`qkm train` on the shards of ``X`` with ``--scheduler local:2`` (a.qkm) and in memory (b.qkm).

    Checks that the labels written next to each shard are those of the in-memory command; returns both
    JSON summaries and the labels.
    """
    write_shards(X, tmp_path / "sh", sizes=LAYOUTS["3 shards + empty"])
    args = ["-k", str(K), "--seed", "0", "-q", "--json"] + args
    assert main(["train", str(tmp_path / "sh"), "-o", str(tmp_path / "a.qkm"), "--scheduler", "local:2",
                 "--labels", "labels.npy"] + args) == 0
    on_cluster = json.loads(capsys.readouterr().out)
    assert main(["train", str(tmp_path / "sh"), "-o", str(tmp_path / "b.qkm"), "--labels",
                 str(tmp_path / "labels_in_memory.npy")] + args) == 0
    in_memory = json.loads(capsys.readouterr().out)
    assert on_cluster["workers"] == 2
    written = [tmp_path / "sh" / f"shard-0000{i}.labels.npy" for i in (0, 2, 3)]
    expected = np.load(tmp_path / "labels_in_memory.npy")
    np.testing.assert_array_equal(np.concatenate([np.load(p) for p in written]), expected)
    return on_cluster, in_memory, expected


@pytest.mark.slow
def test_cli_train_and_predict_on_local_cluster(tmp_path, data, capsys):
    """`qkm train DIR --scheduler local:2` end to end, labels next to each shard, as in memory."""
    on_cluster, in_memory, expected = train_on_cluster_and_in_memory(tmp_path, data["csr"], capsys, [])
    assert on_cluster["inertia"] == in_memory["inertia"]
    assert main(["predict", str(tmp_path / "a.qkm"), str(tmp_path / "sh"), "--scheduler", "local:2",
                 "-o", "pred"]) == 0
    capsys.readouterr()
    np.testing.assert_array_equal(
        np.concatenate([np.load(tmp_path / "sh" / f"shard-0000{i}.pred.npy") for i in (0, 2, 3)]), expected)


# --------------------------------------------------------------------------- QK-means over shards


def assert_same_factored_fit(got, ref, client):
    """Labels identical, objective equal to 1e-12 relative (the same bits here), same factors and history.

    The labels are computed on the fit's own client (``compute()`` would use the newest one of this process).
    """
    np.testing.assert_array_equal(client.compute(got.labels_, sync=True), ref.labels_)
    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-12)
    np.testing.assert_allclose(got.objective_history_, ref.objective_history_, rtol=1e-12, atol=0)
    assert got.n_iter_ == ref.n_iter_
    assert len(got.factors_) == len(ref.factors_)
    for f, g in zip(got.factors_, ref.factors_):
        np.testing.assert_array_equal(f.toarray(), g.toarray())
    np.testing.assert_array_equal(got.cluster_centers_, ref.cluster_centers_)


QK = dict(n_clusters=K, sparsity_level=2, max_iter=8, palm_warm_iter=3, palm_max_iter=10)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["dense", "csr"])
def test_qkmeans_same_result_as_in_memory(inproc_client, tmp_path_factory, data, kind, layout):
    X = data[kind]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS[layout]), inproc_client)
    kw = dict(QK, random_state=3, center=kind == "dense")
    got, ref = qkm.QKMeans(**kw).fit(sd), qkm.QKMeans(**kw).fit(X)
    assert_same_factored_fit(got, ref, inproc_client)
    assigned = [r for r in got.history_ if r["step"] == "assign"]
    assert assigned and all(r["storage"] == "shards" and r["sent_bytes"] > 0 for r in assigned)


def test_qkmeans_with_a_large_v_never_folds_it(inproc_client, tmp_path_factory, data, monkeypatch):
    """Every V counted as large: driver and workers use the streamed norms (sent with the factors), same fit."""
    from qkm import _config
    from qkm.operator._chain import FactorChainOperator
    monkeypatch.setattr(_config, "FOLD_MAX_BYTES", 0)
    folded = []
    real_fold = FactorChainOperator._fold64
    monkeypatch.setattr(FactorChainOperator, "_fold64", lambda self: folded.append(1) or real_fold(self))
    X = data["csr"]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS["3 shards + empty"]), inproc_client)
    kw = dict(QK, random_state=5)
    got, ref = qkm.QKMeans(**kw).fit(sd), qkm.QKMeans(**kw).fit(X)
    assert len(folded) == 0         # never in a fit: cluster_centers_ is folded on first access
    assert_same_factored_fit(got, ref, inproc_client)
    assert len(folded) == 2         # only for the two fits' cluster_centers_


def test_qkmeans_seed_assignment_on_the_shards(inproc_client, tmp_path_factory, data, monkeypatch):
    """From SEED_ASSIGN_MIN_CLUSTERS on, the first chain fits the seeds' clusters' means: on the shards too."""
    from qkm.clustering import _fitters
    monkeypatch.setattr(_fitters, "SEED_ASSIGN_MIN_CLUSTERS", 2)
    X = data["dense"]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS["3 shards + empty"]), inproc_client)
    init = np.vstack([X[:K - 1], np.full((1, D), 1e3)])       # nothing is near the last centre
    got, ref = qkm.QKMeans(**dict(QK, init=init)).fit(sd), qkm.QKMeans(**dict(QK, init=init)).fit(X)
    assert ref.history_[0]["step"] == "seed-assign" and ref.history_[0]["relocated"] == 1
    assert [r.get("relocated") for r in got.history_] == [r.get("relocated") for r in ref.history_]
    assert_same_factored_fit(got, ref, inproc_client)


def test_qkmeans_empty_cluster_and_lowrank_on_the_shards(inproc_client, tmp_path_factory, data):
    """An empty cluster repaired from the shards' candidates; LowRankKMeans runs the same loop."""
    X = data["csr"]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS["3 shards + empty"]), inproc_client)
    init = np.vstack([X[:K - 1].toarray(), np.full((1, D), 1e3)])  # nothing is near the last centre
    kw = dict(QK, init=init)
    got, ref = qkm.QKMeans(**kw).fit(sd), qkm.QKMeans(**kw).fit(X)
    assert ref.history_[2]["step"] == "refit" and ref.history_[2]["relocated"] == 1
    assert [r.get("relocated") for r in got.history_] == [r.get("relocated") for r in ref.history_]
    assert_same_factored_fit(got, ref, inproc_client)
    kw = dict(n_clusters=K, rank=2, random_state=1, max_iter=6, n_init=2)
    assert_same_factored_fit(qkm.LowRankKMeans(**kw).fit(sd), qkm.LowRankKMeans(**kw).fit(X), inproc_client)


@pytest.fixture(scope="module")
def wide():
    """N documents of 12 words over 3,000 (wide: the fit keeps its means as CSR), 5 topics."""
    rng = np.random.default_rng(4)
    rows = np.repeat(np.arange(N), 12)
    cols = rng.integers(0, 600, size=N * 12) + (rows % 5) * 600
    X = sp.csr_matrix((rng.random(N * 12) + 0.2, (rows, cols)), shape=(N, 3000))
    X.sum_duplicates()
    return X


@pytest.mark.parametrize("algorithm", ["lloyd", "elkan"])
def test_kmeans_compact_packs_on_wide_shards(inproc_client, tmp_path_factory, wide, algorithm, monkeypatch):
    """Wide CSR shards: the centres travel as CSR and the workers build C^T from it (Lloyd never densifies
    them; Elkan's bounds do, on demand); the fit is the in-memory one."""
    from qkm.distributed import _packs
    from qkm.distributed import _shard_tasks as T

    kinds, densified = [], []
    real_operator, real_unpack = T._operator, _packs._unpack

    def operator(pack):
        op = real_operator(pack)
        kinds.append(type(op).__name__)
        return op

    monkeypatch.setattr(T, "_operator", operator)
    monkeypatch.setattr(_packs, "_unpack", lambda pack: densified.append(sp.issparse(pack[0])) or real_unpack(pack))
    sd = ShardedData(shards(tmp_path_factory, wide, LAYOUTS["3 shards + empty"]), inproc_client)
    kw = dict(n_clusters=K, random_state=1, algorithm=algorithm, max_iter=6)
    got, ref = qkm.KMeans(**kw).fit(sd), qkm.KMeans(**kw).fit(wide)
    # the labels on the fit's own client (``compute()`` would use the newest one of this process)
    np.testing.assert_array_equal(inproc_client.compute(got.labels_, sync=True), ref.labels_)
    np.testing.assert_array_equal(got.cluster_centers_, ref.cluster_centers_)
    assert got.inertia_ == ref.inertia_ and got.n_iter_ == ref.n_iter_
    assert kinds and set(kinds) == {"_SharedCSROperator"}
    assert any(densified) == (algorithm == "elkan")


@pytest.mark.parametrize("algorithm", ["lloyd", "elkan"])
def test_means_in_place_with_empty_cluster_and_lost_state_on_wide_shards(inproc_client, tmp_path_factory, wide,
                                                                          algorithm, monkeypatch):
    """Centres sent as CSR, so the driver writes the means in place: an empty cluster repaired, and a shard's
    state lost at iteration 2 (rebuilt from the previous iteration's compact pack); the fit is the in-memory one."""
    from qkm.distributed import _shard_tasks as T

    real_state, dropped = T._state, []

    def losing_state(shard, key, it, rebuild):  # called inside the tasks (functions sent to workers are copies)
        if it == 2 and rebuild is None:  # the state of iteration 1 is gone: the driver repeats the iteration
            dropped.append(shard.state.pop(key, None))
            raise T.StateLost("dropped by the test")
        return real_state(shard, key, it, rebuild)

    monkeypatch.setattr(T, "_state", losing_state)
    from qkm.distributed import _driver

    real_next, in_place = _driver._next_buffer, []

    def next_buffer(sent, C, ring):
        out = real_next(sent, C, ring)
        in_place.append(out is C)
        return out

    monkeypatch.setattr(_driver, "_next_buffer", next_buffer)
    far = sp.csr_matrix((np.full(3, 1e3), ([0, 0, 0], [1, 2, 3])), shape=(1, wide.shape[1]))
    init = sp.vstack([wide[:K - 1], far]).toarray()  # nothing is near the last centre
    sd = ShardedData(shards(tmp_path_factory, wide, LAYOUTS["3 shards + empty"]), inproc_client)
    kw = dict(n_clusters=K, init=init, algorithm=algorithm, max_iter=8, tol=0)
    got, ref = qkm.KMeans(**kw).fit(sd), qkm.KMeans(**kw).fit(wide)
    assert dropped and sd.n_retries == 1 and got.history_[0]["relocated"] == 1
    assert in_place and all(in_place)
    np.testing.assert_array_equal(inproc_client.compute(got.labels_, sync=True), ref.labels_)
    np.testing.assert_array_equal(got.cluster_centers_, ref.cluster_centers_)
    assert got.inertia_ == ref.inertia_ and got.n_iter_ == ref.n_iter_ > 2


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_state_lost_while_seeding(inproc_client, tmp_path_factory, data, init, monkeypatch):
    """A worker's state lost while the seeding fetches rows and while its potential is summed: both are
    retried with the same draws, and the fit is the in-memory one."""
    from qkm.distributed import _seeding as DS
    from qkm.distributed import _shard_tasks as T

    marks = tmp_path_factory.mktemp("lost")

    def losing_once(fn, name):  # the tasks run copies of these functions: the mark is a file
        def task(*args, **kwargs):
            mark = marks / name
            if not mark.exists():
                mark.touch()
                raise T.StateLost("dropped by the test")
            return fn(*args, **kwargs)
        return task

    monkeypatch.setattr(T, "all_rows", losing_once(T.all_rows, "fetch"))
    monkeypatch.setattr(T, "rows", losing_once(T.rows, "fetch"))
    monkeypatch.setattr(DS, "potential_task", losing_once(DS.potential_task, "sum"))
    X = data["csr"]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS["2 shards"]), inproc_client)
    kw = dict(n_clusters=K, init=init, random_state=5, max_iter=4, tol=0, n_init=1)
    got, ref = qkm.KMeans(**kw).fit(sd), qkm.KMeans(**kw).fit(X)
    assert (marks / "fetch").exists() and (marks / "sum").exists() and sd.n_retries == 2
    np.testing.assert_array_equal(inproc_client.compute(got.labels_, sync=True), ref.labels_)
    np.testing.assert_array_equal(got.cluster_centers_, ref.cluster_centers_)
    assert got.inertia_ == ref.inertia_
    assert got.history_[0]["seeding_cost"] == pytest.approx(ref.history_[0]["seeding_cost"], rel=1e-12)


@pytest.mark.parametrize("direct", [True, False])
def test_phases_recorded_and_scheduler_hop(inproc_client, tmp_path_factory, data, direct):
    """Each iteration's phases are kept (driver and shard tasks); through the scheduler or straight to the
    workers, the fit is the in-memory one."""
    X = data["csr"]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS["2 shards"]), inproc_client, direct_to_workers=direct)
    assert sd.direct is direct
    kw = dict(n_clusters=K, random_state=3, max_iter=4, tol=0, n_init=1)
    got, ref = qkm.KMeans(**kw).fit(sd), qkm.KMeans(**kw).fit(X)
    np.testing.assert_array_equal(inproc_client.compute(got.labels_, sync=True), ref.labels_)
    np.testing.assert_array_equal(got.cluster_centers_, ref.cluster_centers_)
    assert got.inertia_ == ref.inertia_
    assert len(sd.rounds) == got.n_iter_
    for start, end, events in sd.rounds:
        names = {e[2] for e in events}
        assert {"scatter", "submit", "wait", "result", "means", "assign", "sums", "combine"} <= names
        assert {e[1] for e in events if e[2] == "assign"} == {0, 1}  # one per shard
        assert all(start <= e[3] <= e[4] <= end for e in events)


@pytest.mark.parametrize("layout, seeds", [(layout, "k-means++") for layout in LAYOUTS] + [
    ("3 shards + empty", s) for s in ("array with an empty cluster", "random", "k-means||", "d2-seeding")])
def test_qkmeans_csr_means_on_wide_shards(inproc_client, tmp_path_factory, wide, layout, seeds, monkeypatch):
    """Wide CSR shards: the driver seeds as CSR, combines the shards' CSR sums into CSR means (no dense K x D)
    and repairs an empty cluster from the shards' candidates as in memory; the fit is the in-memory one."""
    from qkm.distributed import _factored

    from qkm.distributed import _packs

    given, densified = [], []
    real = _factored.factored_lloyd
    monkeypatch.setattr(_factored, "factored_lloyd", lambda data, seeds, *a, **kw: given.append(seeds) or real(
        data, seeds, *a, **kw))
    real_unpack = _packs._unpack  # the workers (in this process) never densify CSR centres either
    monkeypatch.setattr(_packs, "_unpack", lambda pack: densified.append(sp.issparse(pack[0])) or real_unpack(pack))
    sd = ShardedData(shards(tmp_path_factory, wide, LAYOUTS[layout]), inproc_client)
    kw = dict(n_clusters=K, n_factors=3, sparsity_level=2, max_iter=5, palm_max_iter=4, random_state=2)
    if seeds == "array with an empty cluster":  # nothing is near the last centre
        kw["init"] = np.vstack([wide[:K - 1].toarray(), np.full((1, wide.shape[1]), 5.0)])
    elif seeds != "k-means++":
        kw["init"] = seeds
    got, ref = qkm.QKMeans(**kw).fit(sd), qkm.QKMeans(**kw).fit(wide)
    assert len(given) == 1 and sp.isspmatrix_csr(given[0]) and given[0].dtype == np.float64
    assert not any(densified)
    assert got.history_[0]["seeding_cost"] == pytest.approx(ref.history_[0]["seeding_cost"], rel=1e-12)
    for est in (got, ref):
        assert {r["means"] for r in est.history_ if "means" in r} == {"csr"}
    assert [r.get("relocated") for r in got.history_] == [r.get("relocated") for r in ref.history_]
    if seeds == "array with an empty cluster":
        assert any(r.get("relocated") for r in ref.history_)
    assert_same_factored_fit(got, ref, inproc_client)


@pytest.mark.slow
def test_qkmeans_worker_killed_mid_fit(process_client, tmp_path_factory, data):
    """SIGKILL a worker process after the first iteration of a QK-means fit: labels rebuilt, the same result."""
    X = data["csr"]
    sd = ShardedData(shards(tmp_path_factory, X, LAYOUTS["2 shards"]), process_client)
    pids = process_client.run(os.getpid)
    killed = []

    def kill_one(record):
        if record["step"] == "refit" and not killed:
            victim = sd.owners[-1]
            os.kill(pids[victim], signal.SIGKILL)
            killed.append(victim)

    kw = dict(QK, init=X[:K].toarray(), max_iter=5, tol=0)
    ref = qkm.QKMeans(**kw).fit(X)
    got = qkm.QKMeans(**kw).fit(sd, callback=kill_one)
    assert killed and ref.n_iter_ > 2
    assert sd.n_retries >= 1
    assert_same_factored_fit(got, ref, process_client)
    process_client.wait_for_workers(2, timeout=60)


@pytest.mark.slow
def test_cli_train_qkmeans_on_local_cluster(tmp_path, data, capsys):
    """`qkm train DIR --algorithm qkmeans --scheduler local:2`: the model and labels of the in-memory command."""
    from qkm.export import load_model

    on_cluster, in_memory, _ = train_on_cluster_and_in_memory(tmp_path, data["dense"], capsys,
                                                              ["--algorithm", "qkmeans", "--max-iter", "4"])
    assert on_cluster["inertia"] == pytest.approx(in_memory["inertia"], rel=1e-12)
    a, b = load_model(tmp_path / "a.qkm"), load_model(tmp_path / "b.qkm")
    np.testing.assert_array_equal(a.operator.to_dense(), b.operator.to_dense())
