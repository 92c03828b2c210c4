"""Slow, obviously-correct numpy references (the oracles of the tests)."""

import numpy as np
import scipy.sparse as sp


def dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)


def sq_distances(X, C):
    """All squared distances by explicit differences, (n, K)."""
    X = dense(X).astype(np.float64)
    C = np.asarray(C, dtype=np.float64)
    return ((X[:, None, :] - C[None, :, :]) ** 2).sum(axis=2)


def assign(X, C):
    """Brute-force nearest centre: labels and squared distances."""
    d = sq_distances(X, C)
    labels = d.argmin(axis=1)
    return labels, d[np.arange(d.shape[0]), labels]


def lloyd(X, C0, max_iter=300):
    """Plain Lloyd iterations until the labels stop changing (no empty-cluster repair)."""
    C = np.asarray(C0, dtype=np.float64).copy()
    Xd = dense(X)
    labels = None
    for it in range(max_iter):
        new_labels, _ = assign(Xd, C)
        for j in range(C.shape[0]):
            members = Xd[new_labels == j]
            if len(members):
                C[j] = members.mean(axis=0)
        if labels is not None and np.array_equal(labels, new_labels):
            break
        labels = new_labels
    labels, d = assign(Xd, C)
    return labels, d.sum(), C


def kmeans_plusplus(X, K, random_state, n_local_trials):
    """Greedy k-means++ with scikit-learn's sequence of random draws."""
    Xd = dense(X)
    n = Xd.shape[0]
    rs = random_state
    idx = [rs.choice(n, p=np.full(n, 1.0 / n))]
    closest = sq_distances(Xd, Xd[idx])[:, 0]
    pot = closest.sum()
    for _ in range(1, K):
        cand = np.searchsorted(np.cumsum(closest), rs.uniform(size=n_local_trials) * pot)
        cand = np.minimum(cand, n - 1)
        d = np.minimum(closest[None, :], sq_distances(Xd, Xd[cand]).T)
        pots = d.sum(axis=1)
        b = int(np.argmin(pots))
        pot, closest = pots[b], d[b]
        idx.append(int(cand[b]))
    return np.array(idx)


def rbf_kernel(X, Y, gamma):
    """exp(-gamma ||x - y||^2) by explicit differences, (n, m)."""
    return np.exp(-gamma * sq_distances(X, Y))


def mean_sq_pairwise_distance(X):
    """Mean of ||x_i - x_j||^2 over all n^2 ordered pairs (the QK-means paper's sigma^2)."""
    Xd = dense(X)
    return sq_distances(Xd, Xd).mean()


def knn(Xq, X, k):
    """Brute-force k nearest rows of X for every query: (distances, indices), ties to the lowest index."""
    d = sq_distances(Xq, X)
    idx = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.sqrt(np.take_along_axis(d, idx, axis=1)), idx


def potential(X, C):
    """Sum over the rows of the squared distance to the nearest centre (the seeding cost)."""
    return assign(X, C)[1].sum()


def bernoulli_rows(n, p, random_state):
    """Rows kept independently with probability p, one coin per row (what geometric skips emulate)."""
    return np.flatnonzero(random_state.uniform(size=n) < p)
