"""The package version, in a module of its own: export, serve, io and the command line read it from here.

Importing it loads nothing else (``import qkm`` loads every estimator).
"""

__version__ = "0.1.0"
