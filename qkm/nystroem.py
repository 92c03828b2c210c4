"""Nyström RBF features on the centroid operator (placeholder, being built for issue 5)."""

__all__ = ["Nystroem", "kernel_approximation_error"]


class Nystroem:  # pragma: no cover - placeholder
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("qkm.Nystroem is being built (issue 5).")


def kernel_approximation_error(*args, **kwargs):  # pragma: no cover - placeholder
    raise NotImplementedError("being built (issue 5).")
