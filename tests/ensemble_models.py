"""The repositories the ensemble tests serve: NVIDIA's python backend ``preprocessing`` example
in small (python pre-processing -> an ONNX classifier named ``resnet50_trt`` -> python
post-processing, ``tests/repositories/ensemble``), and the shape of Triton's
``L0_simple_ensemble`` (``ensemble_add_sub`` over two versions of an ONNX ``simple`` add/sub
model). Written from the models' description; nothing of NVIDIA's code is copied."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.models import OPSET, save
from tests.triton_qa_models import identity_model

__all__ = [
    "CLASSIFIER_WEIGHTS",
    "PIPELINE",
    "add_sub_model",
    "classifier_model",
    "expected_pipeline",
    "write_add_sub_ensemble",
    "write_decoupled",
    "write_optional_and_reshape",
    "write_pipeline",
]

HERE = Path(__file__).resolve().parent
#: The pipeline ensemble of ``tests/repositories/ensemble``.
PIPELINE = "ensemble_python_resnet50"
_RNG = np.random.default_rng(47)
#: The classifier: scores = flatten(image) @ W + b (48 pixels x 10 classes).
CLASSIFIER_WEIGHTS = (
    _RNG.normal(size=(48, 10)).astype(np.float32),
    _RNG.normal(size=(10,)).astype(np.float32),
)


def classifier_model() -> onnx.ModelProto:
    """``input`` FP32 [batch, 3, 4, 4] -> ``output`` FP32 [batch, 10]: a linear classifier."""
    w, b = CLASSIFIER_WEIGHTS
    nodes = [
        helper.make_node("Flatten", ["input"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "W", "B"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 4, 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


CLASSIFIER_CONFIG = """platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 3, 4, 4 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
"""


def write_pipeline(repo: Path) -> None:
    """The pipeline's four models (the python ones copied, the classifier written) in ``repo``."""
    shutil.copytree(HERE / "repositories" / "ensemble", repo, dirs_exist_ok=True)
    (repo / "resnet50_trt" / "1").mkdir(parents=True, exist_ok=True)
    save(classifier_model(), repo / "resnet50_trt" / "1" / "model.onnx")
    (repo / "resnet50_trt" / "config.pbtxt").write_text(CLASSIFIER_CONFIG)


def expected_pipeline(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[bytes]]:
    """What the pipeline answers for ``raw`` (uint8 [batch, 48]): scores, classes, labels."""
    images = raw.reshape(-1, 4, 4, 3).transpose(0, 3, 1, 2).astype(np.float32) / 255.0 - 0.5
    w, b = CLASSIFIER_WEIGHTS
    scores = images.reshape(len(raw), -1) @ w + b
    top = scores.argmax(axis=1).astype(np.int32)
    return scores, top, [f"class_{k}".encode() for k in top]


def add_sub_model() -> onnx.ModelProto:
    """Triton's ``simple``: INT32 ``INPUT0``, ``INPUT1`` [batch, 16] -> ``OUTPUT0`` = sum,
    ``OUTPUT1`` = difference."""
    io = [
        helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 16])
        for n in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
    ]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    graph = helper.make_graph(nodes, "simple", io[:2], io[2:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


_SIMPLE = """platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { all { } }
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
"""

#: Triton's ``ensemble_add_sub``: the sum from version 2 of ``simple``, the difference from
#: version 1, so a request for one output runs one version only.
_ENSEMBLE_ADD_SUB = """platform: "ensemble"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "simple"
      model_version: 1
      input_map { key: "INPUT0" value: "INPUT0" }
      input_map { key: "INPUT1" value: "INPUT1" }
      output_map { key: "OUTPUT1" value: "OUTPUT1" }
    },
    {
      model_name: "simple"
      model_version: 2
      input_map { key: "INPUT0" value: "INPUT0" }
      input_map { key: "INPUT1" value: "INPUT1" }
      output_map { key: "OUTPUT0" value: "OUTPUT0" }
    }
  ]
}
"""


def write_add_sub_ensemble(repo: Path) -> None:
    """``simple`` (versions 1 and 2) and ``ensemble_add_sub`` in ``repo``."""
    for version in (1, 2):
        (repo / "simple" / str(version)).mkdir(parents=True, exist_ok=True)
        save(add_sub_model(), repo / "simple" / str(version) / "model.onnx")
    (repo / "simple" / "config.pbtxt").write_text(_SIMPLE)
    (repo / "ensemble_add_sub" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "ensemble_add_sub" / "config.pbtxt").write_text(_ENSEMBLE_ADD_SUB)


_RESHAPE_IDENTITY = """platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]
"""

#: ``L0_infer_reshape``'s ensemble case: the client sends and gets [4], the step sees [2, 2].
_ENSEMBLE_RESHAPE = """platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
ensemble_scheduling { step [ {
  model_name: "reshape_identity" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""


def write_optional_and_reshape(repo: Path) -> None:
    """``L0_optional_input``'s ensembles (python identities over optional inputs,
    ``tests/repositories/ensemble_optional``) and a reshaping ensemble over an ONNX identity."""
    shutil.copytree(HERE / "repositories" / "ensemble_optional", repo, dirs_exist_ok=True)
    (repo / "reshape_identity" / "1").mkdir(parents=True, exist_ok=True)
    model = identity_model(1, np.float32, [2, 2], 8)
    save(model, repo / "reshape_identity" / "1" / "model.onnx")
    (repo / "reshape_identity" / "config.pbtxt").write_text(_RESHAPE_IDENTITY)
    (repo / "ensemble_reshape" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "ensemble_reshape" / "config.pbtxt").write_text(_ENSEMBLE_RESHAPE)


_IDENTITY_INT32 = """platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

#: A decoupled step (``repeat``: one response per element) and an ONNX step run on each.
_ENSEMBLE_REPEAT = """platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat" model_version: -1
    input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "element" } },
  { model_name: "identity_int32" model_version: -1
    input_map { key: "INPUT0" value: "element" } output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""


def write_decoupled(repo: Path) -> None:
    """``ensemble_repeat``: the decoupled python ``repeat`` (``tests/repositories/python``), each
    of its responses through an ONNX identity."""
    shutil.copytree(
        HERE / "repositories" / "python" / "repeat", repo / "repeat", dirs_exist_ok=True
    )
    (repo / "identity_int32" / "1").mkdir(parents=True, exist_ok=True)
    save(identity_model(1, np.int32, [1], 0), repo / "identity_int32" / "1" / "model.onnx")
    (repo / "identity_int32" / "config.pbtxt").write_text(_IDENTITY_INT32)
    (repo / "ensemble_repeat" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "ensemble_repeat" / "config.pbtxt").write_text(_ENSEMBLE_REPEAT)
