"""The seed's rotate op as a custom op library: rotates (x, y) by ``angle``, elementwise.

The seed's ``Build`` adds a vertex per tile to a Poplar graph; here ``build`` returns the kernel
that computes the op, and ``OPS`` declares it with its metadata.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from model_runtime.custom_ops import CustomOp, Kernel, TensorInfo


def rotate(x: np.ndarray, y: np.ndarray, angle: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) rotated by ``angle`` radians, in the inputs' dtype."""
    c, s = np.cos(angle), np.sin(angle)
    return (x * c - y * s).astype(x.dtype), (x * s + y * c).astype(y.dtype)


def build(inputs: Sequence[TensorInfo], attributes: Mapping[str, Any]) -> Kernel:
    """The seed's ``Build``: check the inputs, declare the outputs, return the kernel."""
    if len(inputs) != 3:
        raise ValueError(f"Rotate takes x, y and angle, got {len(inputs)} inputs")
    return Kernel(outputs=(inputs[0], inputs[1]), compute=rotate)


OPS = {"Rotate": CustomOp(build=build, is_elementwise=True, is_hashable=True, is_stateless=True)}
