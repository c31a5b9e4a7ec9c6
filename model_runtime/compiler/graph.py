"""Small helpers over ONNX graphs shared by the compiler passes."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx.version_converter
from onnx import helper, numpy_helper

from model_runtime.errors import CompileError
from model_runtime.executable.codec import DTYPES

__all__ = [
    "anchor_dtype",
    "approx_bytes",
    "constant_values",
    "default_opset",
    "graph_dims",
    "initializer_names",
    "tensor_shape",
    "upgrade_opset",
]


def initializer_names(graph: onnx.GraphProto) -> set[str]:
    """Names of the graph's initializers (dense and sparse)."""
    return {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}


def default_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the default ONNX domain (0 if it imports none)."""
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return int(opset.version)
    return 0


def anchor_dtype(elem_type: int, what: str) -> np.dtype[Any]:
    """The numpy dtype of an ONNX element type, if an executable anchor may carry it.

    Raises:
        CompileError: the type has no numpy equivalent the executable format stores
            (bfloat16, complex...); ``what`` names the tensor. STRING is ``bytes`` (numpy
            object arrays).
    """
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        dtype = None
    name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "UNDEFINED"
    if elem_type == onnx.TensorProto.STRING:
        return DTYPES["bytes"]
    if dtype is None or dtype.name not in DTYPES or dtype != DTYPES[dtype.name]:
        raise CompileError(
            f"{what} has element type {name}, which executables cannot carry "
            f"(supported: {', '.join(DTYPES)})"
        )
    return DTYPES[dtype.name]


def graph_dims(name: str, shape: tuple[int, ...]) -> list[int | str]:
    """``shape`` as ONNX dims: a dynamic dimension (``-1``) becomes the symbol ``NAME_dimI``."""
    return [d if d >= 0 else f"{name}_dim{i}" for i, d in enumerate(shape)]


def tensor_shape(value_info: onnx.ValueInfoProto) -> list[int | str | None]:
    """Each dim of a tensor value: an int, a symbolic name, or ``None`` if unknown."""
    dims: list[int | str | None] = []
    for d in value_info.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


def constant_values(graph: onnx.GraphProto, names: set[str]) -> dict[str, np.ndarray]:
    """Values of those ``names`` that are constant in ``graph`` (initializers, ``Constant``)."""
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name in names}
    for node in graph.node:
        if (
            node.op_type == "Constant"
            and node.domain in ("", "ai.onnx")
            and node.output
            and node.output[0] in names
        ):
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
                elif attr.name == "value_ints":
                    values[node.output[0]] = np.array(list(attr.ints), dtype=np.int64)
    return values


#: Oldest default-domain opset onnxruntime still implements; older models are converted.
MIN_OPSET = 7


def upgrade_opset(model: onnx.ModelProto, where: str) -> tuple[onnx.ModelProto, int | None]:
    """Convert a model older than :data:`MIN_OPSET` to it; return it and the new opset.

    onnxruntime dropped kernels for opsets before 7 (``Add(6)`` with its ``broadcast``
    attribute, ...); the onnx version converter rewrites them faithfully.

    Raises:
        CompileError: the converter cannot convert the model.
    """
    opset = default_opset(model)
    if opset == 0 or opset >= MIN_OPSET:
        return model, None
    try:
        converted = onnx.version_converter.convert_version(model, MIN_OPSET)
        onnx.checker.check_model(converted)
    except Exception as exc:
        raise CompileError(
            f"{where}: opset {opset} is older than onnxruntime supports ({MIN_OPSET}) and the "
            f"onnx version converter cannot upgrade it: {str(exc).strip().splitlines()[0]}"
        ) from exc
    return converted, MIN_OPSET


def approx_bytes(model: onnx.ModelProto) -> int:
    """The size of ``model``'s tensor data: a cheap lower bound of its serialised size.

    ``ModelProto.ByteSize()`` serialises the whole message to count it (about a second per
    500 MB); this sums the initializers' payloads, which dominate any model that is big.
    """
    total = 0
    for t in model.graph.initializer:
        total += len(t.raw_data)
        total += 8 * (len(t.float_data) + len(t.int32_data) + len(t.int64_data))
        total += 8 * (len(t.double_data) + len(t.uint64_data))
        total += sum(len(s) for s in t.string_data)
    return total
