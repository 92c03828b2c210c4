"""Data I/O: load data sets and labels, save labels and centroids atomically, and cut data into shards.

- :func:`load_data` (npy, csv, npz, svmlight, mtx, idx; text and idx files may
  be .gz/.bz2 compressed; a shard directory too), :func:`load_labels`,
  :func:`save_labels`, :func:`save_centroids` (:mod:`qkm.io._files`);
- a malformed file raises :class:`DataFormatError`, whose message names the
  file and, where it makes sense, the 1-based line number and the problem;
- private modules: the readers (``_readers``), atomic writes (``_atomic``),
  the shard format (``_shards``), block readers (``_shard_readers``) and the
  shard writer behind ``qkm shard`` (``_shard_writer``).
"""

from ._files import DataFormatError, load_data, load_labels, save_centroids, save_labels

__all__ = ["DataFormatError", "load_data", "load_labels", "save_labels", "save_centroids"]
