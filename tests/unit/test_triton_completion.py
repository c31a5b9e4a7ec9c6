"""The rest of config.pbtxt, as Triton's onnxruntime backend honours it: a missing or partial
config completed from the model (inputs, outputs, dims, max_batch_size), ``dims: [-1]``,
preferred batch size lists, ``reshape`` at the server boundary, ``optional`` inputs, and
``label_filename`` for the classification extension."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from model_runtime.errors import ConfigurationError, InputValidationError
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.tensors.encode import encode_infer_response
from model_runtime.server.tensors.request import InferRequest, RequestedOutput, TensorSpec
from model_runtime.server.triton import layout
from model_runtime.server.triton.boundary import BoundaryRunner
from model_runtime.server.triton.config import (
    config_json,
    parse_override,
    parse_pbtxt,
    parse_toml,
)
from model_runtime.server.triton.layout import model_batch, plan_model
from model_runtime.server.triton.served import ServedModel, serve_model
from model_runtime.server.triton.settings import ModelSettings

pytestmark = pytest.mark.timeout(10)

RUNNER = ModelRunnerConfig(timeout=0.001)


def pbtxt(tmp_path: Path, text: str) -> ModelSettings:
    path = tmp_path / "config.pbtxt"
    path.write_text(text)
    return parse_pbtxt(path, "m")


def densenet_like(path: Path, first: int | str = 1) -> Path:
    """Triton's densenet_onnx shapes: data_0 [1,3,224,224] -> fc6_1 [1,1000,1,1]."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["data_0"], ["m"], axes=[2, 3], keepdims=1),
            helper.make_node("Tile", ["m", "reps"], ["fc6_1"]),
        ],
        "densenet_like",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [first, 3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [first, 1000, 1, 1])],
        [helper.make_tensor("reps", TensorProto.INT64, [4], [1, 334, 1, 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save_model(model, str(path))
    return path


def serve(settings: ModelSettings, batch: int, inputs: Any, outputs: Any, **kw: Any) -> Any:
    return serve_model("m", settings, settings.runner_config(RUNNER), batch, inputs, outputs, **kw)


# -- max_batch_size: given as 0, left out, and completed from the model --------------------------


def test_max_batch_size_0_given_means_no_batch_axis_whatever_else_the_config_lists(
    tmp_path: Path,
) -> None:
    minimal = pbtxt(tmp_path, 'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
    assert minimal.batch_size == 0
    assert pbtxt(tmp_path, "max_batch_size : 0 # no batch axis").batch_size == 0
    # left out: the model decides (a comment or a nested field of that name is not it)
    assert pbtxt(tmp_path, 'platform: "onnxruntime_onnx" # max_batch_size: 0').batch_size is None
    # a config that lists inputs and outputs is not completed: no max_batch_size is 0
    listed = (
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    assert pbtxt(tmp_path, listed).batch_size == 0
    toml = tmp_path / "m.toml"
    toml.write_text("max_batch_size = 0\n")
    assert parse_toml(toml).batch_size == 0
    assert parse_override(json.dumps({"max_batch_size": 0}), "m").batch_size == 0
    assert parse_override("{}", "m").batch_size is None


def test_the_model_decides_the_batch_axis_as_triton_does_for_onnx(tmp_path: Path) -> None:
    fixed = densenet_like(tmp_path / "fixed.onnx", first=1)
    dynamic = densenet_like(tmp_path / "dynamic.onnx", first="N")
    two = densenet_like(tmp_path / "two.onnx", first=2)
    triton = ModelSettings(pbtxt(tmp_path, "").config, triton=True)
    flat = ModelSettings(triton.config)
    # Triton's layout: batched only when every first dimension is variable
    assert model_batch(fixed, triton) == 0
    assert model_batch(two, triton) == 0
    assert model_batch(dynamic, triton) is None  # the server's batch
    # our flat layout: the model's own batch (above 1), else the server's
    assert (model_batch(fixed, flat), model_batch(two, flat)) == (None, 2)
    # the config's own word wins
    assert model_batch(dynamic, pbtxt(tmp_path, "max_batch_size: 0")) == 0
    assert model_batch(fixed, pbtxt(tmp_path, "max_batch_size: 4")) == 4


def test_a_minimal_densenet_config_is_completed_from_the_model(tmp_path: Path) -> None:
    model_dir = tmp_path / "densenet_onnx"
    (model_dir / "1").mkdir(parents=True)
    densenet_like(model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
    plan = plan_model("densenet_onnx", model_dir)
    assert plan.settings.batch_size == 0
    ins = [TensorSpec("data_0", "FP32", (1, 3, 224, 224))]
    outs = [TensorSpec("fc6_1", "FP32", (1, 1000, 1, 1))]
    served = serve(plan.settings, 0, ins, outs)
    assert (served.inputs, served.outputs, served.boundary) == (tuple(ins), tuple(outs), None)
    doc = config_json(served.config)
    assert doc["max_batch_size"] == 0
    assert [(t["name"], t["data_type"], t["dims"]) for t in doc["input"]] == [
        ("data_0", "TYPE_FP32", [1, 3, 224, 224])
    ]
    assert [(t["name"], t["dims"]) for t in doc["output"]] == [("fc6_1", [1, 1000, 1, 1])]
    assert "dynamic_batching" not in doc


def test_a_partial_config_gets_the_tensors_it_leaves_out(tmp_path: Path) -> None:
    s = pbtxt(
        tmp_path, 'max_batch_size: 8\noutput [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    )
    served = serve(s, 8, [TensorSpec("x", "INT64", (-1, -1))], [TensorSpec("y", "FP32", (-1, 4))])
    doc = config_json(served.config)
    assert [(t["name"], t["data_type"], t["dims"]) for t in doc["input"]] == [
        ("x", "TYPE_INT64", [-1])
    ]
    assert served.inputs == (TensorSpec("x", "INT64", (-1, -1)),)


def test_a_batch_only_tensor_is_completed_as_triton_does(tmp_path: Path) -> None:
    """[batch] alone: dims [1] and an empty reshape; the client sends [batch, 1]."""
    s = ModelSettings(pbtxt(tmp_path, "max_batch_size: 4").config, batch_size=4, triton=True)
    served = serve(s, 4, [TensorSpec("x", "FP32", (-1,))], [TensorSpec("y", "FP32", (-1,))])
    doc = config_json(served.config)
    assert (doc["input"][0]["dims"], doc["input"][0]["reshape"]) == ([1], {"shape": []})
    assert served.inputs[0].shape == (-1, 1)
    assert served.boundary is not None
    model = served.boundary.to_model({"x": np.arange(3, dtype=np.float32).reshape(3, 1)})
    assert model["x"].shape == (3,)
    back = served.boundary.to_client({"y": np.zeros(3, np.float32)})
    assert back["y"].shape == (3, 1)


# -- dims: [-1] ----------------------------------------------------------------------------------

DIMS = """
max_batch_size: 4
input [ {{ name: "x" data_type: TYPE_FP32 dims: {dims} }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: {out} }} ]
"""


def test_minus_one_dims_match_a_variable_model_dimension(tmp_path: Path) -> None:
    variable = [TensorSpec("x", "FP32", (-1, -1))], [TensorSpec("y", "FP32", (-1, -1))]
    s = pbtxt(tmp_path, DIMS.format(dims="[ -1 ]", out="[ -1 ]"))
    served = serve(s, 4, *variable)
    assert served.boundary is None  # nothing to check or reshape: the runner's own check
    assert config_json(served.config)["input"][0]["dims"] == [-1]
    # -1 where the model is fixed: served as Triton serves it (clients see -1; a request of
    # another size than the model's is the model's to refuse)
    fixed = [TensorSpec("x", "FP32", (-1, 4))], [TensorSpec("y", "FP32", (-1, 1))]
    served = serve(s, 4, *fixed)
    assert (served.inputs[0].shape, served.outputs[0].shape) == ((-1, -1), (-1, -1))
    ok = np.zeros((2, 4), np.float32)
    assert served.boundary is None or served.boundary.to_model({"x": ok})["x"] is ok


def test_a_fixed_config_dim_narrows_a_variable_model_input(tmp_path: Path) -> None:
    s = pbtxt(tmp_path, DIMS.format(dims="[ 3 ]", out="[ -1 ]"))
    served = serve(s, 4, [TensorSpec("x", "FP32", (-1, -1))], [TensorSpec("y", "FP32", (-1, -1))])
    assert served.inputs[0].shape == (-1, 3)
    assert served.boundary is not None
    ok = np.zeros((2, 3), np.float32)
    assert served.boundary.to_model({"x": ok})["x"] is ok  # checked, not copied
    with pytest.raises(InputValidationError, match=r"input 'x': shape \[2, 5\].*\[-1, 3\]"):
        served.boundary.to_model({"x": np.zeros((2, 5), np.float32)})
    # an output matches exactly (Triton's compare_exact): a fixed dim is not a variable one
    s = pbtxt(tmp_path, DIMS.format(dims="[ -1 ]", out="[ 3 ]"))
    with pytest.raises(ConfigurationError, match=r"output\[0\].dims"):
        serve(s, 4, [TensorSpec("x", "FP32", (-1, -1))], [TensorSpec("y", "FP32", (-1, -1))])


# -- preferred_batch_size ------------------------------------------------------------------------

PREFERRED = "max_batch_size: 8\ndynamic_batching {{ preferred_batch_size: {sizes} }}\n"


def test_preferred_batch_sizes_are_buckets_of_max_batch_size(tmp_path: Path) -> None:
    s = pbtxt(tmp_path, PREFERRED.format(sizes="[ 8, 4 ]"))
    assert (s.batch_size, s.preferred_batch_sizes) == (8, (4, 8))  # compiled for 8
    ins, outs = [TensorSpec("x", "FP32", (-1, 4))], [TensorSpec("y", "FP32", (-1, 4))]
    served = serve(s, 8, ins, outs, batch_sizes=(1, 2, 4, 8))
    assert config_json(served.config)["dynamic_batching"]["preferred_batch_size"] == [8, 4]
    # an executable that runs one batch size cannot honour 4
    with pytest.raises(ConfigurationError, match=r"preferred_batch_size: 4 is not a batch size"):
        serve(s, 8, ins, outs, batch_sizes=(8,))
    # one size stays the batch run, as before
    one = pbtxt(tmp_path, PREFERRED.format(sizes="[ 4 ]"))
    assert (one.batch_size, one.max_batch_size) == (4, 8)
    with pytest.raises(
        ConfigurationError, match=r"preferred_batch_size: 9 must be in 1..max_batch_size \(8\)"
    ):
        pbtxt(tmp_path, PREFERRED.format(sizes="[ 4, 9 ]"))


# -- reshape -------------------------------------------------------------------------------------

RESHAPE = """
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 6 ] reshape { shape: [ -1, 2, 3 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 6 ] reshape { shape: [ -1, 2, 3 ] } } ]
"""


class FakeRunner:
    """Records what execute is given and answers y = x."""

    def __init__(self) -> None:
        self.seen: list[Mapping[str, np.ndarray]] = []

    async def execute(self, inputs: Mapping[str, np.ndarray], *args: Any) -> dict[str, Any]:
        self.seen.append(inputs)
        return {"y": inputs["x"]}


def test_reshape_applies_at_the_server_boundary(tmp_path: Path) -> None:
    s = pbtxt(tmp_path, RESHAPE)
    model = [TensorSpec("x", "FP32", (-1, -1, 2, 3))], [TensorSpec("y", "FP32", (-1, -1, 2, 3))]
    served: ServedModel = serve(s, 4, *model)
    assert served.inputs[0].shape == (-1, -1, 6)  # what clients see: dims
    assert served.boundary is not None
    fake = FakeRunner()
    runner = BoundaryRunner(fake, served.boundary)  # type: ignore[arg-type]
    x = np.arange(2 * 5 * 6, dtype=np.float32).reshape(2, 5, 6)
    out = asyncio.run(runner.execute({"x": x}))
    assert fake.seen[0]["x"].shape == (2, 5, 2, 3)  # what the model sees: reshape.shape
    assert out["y"].shape == (2, 5, 6)
    np.testing.assert_array_equal(out["y"], x)
    with pytest.raises(InputValidationError, match="input 'x'"):
        asyncio.run(runner.execute({"x": np.zeros((2, 5, 7), np.float32)}))
    # the model is compared with reshape.shape, not dims
    with pytest.raises(ConfigurationError, match=r"input\[0\].reshape.shape"):
        serve(s, 4, [TensorSpec("x", "FP32", (-1, -1, 6))], model[1])


@pytest.mark.parametrize(
    ("dims", "shape", "ok"),
    [
        ("[ 4 ]", "[ 2, 2 ]", True),
        ("[ 2, 4, -1, 6 ]", "[ 8, -1, 1, 6 ]", True),  # Triton's own example
        ("[ 1 ]", "[ ]", True),  # a scalar
        ("[ 4 ]", "[ 3 ]", False),
        ("[ -1, 4 ]", "[ 4, -1 ]", False),
        ("[ 2 ]", "[ ]", False),
    ],
)
def test_reshape_must_hold_the_elements_of_dims(
    tmp_path: Path, dims: str, shape: str, ok: bool
) -> None:
    text = (
        f'input [ {{ name: "x" data_type: TYPE_FP32 dims: {dims} reshape {{ shape: {shape} }} }} ]'
    )
    if ok:
        pbtxt(tmp_path, text)
    else:
        with pytest.raises(ConfigurationError, match=r"input\[0\].reshape"):
            pbtxt(tmp_path, text)


# -- optional inputs -----------------------------------------------------------------------------

OPTIONAL = """
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "bias" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def test_an_optional_input_loads_and_is_still_served(tmp_path: Path) -> None:
    s = pbtxt(tmp_path, OPTIONAL)
    x, bias, y = (TensorSpec(n, "FP32", (4,)) for n in ("x", "bias", "y"))
    served = serve(s, 0, [x, bias], [y])
    assert [i["optional"] for i in config_json(served.config)["input"]] == [False, True]
    assert [i.name for i in served.inputs] == ["x", "bias"]
    # a model with a batch axis: Triton's onnxruntime backend refuses an optional input
    with pytest.raises(ConfigurationError, match=r"input\[1\].optional"):
        batched = [TensorSpec(t.name, "FP32", (-1, 4)) for t in (x, bias, y)]
        serve(ModelSettings(s.config), 4, batched[:2], batched[2:])
    # the model has no such input: an ONNX input with a default is compiled as a constant
    with pytest.raises(ConfigurationError, match=r"input\[1\].name.*no input 'bias'"):
        serve(s, 0, [x], [y])


# -- label_filename ------------------------------------------------------------------------------

LABELS = """
max_batch_size: 4
output [ { name: "probs" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]
"""


def test_labels_answer_classification_as_score_index_label(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.onnx").write_bytes(b"")
    (tmp_path / "config.pbtxt").write_text(LABELS)
    (tmp_path / "labels.txt").write_text("cat\ndog\nemu\n")
    plan = plan_model(tmp_path.name, tmp_path)
    assert plan.settings.labels == {"probs": ("cat", "dog", "emu")}
    served = serve(
        plan.settings,
        4,
        [TensorSpec("x", "FP32", (-1, 3))],
        [TensorSpec("probs", "FP32", (-1, 3))],
    )
    assert served.outputs[0].labels == ("cat", "dog", "emu")
    request = InferRequest(None, {}, (RequestedOutput("probs", False, class_count=2),))
    body, _ = encode_infer_response(
        "m",
        "1",
        request,
        {"probs": np.array([[0.1, 0.7, 0.2]], np.float32)},
        {"probs": "FP32"},
        specs=served.outputs,
    )
    assert json.loads(body)["outputs"][0]["data"] == ["0.700000:1:dog", "0.200000:2:emu"]


def test_a_bad_labels_file_fails_the_model_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.onnx").write_bytes(b"")
    (tmp_path / "config.pbtxt").write_text(LABELS)
    with pytest.raises(ConfigurationError, match=r"output\[0\].label_filename.*cannot read"):
        plan_model(tmp_path.name, tmp_path)
    (tmp_path / "labels.txt").write_text("a\n" * 100)
    monkeypatch.setattr(layout, "MAX_LABELS_BYTES", 64)
    with pytest.raises(ConfigurationError, match=r"output\[0\].label_filename.*over 64 bytes"):
        plan_model(tmp_path.name, tmp_path)


# -- what we still do not serve ------------------------------------------------------------------


def test_dynamic_batching_for_a_model_without_a_batch_axis_fails_naming_it(
    tmp_path: Path,
) -> None:
    s = ModelSettings(pbtxt(tmp_path, "dynamic_batching { }").config, triton=True)
    with pytest.raises(ConfigurationError, match="dynamic_batching"):
        serve(s, 0, [TensorSpec("x", "FP32", (1, 4))], [TensorSpec("y", "FP32", (1, 4))])
