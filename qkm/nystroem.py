"""Old path of Nyström features: :mod:`qkm.approximate` (kept so that existing imports go on working)."""

from .approximate import Nystroem, kernel_approximation_error

__all__ = ["Nystroem", "kernel_approximation_error"]
