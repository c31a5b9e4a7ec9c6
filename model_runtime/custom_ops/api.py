"""The declaration API of a custom op library: :class:`CustomOp` and the :class:`Kernel` it builds.

A library is a plain Python module with a module-level ``OPS`` mapping, op name -> CustomOp::

    def build(inputs: Sequence[TensorInfo], attributes: Mapping[str, Any]) -> Kernel:
        return Kernel(outputs=(inputs[0], inputs[1]), compute=rotate)

    OPS = {"Rotate": CustomOp(build=build, is_elementwise=True, is_hashable=True)}

ONNX nodes whose domain is the module's name (``domain="my_pkg.rotate_op"``, ``op_type="Rotate"``)
resolve to it at compile time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_runtime.executable.model import TensorInfo

__all__ = ["BuildFunction", "ComputeFunction", "CustomOp", "Kernel", "TensorInfo"]

#: ``compute(*inputs) -> output or tuple of outputs``: numpy arrays in, numpy arrays out.
ComputeFunction = Callable[..., "np.ndarray[Any, Any] | Sequence[np.ndarray[Any, Any]]"]


@dataclass(frozen=True, slots=True)
class Kernel:
    """What a build function returns: the outputs it promises and the function computing them.

    ``outputs`` declares each output's shape and dtype; a ``-1`` dim means "as the same dim of
    the first input" (the batch, which the compiler may change). ``compute`` must return arrays
    of exactly those shapes and dtypes; anything else is a :class:`CustomOpError` naming the op.
    """

    outputs: tuple[TensorInfo, ...]
    compute: ComputeFunction


#: ``build(inputs, attributes) -> Kernel``: the seed's ``Build``. ``inputs`` are the tensor
#: infos of the node's inputs (a ``-1`` dim is the batch); ``attributes`` the node's attributes.
BuildFunction = Callable[[Sequence[TensorInfo], Mapping[str, Any]], Kernel]


@dataclass(frozen=True, slots=True)
class CustomOp:
    """One op of a library: its build function and metadata (seed: ``custom_op_metadata``).

    ``is_elementwise``: takes tensors of one shape, computes per element, returns that shape
    (checked at compile time). ``is_hashable``: the op's result depends only on the library's
    source and the node (so executables using it may be cached and pre-compiled).
    ``is_stateless``: computing twice on the same inputs gives the same outputs.
    """

    build: BuildFunction
    is_elementwise: bool = False
    is_hashable: bool = False
    is_stateless: bool = True
