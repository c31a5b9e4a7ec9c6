"""``benchmarks/http_cost.py --python``: the demo model's input served by a python model."""

from __future__ import annotations

from pathlib import Path

__all__ = ["PYTHON_CONFIG", "PYTHON_MODEL", "python_repository"]

NAME = "digits"

#: ``--python``'s model: the demo model's input and a 64x10 matrix, one numpy product over the
#: rows of an ``execute``.
PYTHON_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

WEIGHTS = np.random.default_rng(0).standard_normal((64, 10)).astype(np.float32)


class TritonPythonModel:
    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "pixels").as_numpy() for r in requests]
        out = np.concatenate(arrays) @ WEIGHTS
        responses, row = [], 0
        for a in arrays:
            rows = out[row : row + len(a)]
            row += len(a)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("logits", rows)]))
        return responses
"""
PYTHON_CONFIG = """
name: "digits"
backend: "python"
max_batch_size: 32
input [{ name: "pixels", data_type: TYPE_FP32, dims: [64] }]
output [{ name: "logits", data_type: TYPE_FP32, dims: [10] }]
instance_group [{ count: 1, kind: KIND_CPU }]
dynamic_batching {}
"""


def python_repository(workdir: Path) -> Path:
    """A repository with :data:`PYTHON_MODEL` as ``digits``."""
    repo = workdir / "python-repository"
    (repo / NAME / "1").mkdir(parents=True, exist_ok=True)
    (repo / NAME / "config.pbtxt").write_text(PYTHON_CONFIG)
    (repo / NAME / "1" / "model.py").write_text(PYTHON_MODEL)
    return repo
