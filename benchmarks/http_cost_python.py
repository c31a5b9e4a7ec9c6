"""``benchmarks/http_cost.py --python``: the demo model's input served by a python model; what
``--ensemble`` serves and sends."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "DIGITS", "ENSEMBLE", "PYTHON_CONFIG", "PYTHON_MODEL", "TARGETS", "Target", "python_repository",
    "rows_of",
]  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]

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


@dataclass(frozen=True)
class Target:
    """What ``http_cost.py`` serves and sends: the model, its input, and the model whose
    executions are counted as batches."""

    key: str
    name: str
    input: str
    datatype: str
    stats: str

    def repository(self, workdir: Path) -> Path:
        """The repository serving it (the ensemble's: ``benchmarks/ensembles.py``'s)."""
        from benchmarks.ensembles import write_repositories

        work = workdir / "ensemble"
        if not (work / "repository-ours").exists():
            work.mkdir(parents=True, exist_ok=True)
            write_repositories(work)
        return work / "repository-ours"


DIGITS = Target("digits", NAME, "pixels", "FP32", NAME)
ENSEMBLE = Target("ensemble", "ensemble_python_resnet50", "INPUT", "UINT8", "preprocess")
TARGETS = {t.key: t for t in (DIGITS, ENSEMBLE)}


def rows_of(target: Target) -> np.ndarray:
    """64 rows of ``target``'s input: the demo's digits, or 48 random bytes each."""
    if target is ENSEMBLE:
        return np.random.default_rng(0).integers(0, 256, (64, 48), dtype=np.uint8)
    rows = np.load(ROOT / "model_runtime" / "demo" / "digits_samples.npz")
    return rows[rows.files[0]].reshape(-1, 64).astype(np.float32)[:64]
