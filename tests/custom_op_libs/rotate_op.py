"""The seed's rotate op: rotate (x, y) by ``angle``, elementwise, as a custom op library."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from model_runtime.custom_ops import CustomOp, Kernel, TensorInfo


def _rotate(x: np.ndarray, y: np.ndarray, angle: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c, s = np.cos(angle), np.sin(angle)
    return (x * c - y * s).astype(x.dtype), (x * s + y * c).astype(y.dtype)


def build(inputs: Sequence[TensorInfo], attributes: Mapping[str, Any]) -> Kernel:
    if len(inputs) != 3:
        raise ValueError(f"Rotate takes x, y and angle, got {len(inputs)} inputs")
    return Kernel(outputs=(inputs[0], inputs[1]), compute=_rotate)


OPS = {"Rotate": CustomOp(build=build, is_elementwise=True, is_hashable=True, is_stateless=True)}
