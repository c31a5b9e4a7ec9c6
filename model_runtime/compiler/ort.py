"""onnxruntime at compile time: sessions over in-memory graphs, random feeds, level names."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from model_runtime import custom_ops
from model_runtime.compiler.graph import approx_bytes

__all__ = ["GRAPH_LEVELS", "make_session", "random_array"]

GRAPH_LEVELS: dict[str, Any] = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

#: Above this a graph goes to onnxruntime through a file with external data (protobuf's 2 GiB
#: serialisation limit, with margin).
_INLINE_LIMIT = 1 << 30


def session_options(level: str = "basic", *, enable_custom_ops: bool = True) -> ort.SessionOptions:
    """Quiet session options at a named graph optimisation level, custom op kernels enabled.

    Raises:
        CustomOpError: custom op kernels are installed but onnxruntime-extensions is missing.
    """
    so = ort.SessionOptions()
    so.graph_optimization_level = GRAPH_LEVELS[level]
    # Failures come back as exceptions, translated with context; onnxruntime's own log lines
    # (unused initializers, kernel errors) would only repeat them on stderr.
    so.log_severity_level = 4
    if enable_custom_ops:
        custom_ops.enable(so)  # kernels of custom ops lowered by this compile
    return so


def make_session(
    model: onnx.ModelProto | bytes,
    so: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """A CPU session over an in-memory model (spilled to a temp file if too big to serialise).

    Raises:
        Exception: whatever onnxruntime raises; callers translate it with context.
    """
    so = so or session_options()
    providers = ["CPUExecutionProvider"]
    if isinstance(model, bytes):
        return ort.InferenceSession(model, so, providers=providers)
    if approx_bytes(model) < _INLINE_LIMIT:
        return ort.InferenceSession(model.SerializeToString(), so, providers=providers)
    with tempfile.TemporaryDirectory(prefix="model-runtime-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save_model(model, str(path), save_as_external_data=True, location="model.data")
        return ort.InferenceSession(str(path), so, providers=providers)


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
    """Random data a model accepts: normal floats, small non-negative ints (valid indices)."""
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind == "O":  # strings, as onnxruntime's Python binding takes them (str)
        words = np.empty(shape, dtype=object)
        words.reshape(-1)[:] = [str(v) for v in rng.integers(0, 1000, size=words.size)]
        return words
    return np.zeros(shape, dtype=dtype)


def first_line(exc: BaseException) -> str:
    """The first meaningful line of an onnxruntime error (they run to pages)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run(session: ort.InferenceSession, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``session`` and return its outputs by name."""
    names = [o.name for o in session.get_outputs()]
    values = session.run(names, dict(feeds))
    custom_ops.raise_pending()  # a custom op kernel failure surfaces here, not as garbage
    return {n: np.asarray(v) for n, v in zip(names, values, strict=True)}
