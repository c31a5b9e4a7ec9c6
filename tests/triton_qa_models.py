"""ONNX models shaped as the ones Triton's behaviour tests (its ``qa/`` directory) build, with
the ``config.pbtxt`` each comes with. Written here from the models' description (names,
types, shapes, what they compute); nothing of NVIDIA's generators is copied.

Shapes are Triton's ``dims``: -1 is a dimension of any size. With ``max_batch`` > 0 the model
has a leading batch axis that the config does not list.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.models import OPSET, save

__all__ = ["PYTHON_IDENTITY", "TRITON_TYPES", "identity_model", "write_identity", "zero_model_name"]

#: numpy dtype -> (ONNX element type, Triton config type).
TRITON_TYPES: dict[np.dtype[np.generic], tuple[int, str]] = {
    np.dtype(bool): (TensorProto.BOOL, "TYPE_BOOL"),
    np.dtype(np.float16): (TensorProto.FLOAT16, "TYPE_FP16"),
    np.dtype(np.float32): (TensorProto.FLOAT, "TYPE_FP32"),
    np.dtype(np.int32): (TensorProto.INT32, "TYPE_INT32"),
    np.dtype(np.int64): (TensorProto.INT64, "TYPE_INT64"),
    np.dtype(object): (TensorProto.STRING, "TYPE_STRING"),
}


#: Triton's python ``*_identity`` model (``simple_identity``, ``string_identity``): INPUT0 back
#: as OUTPUT0, any datatype and shape.
PYTHON_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out = pb_utils.Tensor("OUTPUT0", in_0.as_numpy())
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def zero_model_name(prefix: str, io_cnt: int, dtype: np.dtype[np.generic] | type) -> str:
    """Triton's name for an identity model: ``onnx_zero_1_float32``,
    ``onnx_nobatch_zero_3_object``."""
    return f"{prefix}_zero_{io_cnt}_{np.dtype(dtype).name}"


def _onnx_dims(dims: list[int], first: int) -> list[int | str]:
    """``dims`` with each -1 named apart (``var_N``): ONNX takes one name for one size."""
    return [f"var_{first + i}" if d < 0 else d for i, d in enumerate(dims)]


def identity_model(
    io_cnt: int, dtype: np.dtype[np.generic] | type, dims: list[int], max_batch: int
) -> onnx.ModelProto:
    """``INPUTi`` -> Identity -> ``OUTPUTi`` for i < ``io_cnt``, all of ``dtype`` and ``dims``
    (a leading batch axis when ``max_batch`` > 0)."""
    elem = TRITON_TYPES[np.dtype(dtype)][0]
    batch: list[int | str] = ["batch"] if max_batch > 0 else []
    inputs, outputs, nodes = [], [], []
    for i in range(io_cnt):
        in_dims = _onnx_dims(dims, 2 * i * len(dims))
        out_dims = _onnx_dims(dims, (2 * i + 1) * len(dims))
        inputs.append(helper.make_tensor_value_info(f"INPUT{i}", elem, batch + in_dims))
        outputs.append(helper.make_tensor_value_info(f"OUTPUT{i}", elem, batch + out_dims))
        nodes.append(helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]))
    graph = helper.make_graph(nodes, "identity", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def config_text(
    max_batch: int,
    inputs: list[tuple[str, str, list[int]]],
    outputs: list[tuple[str, str, list[int]]],
    extra: str = "",
) -> str:
    """A ``config.pbtxt`` for ``onnxruntime_onnx`` with (name, Triton type, dims) tensors."""

    def tensors(items: list[tuple[str, str, list[int]]]) -> str:
        return ", ".join(
            f'{{ name: "{n}" data_type: {t} dims: [ {", ".join(map(str, d))} ] }}'
            for n, t, d in items
        )

    return (
        f'platform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n'
        f"input [ {tensors(inputs)} ]\noutput [ {tensors(outputs)} ]\n{extra}"
    )


def write_identity(
    repo: Path,
    prefix: str,
    io_cnt: int,
    dtype: np.dtype[np.generic] | type,
    dims: list[int],
    max_batch: int,
) -> str:
    """Write an identity model and its config under ``repo``; return its name."""
    name = zero_model_name(prefix, io_cnt, dtype)
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    save(identity_model(io_cnt, dtype, dims, max_batch), repo / name / "1" / "model.onnx")
    kind = TRITON_TYPES[np.dtype(dtype)][1]
    io = [(f"INPUT{i}", kind, dims) for i in range(io_cnt)]
    out = [(f"OUTPUT{i}", kind, dims) for i in range(io_cnt)]
    (repo / name / "config.pbtxt").write_text(config_text(max_batch, io, out))
    return name


def constant_model(values: np.ndarray) -> onnx.ModelProto:
    """``INPUT0`` FP32 [-1] -> ``OUTPUT0`` = ``values`` + 0 * sum(INPUT0) (Triton's
    ``nan_inf_output``, there a python model; the input takes part so that the output is no
    constant of the graph, which the compiler does not take as an output)."""
    const = helper.make_tensor("values", TensorProto.FLOAT, list(values.shape), values.tolist())
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["INPUT0"], ["total"], keepdims=0),
            helper.make_node("Mul", ["total", "zero"], ["nothing"]),
            helper.make_node("Constant", [], ["c"], value=const),
            helper.make_node("Add", ["c", "nothing"], ["OUTPUT0"]),
        ],
        "constant",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, list(values.shape))],
        [zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def string_add_sub_model(width: int = 16) -> onnx.ModelProto:
    """Triton's ``onnx_object_int32_int32``: ``INPUT0``, ``INPUT1`` STRING [batch, width]
    (decimal integers) -> ``OUTPUT0`` = sum, ``OUTPUT1`` = difference, INT32."""
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
        helper.make_node("Add", ["a", "b"], ["OUTPUT0"]),
        helper.make_node("Sub", ["a", "b"], ["OUTPUT1"]),
    ]
    graph = helper.make_graph(
        nodes,
        "string_add_sub",
        [
            helper.make_tensor_value_info(n, TensorProto.STRING, ["batch", width])
            for n in ("INPUT0", "INPUT1")
        ],
        [
            helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", width])
            for n in ("OUTPUT0", "OUTPUT1")
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
