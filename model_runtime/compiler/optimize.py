"""Offline graph optimisation with onnxruntime, before the weights are lifted out.

Weights are still initializers here, so constant folding and fusions (Conv+BatchNorm,
MatMul+Add, ConstantOfShape-generated weights...) see them as constants. onnxruntime writes the
optimised graph with its big initializers in an external data file (graphs past 2 GiB cannot be
one protobuf); :mod:`model_runtime.compiler.lower` reads them from ``base_dir``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime as ort

from model_runtime.compiler.graph import approx_bytes
from model_runtime.compiler.ort import GRAPH_LEVELS, first_line, session_options
from model_runtime.errors import CompileError

__all__ = ["OptimizedModel", "offline_level", "optimize"]

_INLINE_LIMIT = 1 << 30
_EXTERNAL_MIN_BYTES = 1024


@dataclass(frozen=True, slots=True)
class OptimizedModel:
    """The optimised graph; initializers may reference external data under ``base_dir``."""

    proto: onnx.ModelProto
    base_dir: Path
    level: str


def offline_level(level: str) -> str:
    """The level applied offline for a requested ``level``.

    ``all`` adds layout transformations (NCHWc) specific to the CPU the compiler runs on; an
    executable may run on another machine, so those are left to the device at load time
    (recorded in the executable's options) and ``extended`` is applied here.
    """
    return "extended" if level == "all" else level


def optimize(model: onnx.ModelProto, level: str, where: str, workdir: Path) -> OptimizedModel:
    """Optimise ``model`` at ``level`` (see :func:`offline_level`) into ``workdir``.

    Raises:
        CompileError: onnxruntime rejects the model or fails to write the optimised graph.
    """
    applied = offline_level(level)
    if applied not in GRAPH_LEVELS:
        raise CompileError(f"{where}: unknown optimization level {level!r}")
    so = session_options(applied)
    out = workdir / "optimized.onnx"
    so.optimized_model_filepath = str(out)
    so.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", "optimized.data"
    )
    so.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes",
        str(_EXTERNAL_MIN_BYTES),
    )
    providers = ["CPUExecutionProvider"]
    try:
        if approx_bytes(model) < _INLINE_LIMIT:
            ort.InferenceSession(model.SerializeToString(), so, providers=providers)
        else:
            src = workdir / "input.onnx"
            onnx.save_model(model, str(src), save_as_external_data=True, location="input.data")
            ort.InferenceSession(str(src), so, providers=providers)
    except Exception as exc:
        raise CompileError(
            f"{where}: onnxruntime cannot optimise the model at level {applied!r}: "
            f"{first_line(exc)}"
        ) from exc
    try:
        proto = onnx.load_model(str(out), load_external_data=False)
    except Exception as exc:
        raise CompileError(f"{where}: onnxruntime wrote no usable optimised graph: {exc}") from exc
    return OptimizedModel(proto=proto, base_dir=workdir, level=applied)
