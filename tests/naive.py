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


def rowcol_projection(Z, r, c):
    """The r largest |Z| of every row, union the c largest of every column (smaller index wins ties), unit norm."""
    Z = np.asarray(Z, dtype=np.float64)
    n, m = Z.shape
    a = np.abs(Z)
    keep = np.zeros((n, m), dtype=bool)
    for i in range(n):
        keep[i, sorted(range(m), key=lambda j: (-a[i, j], j))[:r]] = True
    for j in range(m):
        keep[sorted(range(n), key=lambda i: (-a[i, j], i))[:c], j] = True
    out = np.where(keep, Z, 0.0)
    nrm = np.sqrt(np.sum(out * out))
    return out / nrm if nrm > 0 else out


def rowcol_feasible(S, r, c):
    """Every nonzero of S charged to its row (at most r each) or its column (at most c): a max-flow problem."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    rows, cols = np.nonzero(S)
    nnz, (n, m) = len(rows), S.shape
    # nodes: source 0, one per nonzero, rows, columns, sink
    e = np.arange(nnz) + 1
    r0, c0, sink = 1 + nnz, 1 + nnz + n, 1 + nnz + n + m
    tails = np.concatenate([np.zeros(nnz, int), e, e, r0 + np.arange(n), c0 + np.arange(m)])
    heads = np.concatenate([e, r0 + rows, c0 + cols, np.full(n + m, sink)])
    caps = np.concatenate([np.ones(3 * nnz, int), np.full(n, r), np.full(m, c)])
    graph = csr_matrix((caps.astype(np.int32), (tails, heads)), shape=(sink + 1, sink + 1))
    return maximum_flow(graph, 0, sink).flow_value == nnz


def chain_product(factors):
    out = np.asarray(factors[0], dtype=np.float64)
    for f in factors[1:]:
        out = out @ np.asarray(f, dtype=np.float64)
    return out


def weighted_chain_error(T, w, factors):
    """||diag(w) (T - S_1 ... S_Q)||_F^2 by explicit products."""
    R = np.asarray(w, dtype=np.float64)[:, None] * (np.asarray(T, dtype=np.float64) - chain_product(factors))
    return float(np.sum(R * R))


def lsq_on_support(T, w, factors, q, mask):
    """argmin of the weighted chain error over factor q supported on mask, by an explicit design matrix."""
    L = np.diag(np.asarray(w, dtype=np.float64))
    for f in factors[:q]:
        L = L @ f
    R = np.eye(factors[q].shape[1])
    for f in factors[q + 1:]:
        R = R @ f
    ii, jj = np.nonzero(mask)
    # column p of the design: vec(L E_{ii[p], jj[p]} R) = outer(L[:, i], R[j, :])
    A = np.stack([np.outer(L[:, i], R[j, :]).ravel() for i, j in zip(ii, jj)], axis=1)
    b = (np.asarray(w, dtype=np.float64)[:, None] * T).ravel()
    x = np.linalg.lstsq(A, b, rcond=None)[0]
    out = np.zeros(factors[q].shape)
    out[ii, jj] = x
    return out


def greedy_ols(A, T, scale, budget):
    """Global greedy orthogonal least squares by brute force: at each step, over every (atom i, column j)
    pair not yet chosen, the one whose exact least-squares refit of column j lowers
    scale_j ||t_j - A x_j||^2 the most (first column, then first atom, on ties). Returns the support mask."""
    a, n = A.shape[1], T.shape[1]
    mask = np.zeros((a, n), dtype=bool)

    def resid(j, cols):
        if not cols:
            return float(T[:, j] @ T[:, j])
        x = np.linalg.lstsq(A[:, cols], T[:, j], rcond=None)[0]
        r = T[:, j] - A[:, cols] @ x
        return float(r @ r)

    for _ in range(budget):
        best, pick = 0.0, None
        for j in range(n):
            cols = list(np.flatnonzero(mask[:, j]))
            base = resid(j, cols)
            for i in range(a):
                if not mask[i, j]:
                    gain = scale[j] * (base - resid(j, cols + [i]))
                    if gain > best * (1 + 1e-9) + 1e-12:
                        best, pick = gain, (i, j)
        if pick is None:
            break
        mask[pick] = True
    return mask
def potential(X, C):
    """Sum over the rows of the squared distance to the nearest centre (the seeding cost)."""
    return assign(X, C)[1].sum()


def bernoulli_rows(n, p, random_state):
    """Rows kept independently with probability p, one coin per row (what geometric skips emulate)."""
    return np.flatnonzero(random_state.uniform(size=n) < p)


def hard_threshold_support(Z, k):
    """Rows of ``Z`` (D x A magnitudes) keeping its ``k`` largest positive entries, ties by row-major order:
    ``(ptr, cols)`` as a CSR support."""
    flat = np.asarray(Z, dtype=np.float64).reshape(-1)
    order = np.lexsort((np.arange(flat.size), -flat))          # largest first, then by position
    keep = np.sort(order[:k][flat[order[:k]] > 0.0])
    a = Z.shape[1]
    ptr = np.concatenate([[0], np.cumsum(np.bincount(keep // a, minlength=Z.shape[0]))])
    return ptr, keep % a


def decaying_mixture(seed, n_centers, n_rows, n_features=200):
    """Gaussian mixture whose centres and noise decay along the features (search bounds need head and tail)."""
    rng = np.random.RandomState(seed)
    centers = rng.normal(size=(n_centers, n_features)) * np.linspace(3.0, 0.2, n_features)
    return centers[rng.randint(n_centers, size=n_rows)] + rng.normal(size=(n_rows, n_features)) * np.linspace(
        1.5, 0.3, n_features)
