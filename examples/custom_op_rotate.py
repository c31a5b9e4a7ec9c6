"""Custom ops (seed 002): the rotate op from a custom op library, and a fused expression.

    python examples/custom_op_rotate.py

rotates x=[2, 4, 6, -1], y=[2, 3, 8, -1] by angles [pi, pi/2, 3pi/2, 0] with the library
``custom_ops.rotate`` (examples/custom_ops/rotate.py), allowed by name with
``model_runtime.configure(custom_op_libraries=[...])``, and computes ``x * x + y * z`` as one
fused elementwise kernel with ``codelet_expression_op``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _logging

import model_runtime.connection as mrc
from model_runtime.compiler import CompileOptions
from model_runtime.custom_ops import EXPRESSION_OPSET, codelet_expression_op

LIBRARY = "custom_ops.rotate"


def _model(
    nodes: list[Any], inputs: list[str], outputs: list[str], opsets: list[Any]
) -> ModelProto:
    graph = helper.make_graph(
        nodes,
        "custom_op_example",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in outputs],
    )
    opsets = [helper.make_opsetid("", 17), *opsets]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def rotate_model() -> ModelProto:
    """One node of the custom domain ``custom_ops.rotate``: the library's ``Rotate`` op."""
    node = helper.make_node("Rotate", ["x", "y", "angle"], ["x_out", "y_out"], domain=LIBRARY)
    return _model(
        [node], ["x", "y", "angle"], ["x_out", "y_out"], [helper.make_opsetid(LIBRARY, 1)]
    )


def my_custom_op(x: Any, y: Any, z: Any) -> Any:
    return x * x + y * z


def expression_model() -> ModelProto:
    node = codelet_expression_op(my_custom_op, "a", "b", "c", output="result")
    return _model([node], ["a", "b", "c"], ["result"], [EXPRESSION_OPSET])


async def main() -> None:
    mrc.configure(custom_op_libraries=[LIBRARY])
    options = CompileOptions(batch_size=4, model_name="rotate")
    x = np.array([2, 4, 6, -1], np.float32)
    y = np.array([2, 3, 8, -1], np.float32)
    angle = np.array([np.pi, np.pi / 2, 3 * np.pi / 2, 0], np.float32)
    async with mrc.OnnxProgram(rotate_model(), options) as program:
        out = await program.run({"x": x, "y": y, "angle": angle})
    print("x:", np.round(out["x_out"], 5).tolist())
    print("y:", np.round(out["y_out"], 5).tolist())

    a, b, c = (np.array(v, np.float32) for v in ([1, 2, 3, 4], [5, 6, 7, 8], [-1, 0, 1, 2]))
    options = CompileOptions(batch_size=4, model_name="expression")
    async with mrc.OnnxProgram(expression_model(), options) as program:
        out = await program.run({"a": a, "b": b, "c": c})
    print("x * x + y * z:", out["result"].tolist(), "numpy:", (a * a + b * c).tolist())


if __name__ == "__main__":
    _logging.setup()
    asyncio.run(main())
