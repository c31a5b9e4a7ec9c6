"""Executables for the device tests, built with onnx.helper (no compiler needed).

* :func:`tiny_exe` -- the shared tiny executable: ``y = x @ W + b`` and a variable ``counter``
  that every iteration increments (``counter_out = counter + 1``, aliased back).
* :func:`mlp_exe` -- an MLP (default 784-512-512-10, ReLU) with weights only.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from model_runtime.executable import (
    Anchor,
    AnchorRole,
    AnchorType,
    Executable,
    ExecutableMetadata,
    Program,
    ProgramFlow,
    ProgramKind,
    Target,
    TensorInfo,
)
from model_runtime.executable.testing import MAIN_PAYLOAD, tiny_metadata, tiny_onnx, tiny_tensors

F32 = np.dtype(np.float32)
PAYLOAD = "program/main"


def _anchor(
    name: str,
    shape: tuple[int, ...],
    t: AnchorType,
    role: AnchorRole,
    progs: tuple[int, ...],
    **kw: Any,
) -> Anchor:
    return Anchor(name, name, TensorInfo(shape, F32), t, role, progs, **kw)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any]) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data: bytes = model.SerializeToString()
    return data


def _programs() -> dict[str, Any]:
    return {
        "programs": (
            Program(0, "load", ProgramKind.LOAD),
            Program(1, "main", ProgramKind.MAIN, PAYLOAD),
            Program(2, "save", ProgramKind.SAVE),
        ),
        "program_flow": ProgramFlow(load=(0,), main=(1,), save=(2,)),
    }


def tiny_exe(
    batch: int = 2, device_iterations: int = 1, target: Target | None = None, seed: int = 0
) -> Executable:
    """The shared tiny executable (:mod:`model_runtime.executable.testing`), batch fixed."""
    tensors = tiny_tensors(seed)
    tensors[MAIN_PAYLOAD] = np.frombuffer(tiny_onnx(batch), np.uint8)
    meta = tiny_metadata(batch, device_iterations=device_iterations, target=target or Target())
    return Executable.build(meta, tensors)


def mlp_exe(
    sizes: tuple[int, ...] = (784, 512, 512, 10), batch: int = 32, target: Target | None = None
) -> Executable:
    f = TensorProto.FLOAT
    rng = np.random.default_rng(1)
    nodes: list[Any] = []
    tensors: dict[str, np.ndarray] = {}
    anchors = [
        _anchor("x", (batch, sizes[0]), AnchorType.INPUT, AnchorRole.USER_INPUT, (1,), batch_dim=0)
    ]
    inputs = [helper.make_tensor_value_info("x", f, [batch, sizes[0]])]
    prev = "x"
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        w, bias = f"w{i}", f"b{i}"
        tensors[w] = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        tensors[bias] = np.zeros(b, np.float32)
        for n, shape in ((w, (a, b)), (bias, (b,))):
            anchors.append(
                _anchor(n, shape, AnchorType.INPUT, AnchorRole.WEIGHT, (0, 1), has_data=True)
            )
            inputs.append(helper.make_tensor_value_info(n, f, list(shape)))
        last = i == len(sizes) - 2
        nodes.append(helper.make_node("MatMul", [prev, w], [f"mm{i}"]))
        nodes.append(helper.make_node("Add", [f"mm{i}", bias], ["y" if last else f"pre{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"pre{i}"], [f"h{i}"]))
            prev = f"h{i}"
    anchors.append(
        _anchor(
            "y", (batch, sizes[-1]), AnchorType.OUTPUT, AnchorRole.USER_OUTPUT, (1,), batch_dim=0
        )
    )
    payload = _model(nodes, inputs, [helper.make_tensor_value_info("y", f, [batch, sizes[-1]])], [])
    tensors[PAYLOAD] = np.frombuffer(payload, np.uint8)
    meta = ExecutableMetadata(
        model_name="mlp",
        target=target or Target(),
        batch_size=batch,
        anchors=tuple(anchors),
        **_programs(),
    )
    return Executable.build(meta, tensors)


def batch_of(exe: Executable, seed: int = 0) -> dict[str, np.ndarray]:
    """Random user inputs for one batch of ``exe``."""
    rng = np.random.default_rng(seed)
    return {a.name: rng.standard_normal(a.shape).astype(a.dtype) for a in exe.metadata.user_inputs}
