"""ONNX export of the centroid operator (placeholder, being built for issue 4)."""

__all__ = ["to_onnx"]


def to_onnx(model, path=None, **kwargs):  # pragma: no cover - placeholder
    raise NotImplementedError("qkm.export.to_onnx is being built (issue 4).")
