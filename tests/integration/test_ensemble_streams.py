"""Decoupled ensembles as Triton runs them, against the daemon: each response of a decoupled
step runs what follows it at once, beside the branches of its other responses, and each branch's
result streams out as it ends (``tests/repositories/ensemble_streams``: ``repeat`` -> ``gate``,
whose odd element is answered only while the next one is in the model too, so only branches
that run at once are answered, the later one first); and Triton's rule that a step takes its
inputs from one decoupled step at most, refused at load with the ensemble and step named.
"""

from __future__ import annotations

import json
import queue
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper

from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon, wait_for
from tests.models import _model, save

pytestmark = pytest.mark.timeout(120)
HERE = Path(__file__).resolve().parents[1] / "repositories"

_ADD_INT32 = """platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def _add_int32() -> Any:
    """``OUTPUT0 = INPUT0 + INPUT1``, INT32 [1]."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"])],
        "add_int32",
        [helper.make_tensor_value_info(n, TensorProto.INT32, [1]) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, [1])],
    )
    return _model(graph)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("ensemble_streams")
    repo = tmp / "models"
    shutil.copytree(HERE / "ensemble_streams", repo)
    shutil.copytree(HERE / "python" / "repeat", repo / "repeat")
    (repo / "add_int32" / "1").mkdir(parents=True)
    save(_add_int32(), repo / "add_int32" / "1" / "model.onnx")
    (repo / "add_int32" / "config.pbtxt").write_text(_ADD_INT32)
    # two_streams fails to load on purpose: the others serve on.
    d = start_daemon(
        tmp, "--model-repository", str(repo), "--exit-on-error=false", wait_ready=False
    )

    def loaded() -> bool:
        states = {m["name"]: m["state"] for m in d.post("/v2/repository/index")[1]}
        return states.get("ensemble_gate") == "READY" and states.get("two_streams") in (
            "READY",
            "UNAVAILABLE",
        )

    try:
        wait_for(loaded, 60, "the models to load")
    except BaseException:
        stop_daemon(d)
        raise
    yield d
    stop_daemon(d)


def test_the_branches_of_a_decoupled_step_run_at_once_over_grpc(daemon: Daemon) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(lambda result, error: answers.put((result, error)))
    try:
        inp = grpcclient.InferInput("IN", [2], "INT32")
        inp.set_data_from_numpy(np.array([1, 2], np.int32))
        client.async_stream_infer("ensemble_gate", [inp], request_id="g")
        got = []
        for _ in range(2):
            result, error = answers.get(timeout=30)
            assert error is None, error  # 1 is answered only while 2 is in gate too
            got.append(int(result.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
    assert got == [2, 1]  # each as its branch ends: 2's first, while 1's waited for it


def test_the_branches_of_a_decoupled_step_stream_over_generate_stream(daemon: Daemon) -> None:
    status, body = daemon.post("/v2/models/ensemble_gate/generate_stream", {"IN": [3, 4]})
    assert status == 200, body
    text = body if isinstance(body, str) else json.dumps(body)
    events = [json.loads(c.removeprefix("data: ")) for c in text.split("\n\n") if c.strip()]
    assert [e.get("OUT") for e in events] == [4, 3], events


def test_a_step_fed_by_two_decoupled_steps_is_refused_at_load(daemon: Daemon) -> None:
    index = {m["name"]: m for m in daemon.post("/v2/repository/index")[1]}
    assert index["two_streams"]["state"] == "UNAVAILABLE"
    reason = index["two_streams"].get("reason", "")
    assert "in ensemble two_streams, step 2 of model 'add_int32' receives inputs originated " in (
        reason
    )
    assert "from different decoupled models" in reason
    assert "step 0 (model 'repeat')" in reason and "step 1 (model 'repeat')" in reason
    status, _ = daemon.get("/v2/models/two_streams/ready")
    assert status != 200
    status, _ = daemon.get("/v2/models/ensemble_gate/ready")
    assert status == 200  # the others serve on
