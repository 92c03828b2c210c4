"""The data sets of the QuickK-means paper's experiments, as the benchmarks load them (benchmark helper).

* ``fashion-mnist``: the 60,000 training images, pixels / 255 (784 features);
* ``coil20``: the 1,440 images of COIL-20 at 32 x 32, pixels / 255 (1,024 features);
* ``kddcup99``: the 494,021 rows of KDD Cup 1999 (10 %), the three symbolic
  columns one-hot encoded (as in the paper, whose full data set has 116
  columns; the 10 % file has 118) and every numeric column scaled to [0, 1]
  by its range (constant columns become 0); labels are the 23 classes.
"""

import gzip
from pathlib import Path

SYMBOLIC = (1, 2, 3)


def load_dataset(name, data_dir, dtype="float64"):
    """``(X, y)`` of a data set under ``data_dir`` (the layout of ``../shared/data``).

    numpy is imported here, not at the top: the benchmarks pin the BLAS threads
    before numpy is first imported.
    """
    import numpy as np

    if name == "fashion-mnist":
        from qkm.io import load_data, load_labels

        X, _ = load_data(str(Path(data_dir) / "fashion-mnist" / "train-images-idx3-ubyte.gz"))
        y = load_labels(str(Path(data_dir) / "fashion-mnist" / "train-labels-idx1-ubyte.gz"))
        return (np.ascontiguousarray(X, dtype=np.float64) / 255.0).astype(dtype), np.asarray(y).ravel()
    if name == "coil20":
        from scipy.io import loadmat

        m = loadmat(str(Path(data_dir) / "coil20" / "COIL20.mat"))
        return (np.ascontiguousarray(m["X"], dtype=np.float64) / 255.0).astype(dtype), m["Y"].ravel().astype(int)
    if name == "kddcup99":
        return _load_kdd(Path(data_dir) / "kddcup99" / "kddcup.data_10_percent.gz", dtype)
    raise ValueError(f"unknown dataset {name!r}")


def _load_kdd(path, dtype):
    import numpy as np

    with gzip.open(path, "rt") as fh:
        lines = [line for line in fh if line.strip()]
    n, width = len(lines), lines[0].count(",")
    numeric = np.zeros((n, width))
    codes = {j: {} for j in SYMBOLIC}
    symbols = np.zeros((n, len(SYMBOLIC)), dtype=np.int64)
    label_codes, labels = {}, np.zeros(n, dtype=np.int64)
    for i, line in enumerate(lines):
        fields = line.rstrip("\n").split(",")
        for c, j in enumerate(SYMBOLIC):
            symbols[i, c] = codes[j].setdefault(fields[j], len(codes[j]))
            fields[j] = "0"
        labels[i] = label_codes.setdefault(fields[-1], len(label_codes))
        numeric[i] = [float(v) for v in fields[:-1]]
    parts = []
    for j in range(width):
        if j in SYMBOLIC:
            c = SYMBOLIC.index(j)
            parts.append(np.eye(len(codes[j]))[symbols[:, c]])
        else:
            v = numeric[:, j]
            span = v.max() - v.min()
            parts.append(((v - v.min()) / span if span > 0 else np.zeros_like(v))[:, None])
    return np.ascontiguousarray(np.hstack(parts), dtype=dtype), labels
