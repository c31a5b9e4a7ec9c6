"""Helpers for runner tests: compiled real models and their onnxruntime reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from model_runtime.compiler import CompileOptions, compile_model


def compile_to(model: onnx.ModelProto, tmp: Path, name: str = "model", **options: Any) -> Path:
    """Compile ``model`` into ``tmp/name.mrx`` with ``options``."""
    return compile_model(model, tmp / f"{name}.mrx", CompileOptions(**options))


class Reference:
    """The original ONNX model on plain onnxruntime: the answer every row must match."""

    def __init__(self, model: onnx.ModelProto) -> None:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self._session = ort.InferenceSession(
            model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        self.output_names = [o.name for o in self._session.get_outputs()]

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._session.run(None, inputs)
        return dict(zip(self.output_names, values, strict=True))
