"""Ragged batching on the real daemon, as Triton's ``ragged_batching.md`` example has it: a
model takes ``INPUT`` as one 1-dimensional tensor, the concatenation of every request's
elements, and ``INDEX`` (``BATCH_ACCUMULATED_ELEMENT_COUNT``) where each request's elements end.
Three requests of 3, 4 and 5 elements run as one batch, unpadded, and each gets its own sum;
the model also answers how many requests its batch held."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

# max_batch_size 3: the third request fills the batch, which then runs at once (the delay is
# only for a batch that does not fill).
CONFIG = """
name: "ragged"
platform: "onnxruntime_onnx"
max_batch_size: 3
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [
  { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "BATCH" data_type: TYPE_FP32 dims: [ 1 ] }
]
batch_input [ {
  kind: BATCH_ACCUMULATED_ELEMENT_COUNT
  target_name: "INDEX"
  data_type: TYPE_FP32
  source_input: "INPUT"
} ]
dynamic_batching { max_queue_delay_microseconds: 30000000 }
"""


def _ragged_sum(path: Path) -> None:
    """SUM[i] = the sum of request i's elements of INPUT (INDEX: where each ends);
    BATCH[i] = the requests in the batch. INPUT, INDEX: [n]; SUM, BATCH: [requests, 1]."""
    i64 = TensorProto.INT64
    consts = [
        helper.make_tensor("axis0", i64, [], [0]),
        helper.make_tensor("one", i64, [1], [1]),
        helper.make_tensor("zero_f", TensorProto.FLOAT, [1], [0.0]),
        helper.make_tensor("start0", i64, [1], [0]),
        helper.make_tensor("axes1", i64, [1], [1]),
    ]
    nodes = [
        helper.make_node("CumSum", ["INPUT", "axis0"], ["cs"]),
        helper.make_node("Cast", ["INDEX"], ["index_i"], to=i64),
        helper.make_node("Sub", ["index_i", "one"], ["last"]),
        helper.make_node("Gather", ["cs", "last"], ["ends"], axis=0),
        helper.make_node("Concat", ["zero_f", "ends"], ["padded"], axis=0),
        helper.make_node("Shape", ["INDEX"], ["n"]),
        helper.make_node("Slice", ["padded", "start0", "n", "start0"], ["starts"]),
        helper.make_node("Sub", ["ends", "starts"], ["sums"]),
        helper.make_node("Unsqueeze", ["sums", "axes1"], ["SUM"]),
        helper.make_node("Cast", ["n"], ["n_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["n_f", "axes1"], ["n_11"]),
        helper.make_node("Concat", ["n", "one"], ["shape_n1"], axis=0),
        helper.make_node("Expand", ["n_11", "shape_n1"], ["BATCH"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ragged_sum",
        [
            helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["E"]),
            helper.make_tensor_value_info("INDEX", TensorProto.FLOAT, ["R"]),
        ],
        [
            helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["R", 1]),
            helper.make_tensor_value_info("BATCH", TensorProto.FLOAT, ["R", 1]),
        ],
        consts,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("ragged")
    repo = tmp / "models"
    (repo / "ragged").mkdir(parents=True)
    (repo / "ragged" / "config.pbtxt").write_text(CONFIG)
    _ragged_sum(repo / "ragged" / "1" / "model.onnx")
    d = start_daemon(tmp, f"--model-repository={repo}")
    try:
        yield d
    finally:
        stop_daemon(d)


def _infer(d: Daemon, values: list[float]) -> dict[str, Any]:
    tensor = {"name": "INPUT", "datatype": "FP32", "shape": [1, len(values)], "data": values}
    status, out = d.post("/v2/models/ragged/infer", {"inputs": [tensor]})
    assert status == 200, out
    return {o["name"]: (o["shape"], o["data"]) for o in out["outputs"]}


def _executions(d: Daemon) -> int:
    status, doc = d.get("/v2/models/ragged/stats")
    assert status == 200, doc
    return int(doc["model_stats"][0]["execution_count"])


def test_requests_of_different_lengths_run_as_one_unpadded_batch(daemon: Daemon) -> None:
    status, config = daemon.get("/v2/models/ragged/config")
    assert status == 200
    assert config["max_batch_size"] == 3 and config["input"][0]["allow_ragged_batch"] is True
    requests = [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0, 40.0], [0.5] * 5]
    before = _executions(daemon)
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda v: _infer(daemon, v), requests))
    for values, answer in zip(requests, answers, strict=True):
        assert answer["SUM"] == ([1, 1], [sum(values)])  # its own elements only
        assert answer["BATCH"] == ([1, 1], [3.0])  # the three ran together
    assert _executions(daemon) == before + 1


def test_a_request_the_model_cannot_take_is_refused_alone(daemon: Daemon) -> None:
    tensor = {"name": "INPUT", "datatype": "FP32", "shape": [4, 2], "data": [1.0] * 8}
    status, out = daemon.post("/v2/models/ragged/infer", {"inputs": [tensor]})
    assert status == 400 and "max_batch_size" in out["error"], out
