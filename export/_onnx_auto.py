"""``encoding="auto"``: time candidate graphs in onnxruntime and keep the fastest."""

import time

import numpy as np

__all__ = ["choose", "sample_batches"]


def sample_batches(operator, sample, batch_sizes, seed=0):
    """One float32 batch per batch size: rows of ``sample`` (cycled), or synthetic rows near the centroids.

    Synthetic rows are random centroids plus Gaussian noise of the centroids'
    RMS entry, so values have the model's scale (no denormals, no overflow).
    """
    D = operator.n_features
    n = max(batch_sizes)
    if sample is not None:
        S = np.asarray(sample.toarray() if hasattr(sample, "toarray") else sample, dtype=np.float32)
        if S.ndim != 2 or S.shape[1] != D or S.shape[0] == 0:
            raise ValueError(f"sample must be a non-empty 2-D array with {D} columns; got shape {S.shape}.")
        rows = np.resize(np.arange(S.shape[0]), n)
        X = np.ascontiguousarray(S[rows])
        origin = f"sample ({S.shape[0]} rows)"
    else:
        rng = np.random.default_rng(seed)
        V = np.asarray(operator.to_dense(), dtype=np.float32)
        scale = float(np.sqrt(np.mean(np.square(V, dtype=np.float64)))) or 1.0
        X = V[rng.integers(0, V.shape[0], size=n)] + rng.normal(0.0, scale, size=(n, D)).astype(np.float32)
        X = np.ascontiguousarray(X, dtype=np.float32)
        origin = "random rows near the centroids"
    return {int(B): np.ascontiguousarray(X[:B]) for B in batch_sizes}, origin


def choose(candidates, batches, *, n_threads=1, rounds=None, budget=2.0, tolerance=0.05, min_seconds=1e-3,
           reference=("dense", "sparse"), session=None):
    """Time every candidate and pick one.

    Parameters
    ----------
    candidates : dict name -> bytes
        Serialised models.
    batches : dict batch size -> float32 array
    rounds : int, optional
        Interleaved rounds. In a round every candidate runs at every batch
        size, candidates in rotating order, each call repeated until the cell
        lasts ``min_seconds`` (warm caches, as in a serving loop). Default: as
        many rounds as fit in ``budget`` seconds, at least 3 and at most 25.
    tolerance : float
        Slack for the two comparisons below.
    reference : tuple of str
        Candidates that run the dense ``Gemm`` (``sparse`` is folded into the
        same graph at load); their per-batch minimum is the reference speed.

    Returns
    -------
    name : str
        Among the candidates that are, at every batch size, at most
        ``1 + tolerance`` times slower than the reference (a candidate that
        wins on average but loses at one batch size of interest is not taken),
        the one with the lowest score = geometric mean over the batch sizes of
        its median seconds per call; candidates within ``1 + tolerance`` of
        that best score are ties, and the smallest file wins.
    report : dict (JSON-serialisable): medians, scores, eligibility, file
        bytes, the rule, rounds and repetitions.
    """
    names = list(candidates)
    sessions = {name: session(candidates[name], n_threads) for name in names}
    reps, per_round = {}, 0.0
    for B, X in batches.items():  # warm-up (first-run allocations), not timed; sets repetitions per cell
        for name in names:
            sessions[name].run(None, {"X": X})
            t = time.perf_counter()
            sessions[name].run(None, {"X": X})
            one = max(time.perf_counter() - t, 1e-7)
            reps[name, B] = max(1, int(np.ceil(min_seconds / one)))
            per_round += reps[name, B] * one
    if rounds is None:
        rounds = int(min(25, max(3, budget / per_round)))
    times = {key: [] for key in reps}
    for r in range(rounds):
        shift = r % len(names)
        order = names[shift:] + names[:shift]
        for B, X in batches.items():
            feed = {"X": X}
            for name in order:
                run, n = sessions[name].run, reps[name, B]
                t = time.perf_counter()
                for _ in range(n):
                    run(None, feed)
                times[name, B].append((time.perf_counter() - t) / n)
    median = {name: {str(B): float(np.median(times[name, B])) for B in batches} for name in names}
    score = {name: float(np.exp(np.mean(np.log(list(median[name].values()))))) for name in names}
    refs = [name for name in reference if name in names] or names
    ref = {str(B): min(median[name][str(B)] for name in refs) for B in batches}
    eligible = [name for name in names
                if name in refs or all(median[name][b] <= (1.0 + tolerance) * ref[b] for b in ref)]
    best = min(score[name] for name in eligible)
    ties = [name for name in eligible if score[name] <= best * (1.0 + tolerance)]
    chosen = min(ties, key=lambda name: (len(candidates[name]), score[name]))
    report = {
        "chosen": chosen,
        "rule": (f"eligible = not slower than the fastest of {'/'.join(refs)} by more than {tolerance:.0%} at any "
                 "batch size; score = geometric mean over batch sizes of the median seconds per call; among "
                 f"eligible candidates within {tolerance:.0%} of the best score the smallest file wins"),
        "batch_sizes": [int(B) for B in batches],
        "n_threads": int(n_threads),
        "rounds": int(rounds),
        "calls_per_cell": {name: {str(B): reps[name, B] for B in batches} for name in names},
        "median_seconds": median,
        "score_seconds": score,
        "eligible": eligible,
        "file_bytes": {name: len(candidates[name]) for name in names},
    }
    return chosen, report
