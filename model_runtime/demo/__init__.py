"""The bundled demo model: a 64-64-10 MLP classifying scikit-learn's 8x8 digits.

``digits_mlp.onnx`` takes ``pixels`` float32 [batch, 64] (raw values 0..16) and returns
``logits`` and ``probabilities`` float32 [batch, 10]. ``digits_samples.npz`` holds held-out
samples (``pixels``, ``labels``, and the model's ``logits``). Both are made by
``scripts/make_demo_model.py``.

:func:`accumulator_model` builds a stateful demo model (a sequence model:
:mod:`model_runtime.sequences`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = [
    "DEMO_MODEL_NAME",
    "DEMO_ONNX_PATH",
    "DEMO_SAMPLES_PATH",
    "accumulator_model",
    "load_demo_samples",
]

DEMO_MODEL_NAME = "digits_mlp"
DEMO_ONNX_PATH = Path(__file__).resolve().parent / "digits_mlp.onnx"
DEMO_SAMPLES_PATH = Path(__file__).resolve().parent / "digits_samples.npz"


def load_demo_samples() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Held-out ``(pixels float32 [N, 64], labels int64 [N], logits float32 [N, 10])``.

    Raises:
        FileNotFoundError: the samples file is not installed.
    """
    with np.load(DEMO_SAMPLES_PATH, allow_pickle=False) as f:
        return f["pixels"], f["labels"], f["logits"]


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def accumulator_model(corrid: bool = False) -> onnx.ModelProto:
    """A stateful accumulator as Triton's sequence batcher drives it (issue 32): ``OUTPUT =
    (START ? 0 : INPUT_STATE) + INPUT``, ``OUTPUT_STATE = OUTPUT``; int32 ``[N, 1]`` tensors,
    ``READY`` multiplies the step (always 1 for a real request). With ``corrid``, a ``CORRID``
    input (int64) that the last step (``END``) adds to its output, as Triton's dyna sequence
    model does."""
    i32 = TensorProto.INT32
    vi = [helper.make_tensor_value_info(n, i32, ["N", 1]) for n in ("INPUT", "START", "READY")]
    vi.append(helper.make_tensor_value_info("INPUT_STATE", i32, ["N", 1]))
    nodes = [
        helper.make_node("Cast", ["START"], ["start_b"], to=TensorProto.BOOL),
        helper.make_node("Sub", ["INPUT_STATE", "INPUT_STATE"], ["zero"]),
        helper.make_node("Where", ["start_b", "zero", "INPUT_STATE"], ["base"]),
        helper.make_node("Add", ["base", "INPUT"], ["sum"]),
        helper.make_node("Mul", ["sum", "READY"], ["acc"]),
    ]
    out = "acc"
    if corrid:
        vi.append(helper.make_tensor_value_info("END", i32, ["N", 1]))
        vi.append(helper.make_tensor_value_info("CORRID", TensorProto.INT64, ["N", 1]))
        nodes += [
            helper.make_node("Cast", ["CORRID"], ["corr32"], to=i32),
            helper.make_node("Mul", ["corr32", "END"], ["corr_end"]),
            helper.make_node("Add", ["acc", "corr_end"], ["acc_end"]),
        ]
        out = "acc_end"
    nodes += [
        helper.make_node("Identity", [out], ["OUTPUT"]),
        helper.make_node("Identity", ["acc"], ["OUTPUT_STATE"]),
    ]
    outputs = [helper.make_tensor_value_info(n, i32, ["N", 1]) for n in ("OUTPUT", "OUTPUT_STATE")]
    return _model(helper.make_graph(nodes, "accumulator", vi, outputs))
