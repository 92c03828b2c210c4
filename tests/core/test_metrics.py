import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score

from qkm.metrics import clustering_scores, format_scores


def brute_pairs(pred, true):
    c = dict.fromkeys(["TRUE_SAME", "TRUE_DIFF", "FALSE_SAME", "FALSE_DIFF"], 0)
    for i, j in itertools.combinations(range(len(pred)), 2):
        sp_, st = pred[i] == pred[j], true[i] == true[j]
        c[("TRUE_" if sp_ == st else "FALSE_") + ("SAME" if sp_ else "DIFF")] += 1
    return c


@pytest.mark.parametrize("seed", range(5))
def test_pair_counts_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = 60
    pred = rng.integers(0, 1 + seed % 4 + 2, n) * 3 - 5  # arbitrary (negative, gappy) ids
    true = rng.integers(0, 4, n)
    s = clustering_scores(labels_pred=pred, labels_true=true)
    b = brute_pairs(pred, true)
    total = n * (n - 1) // 2
    for k, v in b.items():
        assert s[k + "_CT"] == v
        assert s[k + "_PC"] == pytest.approx(100.0 * v / total)
    assert sum(s[k + "_CT"] for k in b) == total
    ts, fs, fd = b["TRUE_SAME"], b["FALSE_SAME"], b["FALSE_DIFF"]
    assert s["PAIR_PRECISION"] == pytest.approx(ts / (ts + fs))
    assert s["PAIR_RECALL"] == pytest.approx(ts / (ts + fd))
    assert s["AMI"] == pytest.approx(adjusted_mutual_info_score(true, pred))
    assert s["ARI"] == pytest.approx(adjusted_rand_score(true, pred))


def naive_ss(X, pred, centers):
    mu = X.mean(axis=0)
    K = centers.shape[0]
    M = np.array([X[pred == k].mean(axis=0) if np.any(pred == k) else np.zeros(X.shape[1])
                  for k in range(K)])
    sizes = np.bincount(pred, minlength=K)
    tss = ((X - mu) ** 2).sum()
    out = {"TSS": tss}
    for tag, C in (("M", M), ("C", centers)):
        w = sum(((X[i] - C[pred[i]]) ** 2).sum() for i in range(len(X)))
        b = sum(sizes[k] * ((C[k] - mu) ** 2).sum() for k in range(K))
        out.update({f"WCSS_{tag}": w, f"WCSS_{tag}_PC": 100 * w / tss,
                    f"BCSS_{tag}": b, f"BCSS_{tag}_PC": 100 * b / tss})
    return out


@pytest.mark.parametrize("seed", range(3))
def test_sum_of_squares_dense_and_sparse(seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(50, 7)) * (rng.random((50, 7)) < 0.4)
    K = 5
    pred = rng.integers(0, K - 1, 50)  # cluster K-1 stays empty
    centers = rng.normal(size=(K, 7))
    expected = naive_ss(X, pred, centers)
    dense = clustering_scores(X, pred, centers=centers)
    sparse = clustering_scores(sp.csr_matrix(X), pred, centers=centers)
    assert set(dense) == set(expected) == set(sparse)
    for k, v in expected.items():
        assert dense[k] == pytest.approx(v, rel=1e-10)
        assert sparse[k] == pytest.approx(dense[k], rel=1e-10)
    assert dense["WCSS_M"] + dense["BCSS_M"] == pytest.approx(dense["TSS"])
    without = clustering_scores(sp.csr_matrix(X), pred)  # means only, no _C stats
    assert "WCSS_C" not in without and without["WCSS_M"] == pytest.approx(dense["WCSS_M"])


def test_sparse_input_not_densified():
    X = sp.random(40, 6, density=0.3, format="csr", random_state=0)
    D = X.toarray()
    for attr in ("toarray", "todense", "__array__"):  # any densification of X itself fails
        setattr(X, attr, lambda *a, **k: pytest.fail("X was densified"))
    s = clustering_scores(X, np.arange(40) % 3, centers=np.ones((3, 6)))
    assert s["TSS"] == pytest.approx(((D - D.mean(0)) ** 2).sum())
    assert s["WCSS_C"] == pytest.approx(((D - 1.0) ** 2).sum())


def test_labels_predicted_from_centers():
    X = np.array([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.2, 4.9]])
    centers = np.array([[5.0, 5.0], [0.0, 0.0]])
    s = clustering_scores(X, centers=centers, labels_true=[1, 1, 0, 0])
    assert s["TRUE_SAME_CT"] == 2 and s["FALSE_SAME_CT"] == 0
    assert s["WCSS_C"] == pytest.approx(0.01 + 0.04 + 0.01)
    assert clustering_scores(X) == {"TSS": pytest.approx(((X - X.mean(0)) ** 2).sum())}


def test_purity_toy_case():
    # clusters: 0 -> classes a,a,a,b ; 1 -> b,b,c ; 2 -> c
    pred = [0, 0, 0, 0, 1, 1, 1, 2]
    true = [0, 0, 0, 1, 1, 1, 2, 2]
    s = clustering_scores(labels_pred=pred, labels_true=true)
    assert s["PURITY"] == pytest.approx((3 + 2 + 1) / 8)
    assert s["PRED_TO_SPEC"] == [
        {"cluster": 0, "best_class": 0, "full_ct": 4, "match_ct": 3, "match_frac": 0.75},
        {"cluster": 1, "best_class": 1, "full_ct": 3, "match_ct": 2, "match_frac": 2 / 3},
        {"cluster": 2, "best_class": 2, "full_ct": 1, "match_ct": 1, "match_frac": 1.0}]
    # class 2 is split 1/1 between clusters 1 and 2: ties go to the smaller id
    assert s["SPEC_TO_PRED"] == [
        {"class": 0, "best_cluster": 0, "full_ct": 3, "match_ct": 3, "match_frac": 1.0},
        {"class": 1, "best_cluster": 1, "full_ct": 3, "match_ct": 2, "match_frac": 2 / 3},
        {"class": 2, "best_cluster": 1, "full_ct": 2, "match_ct": 1, "match_frac": 0.5}]
    text = format_scores(s)
    assert "TRUE_SAME_CT 4" in text and "PURITY 0.75" in text
    assert "Cluster 1: best spec. categ. is 1; full count = 3, matching count = 66.6667% (2)" in text
    assert "Category 2: best pred. cluster is 1" in text


def test_validation_errors():
    X = np.zeros((4, 3))
    with pytest.raises(ValueError, match="labels_pred has 4 entries but labels_true has 3"):
        clustering_scores(labels_pred=[0, 1, 0, 1], labels_true=[0, 1, 0])
    with pytest.raises(ValueError, match="X has 4 rows but the labels have 5"):
        clustering_scores(X, [0, 1, 0, 1, 0])
    with pytest.raises(ValueError, match=r"centers have shape \(2, 2\).*3 columns"):
        clustering_scores(X, [0, 1, 0, 1], centers=np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"\[0, 2\] is outside \[0, 2\) for 2 centers"):
        clustering_scores(X, [0, 1, 2, 1], centers=np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"\[-1, 1\] is outside"):
        clustering_scores(sp.csr_matrix(X), [0, 1, -1, 1], centers=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="centers requires X"):
        clustering_scores(labels_pred=[0], centers=np.zeros((1, 3)))
    with pytest.raises(ValueError, match="labels_true requires labels_pred"):
        clustering_scores(labels_true=[0, 1])
