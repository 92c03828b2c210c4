"""Rebuild the demo model that ``qkm serve`` serves when given no model file.

Run from the repository root (``make models`` does exactly this)::

    .venv/bin/python models/build_demo_model.py

It writes ``models/fashion_mnist_qkmeans.qkm`` (safe format, no pickle):

* QK-means, K = 10, sparsity level 3, seed 0, trained on all 2000 rows of the
  bundled Fashion-MNIST sample (``qkm/datasets/fashion_mnist_2000.npz``, pixels
  0-255) in float32;
* a search index (``/search``) over the first 512 of those rows with their
  class labels: the index stores its rows, and 512 keeps the file under 2 MB;
* a Nyström RBF feature map (``/features``) with the 10 centroids as landmarks
  and the default bandwidth (1 / mean squared pairwise distance).

Training is deterministic (the trainer only uses bit-identical execution
paths), so a rebuild gives the same arrays and the same content checksum.
"""

import argparse
from pathlib import Path

import numpy as np

import qkm
from qkm.export import data_fingerprint, save_model
from qkm.io import load_data

from qkm.datasets import fashion_mnist_sample_path

SAMPLE = Path(fashion_mnist_sample_path())
OUTPUT = Path(__file__).resolve().parent / "fashion_mnist_qkmeans.qkm"
N_CLUSTERS = 10
INDEXED_ROWS = 512


def build(output=OUTPUT):
    X, y = load_data(str(SAMPLE))
    X = np.ascontiguousarray(X, dtype=np.float32)
    est = qkm.QKMeans(n_clusters=N_CLUSTERS, sparsity_level=3, random_state=0).fit(X)
    index = qkm.ClusterIndex(est, random_state=0).fit(X[:INDEXED_ROWS], y[:INDEXED_ROWS])
    nystroem = qkm.Nystroem(n_components=N_CLUSTERS, landmarks=est).fit(X)
    return save_model(est, output, index=index, nystroem=nystroem, extra_metadata={
        "data": SAMPLE.name, "n_samples": int(X.shape[0]), "data_fingerprint": data_fingerprint(X),
        "indexed_rows": f"first {INDEXED_ROWS} rows of the training data, with their labels",
        "command": ".venv/bin/python models/build_demo_model.py  (make models)",
    })


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", default=str(OUTPUT), help="default: models/fashion_mnist_qkmeans.qkm")
    args = p.parse_args()
    model = build(args.output)
    size = Path(args.output).stat().st_size
    print(f"{args.output}: {model!r}, {size / 1e6:.2f} MB, {model.checksum}")


if __name__ == "__main__":
    main()
