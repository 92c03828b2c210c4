"""Small data bundled with qkm, for the demo and the docs.

``fashion_mnist_2000.npz``: the first 2,000 rows of the Fashion-MNIST training
set (Xiao, Rasul & Vollgraf 2017; MIT License, Copyright (c) 2017 Zalando SE),
28x28 uint8 images flattened to 784 columns (``X``) and their labels (``y``).
"""

import os

import numpy as np

__all__ = ["fashion_mnist_sample_path", "load_fashion_mnist_sample"]


def fashion_mnist_sample_path():
    """Path of the bundled Fashion-MNIST sample (an ``np.savez`` archive with ``X`` and ``y``)."""
    return os.path.join(os.path.dirname(__file__), "fashion_mnist_2000.npz")


def load_fashion_mnist_sample(dtype=np.float64):
    """The bundled sample as ``(X, y)``: X of shape (2000, 784) in ``dtype``, y int64.

    Examples
    --------
    >>> X, y = load_fashion_mnist_sample()
    >>> X.shape, sorted(set(y.tolist())) == list(range(10))
    ((2000, 784), True)
    """
    with np.load(fashion_mnist_sample_path(), allow_pickle=False) as z:
        return z["X"].astype(dtype), z["y"].astype(np.int64)
