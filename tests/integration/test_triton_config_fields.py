"""A Triton repository as Triton's own examples lay it out, served by the real daemon and read
with Triton's client: an identity model with ``dims: [ -1 ]``, a classifier with a
``label_filename``, a model with an ``optional`` input, one with ``reshape``, ``densenet_onnx``
with a config holding only its platform and ``max_batch_size: 0``, and one with
``preferred_batch_size: [ 4, 8 ]``. Each loads and answers right."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.integration.test_daemon_repository import add_const
from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = [pytest.mark.timeout(180)]

W = np.array([[1, 0, 0], [0, 2, 0], [0, 0, 3], [1, 1, 1]], np.float32)
LABELS = ["cat", "dog", "emu"]


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))


def _info(name: str, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def identity(path: Path) -> None:
    """y = x, both FLOAT [batch, n] with n any size."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [_info("x", ["N", "n"])],
        [_info("y", ["N", "n"])],
    )
    _save(graph, path)


def classifier(path: Path) -> None:
    """probs = x @ W: x [batch, 4] -> probs [batch, 3]."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["probs"])],
        "classifier",
        [_info("x", ["N", 4])],
        [_info("probs", ["N", 3])],
        [numpy_helper.from_array(W, "W")],
    )
    _save(graph, path)


def with_bias(path: Path) -> None:
    """y = x + bias, all FLOAT [4], no batch axis."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        "with_bias",
        [_info("x", [4]), _info("bias", [4])],
        [_info("y", [4])],
    )
    _save(graph, path)


def doubler(path: Path) -> None:
    """y = 2 x, FLOAT [batch, 2, 3]."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "doubler",
        [_info("x", ["N", 2, 3])],
        [_info("y", ["N", 2, 3])],
    )
    _save(graph, path)


def densenet_like(path: Path) -> None:
    """Triton's densenet_onnx shapes: data_0 [1,3,224,224] -> fc6_1 [1,1000,1,1] (each
    channel's mean, tiled)."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["data_0"], ["m"], axes=[2, 3], keepdims=1),
            helper.make_node("Tile", ["m", "reps"], ["t"]),
            helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["fc6_1"]),
        ],
        "densenet_like",
        [_info("data_0", [1, 3, 224, 224])],
        [_info("fc6_1", [1, 1000, 1, 1])],
        [
            numpy_helper.from_array(np.array([1, 334, 1, 1], np.int64), "reps"),
            numpy_helper.from_array(np.array([0], np.int64), "starts"),
            numpy_helper.from_array(np.array([1000], np.int64), "ends"),
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
        ],
    )
    _save(graph, path)


CONFIGS = {
    "identity_fp32": """
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
""",
    "classifier": """
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "probs" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]
""",
    "optional_bias": """
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "bias" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
""",
    "reshaped": """
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 6 ] reshape { shape: [ 2, 3 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 6 ] reshape { shape: [ 2, 3 ] } } ]
""",
    "densenet_onnx": 'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n',
    "preferred": """
max_batch_size: 8
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 20000 }
""",
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("triton_fields")
    repo = tmp / "models"
    for name, text in CONFIGS.items():
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text)
    identity(repo / "identity_fp32" / "1" / "model.onnx")
    classifier(repo / "classifier" / "1" / "model.onnx")
    (repo / "classifier" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    with_bias(repo / "optional_bias" / "1" / "model.onnx")
    doubler(repo / "reshaped" / "1" / "model.onnx")
    densenet_like(repo / "densenet_onnx" / "1" / "model.onnx")
    (repo / "preferred" / "1").mkdir()
    onnx.save_model(add_const(1.0), str(repo / "preferred" / "1" / "model.onnx"))
    mp = pytest.MonkeyPatch()
    mp.setenv("MODEL_RUNTIME_DEVICES", "cpu:6x1")
    try:
        d = start_daemon(tmp, "--model-repository", str(repo), "--no-access-log")
    finally:
        mp.undo()
    try:
        yield d
    finally:
        stop_daemon(d)


@pytest.fixture
def client(daemon: Daemon) -> Iterator[object]:
    c = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    try:
        yield c
    finally:
        c.close()


def infer(client: object, model: str, outputs: list[object] | None = None, **arrays: np.ndarray):  # type: ignore[no-untyped-def]
    inputs = []
    for name, arr in arrays.items():
        i = httpclient.InferInput(name, list(arr.shape), "FP32")
        i.set_data_from_numpy(arr)
        inputs.append(i)
    return client.infer(model, inputs, outputs=outputs)  # type: ignore[attr-defined]


def test_every_model_loads(daemon: Daemon) -> None:
    status, index = daemon.post("/v2/repository/index")
    assert status == 200
    assert {r["name"]: (r["state"], r["reason"]) for r in index} == {
        name: ("READY", "") for name in CONFIGS
    }


def test_identity_with_variable_dims_takes_any_length(client: object) -> None:
    meta = client.get_model_metadata("identity_fp32")  # type: ignore[attr-defined]
    assert [i["shape"] for i in meta["inputs"]] == [[-1, -1]]
    assert client.get_model_config("identity_fp32")["input"][0]["dims"] == [-1]  # type: ignore[attr-defined]
    for shape in [(1, 3), (2, 7), (5, 1)]:
        x = np.random.default_rng(shape[1]).standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(infer(client, "identity_fp32", x=x).as_numpy("y"), x)


def test_the_classifier_answers_score_index_label(client: object) -> None:
    x = np.array([[0, 1, 0, 0], [0, 0, 1, 0]], np.float32)  # probs [0,2,0] and [0,0,3] + 0
    out = httpclient.InferRequestedOutput("probs", class_count=2, binary_data=False)
    got = infer(client, "classifier", outputs=[out], x=x).as_numpy("probs")
    assert [[v.decode() if isinstance(v, bytes) else v for v in row] for row in got] == [
        ["2.000000:1:dog", "0.000000:0:cat"],
        ["3.000000:2:emu", "0.000000:0:cat"],
    ]
    config = client.get_model_config("classifier")  # type: ignore[attr-defined]
    assert config["output"][0]["label_filename"] == "labels.txt"


def test_an_optional_input_the_model_needs_is_refused_naming_it(client: object) -> None:
    config = client.get_model_config("optional_bias")  # type: ignore[attr-defined]
    assert [i["optional"] for i in config["input"]] == [False, True]
    x, bias = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
    y = infer(client, "optional_bias", x=x, bias=bias).as_numpy("y")
    np.testing.assert_array_equal(y, x + bias)
    with pytest.raises(InferenceServerException) as info:
        infer(client, "optional_bias", x=x)
    assert info.value.status() == "400"
    # the request may leave it out (Triton's core takes it); the model cannot run without it
    assert "missing ['bias']" in str(info.value)


def test_reshape_serves_dims_to_the_client_and_reshape_to_the_model(client: object) -> None:
    meta = client.get_model_metadata("reshaped")  # type: ignore[attr-defined]
    assert [i["shape"] for i in meta["inputs"]] == [[-1, 6]]
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    y = infer(client, "reshaped", x=x).as_numpy("y")
    assert y.shape == (2, 6)
    np.testing.assert_array_equal(y, 2 * x)
    with pytest.raises(InferenceServerException, match="input 'x'"):
        infer(client, "reshaped", x=np.zeros((2, 5), np.float32))


def test_densenet_with_a_minimal_config_is_completed_from_the_model(client: object) -> None:
    config = client.get_model_config("densenet_onnx")  # type: ignore[attr-defined]
    assert config["max_batch_size"] == 0
    assert [(i["name"], i["dims"]) for i in config["input"]] == [("data_0", [1, 3, 224, 224])]
    assert [(o["name"], o["dims"]) for o in config["output"]] == [("fc6_1", [1, 1000, 1, 1])]
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    y = infer(client, "densenet_onnx", data_0=x).as_numpy("fc6_1")
    assert y.shape == (1, 1000, 1, 1)
    means = x.mean(axis=(2, 3)).ravel()
    np.testing.assert_allclose(y.ravel()[:6], np.tile(means, 2), rtol=1e-4, atol=1e-5)


def test_preferred_batch_sizes_are_the_sizes_it_runs(daemon: Daemon, client: object) -> None:
    config = client.get_model_config("preferred")  # type: ignore[attr-defined]
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}]}

    def one(_: int) -> float:  # urllib, not tritonclient: its gevent pool is one thread's
        status, answer = daemon.post("/v2/models/preferred/infer", doc)
        assert status == 200, answer
        return float(answer["outputs"][0]["data"][0])

    # Earlier tests' tritonclient.http clients (gevent) must be collected on this thread: one
    # collected in a worker thread raises gevent's InvalidThreadUseError from its __del__.
    gc.collect()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(48)))
    assert answers == [1.0] * 48
    status, doc = daemon.get("/v2/models/preferred/stats")
    assert status == 200
    stats = doc["model_stats"][0]["batch_stats"]
    sizes = {b["batch_size"] for b in stats}
    assert sizes and sizes <= {1, 2, 4, 8}  # its buckets: 4 and 8 among them
    ran = sum(b["batch_size"] * b["compute_infer"]["count"] for b in stats)
    assert ran >= 48
