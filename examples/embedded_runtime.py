"""The embedded application runtime (seed 000): a program that doubles its input.

The program is compiled with 16 device iterations (one main run consumes 16 batches). Its
doubling factor is a mutable variable passed once, as a startup input. The engine then runs in
a background thread; 16 calls with ``ones(4) * i`` each get their own result back:

    python examples/embedded_runtime.py

prints ``[0.0, 0.0, 0.0, 0.0]``, ``[2.0, 2.0, 2.0, 2.0]``, ... ``[30.0, 30.0, 30.0, 30.0]``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _logging

from model_runtime.compiler import CompileOptions, compile_model
from model_runtime.embedded import (
    embedded_runtime_call,
    embedded_runtime_start,
    embedded_runtime_stop,
)

DEVICE_ITERATIONS = 16


def my_net() -> ModelProto:
    """``output = x * factor``; ``factor`` is a variable (1 in the file, 2 at startup)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, [4])
    factor = numpy_helper.from_array(np.ones(4, np.float32), "factor")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "factor"], ["output"])], "doubler", [x], [out], [factor]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="embedded-example-") as tmp:
        options = CompileOptions(
            batch_size=4, device_iterations=DEVICE_ITERATIONS, variables=("factor",)
        )
        path = compile_model(my_net(), Path(tmp) / "doubler.mrx", options)

        startup_inputs = [np.full(4, 2.0, np.float32)]  # the variable "factor", passed once
        context = await embedded_runtime_start(path, startup_inputs, "my_application")
        try:
            for i in range(DEVICE_ITERATIONS):
                (result,) = await embedded_runtime_call([np.ones(4, np.float32) * i], context)
                print(result.tolist())
        finally:
            embedded_runtime_stop("my_application")


if __name__ == "__main__":
    _logging.setup()
    asyncio.run(main())
