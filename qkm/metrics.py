"""Clustering quality statistics modelled on Apache SystemML/SystemDS ``Kmeans-predict.dml``.

Reported names follow that script: ``TSS``; ``WCSS_M``/``BCSS_M`` (the
centres are the *means* of the points in each predicted cluster);
``WCSS_C``/``BCSS_C`` (the centres are the given *centroids*); the ``*_PC``
variants are percentages of TSS; the pair counts ``TRUE_SAME``, ``TRUE_DIFF``,
``FALSE_SAME`` and ``FALSE_DIFF`` (``_CT`` count, ``_PC`` percent of all
n(n-1)/2 pairs); and the tables ``SPEC_TO_PRED`` and ``PRED_TO_SPEC``. We add
``PAIR_PRECISION``, ``PAIR_RECALL``, ``PURITY``, ``AMI`` and ``ARI``.
"""
import numpy as np
import scipy.sparse as sp
from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score

__all__ = ["clustering_scores", "format_scores"]


def _sq_norms(X):
    """Sum of squares of each row, without densifying a sparse ``X``."""
    if sp.issparse(X):
        return np.asarray(X.multiply(X).sum(axis=1)).ravel()
    return np.einsum("ij,ij->i", X, X)


def _sum_of_squares(X, pred, K, centers):
    n = X.shape[0]
    P = sp.csr_matrix((np.ones(n), (np.arange(n), pred)), shape=(n, K))
    sizes = np.bincount(pred, minlength=K).astype(float)
    S = np.asarray((P.T @ X).todense() if sp.issparse(X) else P.T @ X)  # K x D cluster sums
    mu = np.asarray(X.sum(axis=0)).ravel() / n
    M = S / np.maximum(sizes, 1)[:, None]  # empty clusters get a zero mean, as in the DML
    sq = _sq_norms(X)
    if sp.issparse(X):  # expand ||x - c||^2 = ||x||^2 - 2 x.c + ||c||^2 over the cluster sums
        tss = sq.sum() - n * (mu @ mu)
        wcss_m = sq.sum() - np.sum((M * S).sum(axis=1))
        wcss_c = None if centers is None else (
            sq.sum() - 2 * np.sum(S * centers) + sizes @ (centers * centers).sum(axis=1))
    else:
        tss = np.sum((X - mu) ** 2)
        wcss_m = np.sum((X - M[pred]) ** 2)
        wcss_c = None if centers is None else np.sum((X - centers[pred]) ** 2)
    out = {"TSS": max(float(tss), 0.0)}
    with np.errstate(divide="ignore", invalid="ignore"):
        pc = lambda v: float(100.0 * v / out["TSS"]) if out["TSS"] > 0 else float("nan")
        for tag, C, wcss in (("M", M, wcss_m), ("C", centers, wcss_c)):
            if C is None:
                continue
            wcss = max(float(wcss), 0.0)
            bcss = float(sizes @ ((C - mu) ** 2).sum(axis=1))
            out.update({f"WCSS_{tag}": wcss, f"WCSS_{tag}_PC": pc(wcss),
                        f"BCSS_{tag}": bcss, f"BCSS_{tag}_PC": pc(bcss)})
    return out


def _best(counts, ids_rows, ids_cols, row_key, col_key):
    """For each row of a contingency table: size, best column (first on ties), count, fraction."""
    full = np.asarray(counts.sum(axis=1)).ravel()
    dense = counts.toarray()
    best = dense.argmax(axis=1)
    return [{row_key: ids_rows[i].item(), col_key: ids_cols[best[i]].item(),
             "full_ct": int(full[i]), "match_ct": int(dense[i, best[i]]),
             "match_frac": float(dense[i, best[i]] / full[i])} for i in range(len(full))]


def _pair_counts(pred, true):
    cls, ti = np.unique(true, return_inverse=True)
    clu, pi = np.unique(pred, return_inverse=True)
    n = len(pred)
    table = sp.coo_matrix((np.ones(n, dtype=np.int64), (ti, pi)),
                          shape=(len(cls), len(clu))).tocsr()  # duplicates summed
    c2 = lambda a: int(np.sum(a * (a - 1) // 2))
    same_both = c2(table.data)
    same_true = c2(np.asarray(table.sum(axis=1)).ravel())
    same_pred = c2(np.asarray(table.sum(axis=0)).ravel())
    pairs = n * (n - 1) // 2
    counts = {"TRUE_SAME": same_both, "TRUE_DIFF": pairs - same_true - same_pred + same_both,
              "FALSE_SAME": same_pred - same_both, "FALSE_DIFF": same_true - same_both}
    out = {}
    for k, v in counts.items():
        out[f"{k}_CT"] = v
        out[f"{k}_PC"] = 100.0 * v / pairs if pairs else float("nan")
    ratio = lambda a, b: a / b if b else float("nan")
    out["PAIR_PRECISION"] = ratio(same_both, same_pred)
    out["PAIR_RECALL"] = ratio(same_both, same_true)
    out["PURITY"] = float(table.max(axis=0).toarray().sum() / n)
    out["AMI"] = float(adjusted_mutual_info_score(true, pred))
    out["ARI"] = float(adjusted_rand_score(true, pred))
    out["SPEC_TO_PRED"] = _best(table, cls, clu, "class", "best_cluster")
    out["PRED_TO_SPEC"] = _best(table.T.tocsr(), clu, cls, "cluster", "best_class")
    return out


def clustering_scores(X=None, labels_pred=None, labels_true=None, centers=None):
    """Every statistic of SystemML's ``Kmeans-predict.dml`` that the inputs allow.

    Parameters
    ----------
    X : ndarray or scipy sparse matrix of shape (n_samples, n_features), optional
        Data. Enables ``TSS``, ``WCSS_M``, ``BCSS_M`` (and their ``_PC``). Sparse
        input is never densified; only K x D cluster sums are formed.
    labels_pred : array-like of int, shape (n_samples,), optional
        Predicted clusters. If omitted while ``X`` and ``centers`` are given it
        is computed as the nearest centre (first on ties), like the DML script.
    labels_true : array-like of int, shape (n_samples,), optional
        Specified classes. Enables the pair counts, purity tables, AMI and ARI.
    centers : ndarray of shape (n_clusters, n_features), optional
        Centroids; needs ``X``. Enables ``WCSS_C``, ``BCSS_C`` (and ``_PC``);
        ``labels_pred`` must then lie in ``[0, n_clusters)``.

    Returns
    -------
    scores : dict
        ``TSS = sum ||x_i - mean||^2``; ``WCSS_M = sum ||x_i - m_{y_i}||^2`` with
        ``m_k`` the mean of cluster k; ``BCSS_M = sum_k n_k ||m_k - mean||^2``;
        ``WCSS_C``/``BCSS_C`` the same with the centroids ``c_k`` instead of
        ``m_k``; ``*_PC = 100 * value / TSS``. Pairs of distinct points:
        ``TRUE_SAME`` same class and same cluster, ``TRUE_DIFF`` different class
        and different cluster, ``FALSE_SAME`` different class but same cluster,
        ``FALSE_DIFF`` same class but different cluster (``_CT`` counts, ``_PC``
        percent of n(n-1)/2). ``PAIR_PRECISION = TRUE_SAME / (TRUE_SAME +
        FALSE_SAME)``, ``PAIR_RECALL = TRUE_SAME / (TRUE_SAME + FALSE_DIFF)`` (nan
        if the denominator is 0). ``PURITY = sum_k max_c n_kc / n``. ``AMI``,
        ``ARI`` from scikit-learn. ``SPEC_TO_PRED``: list, per class, of dicts
        with ``class, best_cluster, full_ct, match_ct, match_frac``;
        ``PRED_TO_SPEC``: per cluster, ``cluster, best_class, full_ct, match_ct,
        match_frac``. Ties go to the smallest label. Pair statistics are
        computed from the contingency table in O(n + classes * clusters).

    Examples
    --------
    >>> import numpy as np
    >>> from qkm.metrics import clustering_scores
    >>> X = np.array([[0.0, 0.0], [0.0, 2.0], [10.0, 0.0], [10.0, 2.0]])
    >>> s = clustering_scores(X, labels_pred=[0, 0, 1, 1], labels_true=[0, 0, 1, 0])
    >>> s["TSS"], s["WCSS_M"], s["BCSS_M"]
    (104.0, 4.0, 100.0)
    >>> s["TRUE_SAME_CT"], s["FALSE_SAME_CT"], s["FALSE_DIFF_CT"], s["TRUE_DIFF_CT"]
    (1, 1, 2, 2)
    >>> s["PURITY"]
    0.75
    """
    if X is not None:
        X = X.tocsr() if sp.issparse(X) else np.asarray(X, dtype=float)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D, got {X.ndim} dimensions")
    if centers is not None:
        if X is None:
            raise ValueError("centers requires X")
        centers = np.asarray(centers, dtype=float)
        if centers.ndim != 2 or centers.shape[1] != X.shape[1]:
            raise ValueError(f"centers have shape {centers.shape}, expected "
                             f"(n_clusters, {X.shape[1]}) to match X's {X.shape[1]} columns")
        if labels_pred is None:
            d = -2 * np.asarray(X @ centers.T) + (centers * centers).sum(axis=1)
            labels_pred = d.argmin(axis=1)
    labels = {}
    for name, lab in (("labels_pred", labels_pred), ("labels_true", labels_true)):
        if lab is not None:
            lab = np.asarray(lab).ravel()
            if lab.size and not np.issubdtype(lab.dtype, np.integer):
                if not np.all(lab == np.round(lab)):
                    raise ValueError(f"{name} must be integers")
                lab = lab.astype(np.int64)
            labels[name] = lab
    pred, true = labels.get("labels_pred"), labels.get("labels_true")
    if pred is not None and true is not None and len(pred) != len(true):
        raise ValueError(f"labels_pred has {len(pred)} entries but labels_true has {len(true)}")
    if true is not None and pred is None:
        raise ValueError("labels_true requires labels_pred (or X and centers)")
    if X is not None and pred is not None and X.shape[0] != len(pred):
        raise ValueError(f"X has {X.shape[0]} rows but the labels have {len(pred)} entries")
    scores = {}
    if X is not None and X.shape[0] > 0:
        if pred is None:
            one = np.zeros(X.shape[0], dtype=np.int64)  # TSS only: one cluster, no labels
            scores["TSS"] = _sum_of_squares(X, one, 1, None)["TSS"]
        elif centers is not None:
            K = centers.shape[0]
            if pred.min() < 0 or pred.max() >= K:
                raise ValueError(f"labels_pred range [{pred.min()}, {pred.max()}] is outside "
                                 f"[0, {K}) for {K} centers")
            scores.update(_sum_of_squares(X, pred, K, centers))
        else:
            _, inv = np.unique(pred, return_inverse=True)
            scores.update(_sum_of_squares(X, inv.ravel(), int(inv.max()) + 1, None))
    if true is not None and len(true) > 0:
        scores.update(_pair_counts(pred, true))
    return scores


def format_scores(scores):
    """Text report: one ``NAME value`` line per scalar, then the two purity tables.

    Examples
    --------
    >>> from qkm.metrics import clustering_scores, format_scores
    >>> print(format_scores(clustering_scores(labels_pred=[0, 0, 1], labels_true=[0, 0, 0])))
    ... # doctest: +ELLIPSIS
    TRUE_SAME_CT 1
    ...
    Specified categories versus predicted clusters:
    Category 0: best pred. cluster is 0; full count = 3, matching count = 66.6667% (2)
    <BLANKLINE>
    Predicted clusters versus specified categories:
    Cluster 0: best spec. categ. is 0; full count = 2, matching count = 100.0% (2)
    Cluster 1: best spec. categ. is 0; full count = 1, matching count = 100.0% (1)
    """
    lines = [f"{k} {v:.10g}" if isinstance(v, float) else f"{k} {v}"
             for k, v in scores.items() if not isinstance(v, list)]
    tables = (("SPEC_TO_PRED", "Specified categories versus predicted clusters:",
               "Category", "class", "best pred. cluster", "best_cluster"),
              ("PRED_TO_SPEC", "Predicted clusters versus specified categories:",
               "Cluster", "cluster", "best spec. categ.", "best_class"))
    for key, title, word, own, what, best in tables:
        if key in scores:
            lines += ["", title]
            lines += [f"{word} {r[own]}: {what} is {r[best]}; full count = {r['full_ct']}, "
                      f"matching count = {round(100 * r['match_frac'], 4)}% ({r['match_ct']})"
                      for r in scores[key]]
    return "\n".join(lines)
