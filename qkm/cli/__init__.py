"""The ``qkm`` command line: ``train``, ``predict``, ``score``, ``export``, ``serve``, ``shard``.

:func:`main` is the console entry point (``qkm = "qkm.cli:main"``); the
commands live in :mod:`qkm.cli._main`, the sharded (Dask) variants in
:mod:`qkm.cli._distributed`.
"""

from ._main import build_parser, main

__all__ = ["build_parser", "main"]
