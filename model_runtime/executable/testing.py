"""A tiny, real executable for tests (a fake to ship, as httpx ships ``MockTransport``).

:func:`tiny_executable` builds, without the compiler, a valid executable whose main program is a
real ONNX graph: ``y = x @ W + b`` on a batch of ``x`` and, as a mutable variable, a counter that
every main run increments (``counter_out = counter + 1``, aliased back onto ``counter``). Any
test of the format, the device backends or the session can start from it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from model_runtime.executable.container import Executable
from model_runtime.executable.model import (
    Anchor,
    AnchorRole,
    AnchorType,
    ExecutableMetadata,
    Program,
    ProgramFlow,
    ProgramKind,
    Target,
    TensorInfo,
)

__all__ = ["MAIN_PAYLOAD", "tiny_executable", "tiny_metadata", "tiny_onnx", "tiny_tensors"]

MAIN_PAYLOAD = "program/main"
_F32 = np.dtype(np.float32)
IN_FEATURES, OUT_FEATURES = 4, 3


def tiny_onnx(batch: int | str = "batch") -> bytes:
    """Serialized ONNX model ``y = x @ W + b; counter_out = counter + 1`` (opset 17).

    ``batch`` fixes the batch dimension of ``x`` and ``y`` (an int) or names it (a str).

    Raises:
        ImportError: onnx is not installed.
    """
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
            helper.make_node("Add", ["counter", "one"], ["counter_out"]),
        ],
        "tiny",
        [
            helper.make_tensor_value_info("x", f, [batch, IN_FEATURES]),
            helper.make_tensor_value_info("W", f, [IN_FEATURES, OUT_FEATURES]),
            helper.make_tensor_value_info("b", f, [OUT_FEATURES]),
            helper.make_tensor_value_info("counter", f, [1]),
        ],
        [
            helper.make_tensor_value_info("y", f, [batch, OUT_FEATURES]),
            helper.make_tensor_value_info("counter_out", f, [1]),
        ],
        initializer=[helper.make_tensor("one", f, [1], [1.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by every onnxruntime we support
    data: bytes = model.SerializeToString()
    return data


def tiny_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """The weights, variable and payload tensors of :func:`tiny_metadata`.

    Raises:
        ImportError: onnx is not installed.
    """
    rng = np.random.default_rng(seed)
    return {
        "W": rng.standard_normal((IN_FEATURES, OUT_FEATURES)).astype(np.float32),
        "b": rng.standard_normal(OUT_FEATURES).astype(np.float32),
        "counter": np.zeros(1, np.float32),
        MAIN_PAYLOAD: np.frombuffer(tiny_onnx(), dtype=np.uint8),
    }


def tiny_metadata(batch_size: int = 2, **overrides: Any) -> ExecutableMetadata:
    """Metadata of the tiny model: programs load 0, main 1, save 2; ``overrides`` replace fields.

    Raises:
        TypeError: an override names no field.
    """

    def anchor(
        name: str,
        shape: tuple[int, ...],
        type_: AnchorType,
        role: AnchorRole,
        programs: tuple[int, ...],
        **kw: Any,
    ) -> Anchor:
        return Anchor(name, name, TensorInfo(shape, _F32), type_, role, programs, **kw)

    b = batch_size
    fields: dict[str, Any] = {
        "model_name": "tiny",
        "target": Target(),
        "batch_size": b,
        "anchors": (
            anchor("x", (b, 4), AnchorType.INPUT, AnchorRole.USER_INPUT, (1,), batch_dim=0),
            anchor("y", (b, 3), AnchorType.OUTPUT, AnchorRole.USER_OUTPUT, (1,), batch_dim=0),
            anchor("W", (4, 3), AnchorType.INPUT, AnchorRole.WEIGHT, (0, 1), has_data=True),
            anchor("b", (3,), AnchorType.INPUT, AnchorRole.WEIGHT, (0, 1), has_data=True),
            anchor(
                "counter", (1,), AnchorType.UNKNOWN, AnchorRole.VARIABLE, (0, 1, 2), has_data=True
            ),
            anchor("counter_out", (1,), AnchorType.OUTPUT, AnchorRole.USER_OUTPUT, (1,)),
        ),
        "programs": (
            Program(0, "load", ProgramKind.LOAD),
            Program(1, "main", ProgramKind.MAIN, MAIN_PAYLOAD),
            Program(2, "save", ProgramKind.SAVE),
        ),
        "program_flow": ProgramFlow(load=(0,), main=(1,), save=(2,)),
        "output_to_variable": {"counter_out": "counter"},
        "options": {"origin": "model_runtime.executable.testing"},
    }
    fields.update(overrides)
    return ExecutableMetadata(**fields)


def tiny_executable(batch_size: int = 2, seed: int = 0, **overrides: Any) -> Executable:
    """A sealed, valid tiny executable (see the module docstring).

    Raises:
        InvalidExecutableError: ``overrides`` made it inconsistent.
    """
    return Executable.build(tiny_metadata(batch_size, **overrides), tiny_tensors(seed))
