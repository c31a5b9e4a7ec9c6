"""Custom ops that misbehave on purpose: wrong shape, raising, not hashable, bad build."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from model_runtime.custom_ops import CustomOp, Kernel, TensorInfo


def _same(inputs: Sequence[TensorInfo], attributes: Mapping[str, Any]) -> Kernel:
    return Kernel(outputs=(inputs[0],), compute=lambda x: x * 2)


def _wrong_shape(inputs: Sequence[TensorInfo], attributes: Mapping[str, Any]) -> Kernel:
    return Kernel(outputs=(inputs[0],), compute=lambda x: np.zeros(x.size + 1, dtype=x.dtype))


def _raises(inputs: Sequence[TensorInfo], attributes: Mapping[str, Any]) -> Kernel:
    def compute(x: np.ndarray) -> np.ndarray:
        raise RuntimeError("kernel exploded")

    return Kernel(outputs=(inputs[0],), compute=compute)


def _raises_at_run(inputs: Sequence[TensorInfo], attributes: Mapping[str, Any]) -> Kernel:
    def compute(x: np.ndarray) -> np.ndarray:
        if float(x.reshape(-1)[0]) < 0:
            raise RuntimeError("negative input")
        return x * 2

    return Kernel(outputs=(inputs[0],), compute=compute)


def _not_a_kernel(inputs: Sequence[TensorInfo], attributes: Mapping[str, Any]) -> Kernel:
    return "nope"  # type: ignore[return-value]


OPS = {
    "Double": CustomOp(build=_same, is_elementwise=True, is_hashable=True),
    "Unhashable": CustomOp(build=_same, is_elementwise=True, is_hashable=False),
    "WrongShape": CustomOp(build=_wrong_shape, is_hashable=True),
    "Raises": CustomOp(build=_raises, is_hashable=True),
    "RaisesAtRun": CustomOp(build=_raises_at_run, is_elementwise=True, is_hashable=True),
    "NotAKernel": CustomOp(build=_not_a_kernel, is_hashable=True),
}
