"""The bundled demo model: a 64-64-10 MLP classifying scikit-learn's 8x8 digits.

``digits_mlp.onnx`` takes ``pixels`` float32 [batch, 64] (raw values 0..16) and returns
``logits`` and ``probabilities`` float32 [batch, 10]. ``digits_samples.npz`` holds held-out
samples (``pixels``, ``labels``, and the model's ``logits``). Both are made by
``scripts/make_demo_model.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["DEMO_MODEL_NAME", "DEMO_ONNX_PATH", "DEMO_SAMPLES_PATH", "load_demo_samples"]

DEMO_MODEL_NAME = "digits_mlp"
DEMO_ONNX_PATH = Path(__file__).resolve().parent / "digits_mlp.onnx"
DEMO_SAMPLES_PATH = Path(__file__).resolve().parent / "digits_samples.npz"


def load_demo_samples() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Held-out ``(pixels float32 [N, 64], labels int64 [N], logits float32 [N, 10])``.

    Raises:
        FileNotFoundError: the samples file is not installed.
    """
    with np.load(DEMO_SAMPLES_PATH, allow_pickle=False) as f:
        return f["pixels"], f["labels"], f["logits"]
