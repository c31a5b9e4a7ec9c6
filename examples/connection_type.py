"""Device connection types (seed 004): when is the device attached, relative to compiling?

Computes ``(a + b) + (a + c)`` with a=[1, 1], b=[0, 1], c=[1, 5] and prints the result:

    python examples/connection_type.py --connection_type {ALWAYS,ON_DEMAND,NEVER}
    MODEL_RUNTIME_FLAGS='--executable_cache_path=/tmp/cache' \\
        python examples/connection_type.py --connection_type PRE_COMPILE

The log on stderr shows ``Compiled`` and ``attached to`` in the order the mode promises.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np
from onnx import ModelProto, TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _logging

import model_runtime.connection as mrc
from model_runtime.compiler import CompileOptions
from model_runtime.errors import ModelRuntimeError


def my_graph() -> ModelProto:
    """``(a + b) + (a + c)`` over float32[2] tensors."""
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "abc"]
    nodes = [
        helper.make_node("Add", ["a", "b"], ["ab"]),
        helper.make_node("Add", ["a", "c"], ["ac"]),
        helper.make_node("Add", ["ab", "ac"], ["result"]),
    ]
    out = helper.make_tensor_value_info("result", TensorProto.FLOAT, [2])
    graph = helper.make_graph(nodes, "connection_type", vi, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


async def main(connection_type: str) -> int:
    mrc.configure(connection_type=connection_type)
    inputs = {
        "a": np.array([1, 1], np.float32),
        "b": np.array([0, 1], np.float32),
        "c": np.array([1, 5], np.float32),
    }
    options = CompileOptions(batch_size=2, model_name="connection_type")
    async with mrc.OnnxProgram(my_graph(), options) as program:
        if program.connection_type is mrc.DeviceConnectionType.NEVER:
            print("Compiled only (DeviceConnectionType.NEVER): nothing to run")
            return 0
        result = await program.run(inputs)
    print(result["result"].tolist())
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--connection_type",
        choices=[t.name for t in mrc.DeviceConnectionType],
        default="ALWAYS",
        help="when to attach the device (default: ALWAYS)",
    )
    args = parser.parse_args()
    _logging.setup()
    try:
        sys.exit(asyncio.run(main(args.connection_type)))
    except ModelRuntimeError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
