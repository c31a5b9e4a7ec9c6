"""Stateful models over the daemon (issue 32): the calls NVIDIA's three sequence examples make
(``simple_http_sequence_sync_infer_client``, ``simple_grpc_sequence_sync_infer_client``,
``simple_grpc_sequence_stream_infer_client``), written here, against ``simple_sequence`` as
they expect it (Triton's layout and config, the model built as ONNX); and an accumulator with
implicit state (``acc``): 200 sequences over gRPC streams and HTTP at once, on two instances
under the fault suite's kind of plan (recoverable faults every 20 runs, one instance's device
crashing for good mid-run), every answer the accumulator computed here."""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_daemon_support import Daemon, metric, start_daemon, stop_daemon
from tests.models import make_accumulator, make_simple_sequence, save

pytestmark = pytest.mark.timeout(180)

VALUES = [11, 7, 5, 3, 2, 0, 1]

SIMPLE_SEQUENCE = """
name: "simple_sequence"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""

# Slots for the 200 sequences at once; and each client below drives 25 sequences in turn, so
# a sequence waits 25 requests between its steps: a longer idle limit than Triton's 1 s default,
# which a loaded machine (make test beside other work) passes.
ACC = """
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  oldest { max_candidate_sequences: 256 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 } ] }
  ]
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32
            dims: [ 1 ] initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true
            name: "zeros" } } ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("sequences")
    repo = tmp / "models"
    for name, model, config in (
        ("simple_sequence", make_simple_sequence(), SIMPLE_SEQUENCE),
        ("acc", make_accumulator(corrid=True), ACC),
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        save(model, repo / name / "1" / "model.onnx")
    d = start_daemon(tmp, "--model-repository", str(repo))
    yield d
    stop_daemon(d)
    assert d.proc.returncode == 0


#: The fault suite's kind of plan: recoverable faults on every instance, and instance 1's
#: device crashing on every run from its 60th (it leaves service; instance 0 serves on).
FAULTS = "recoverable:every=20;crash:every=1:from=60:replica=1"


@pytest.fixture
def faulty(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon serving ``acc`` alone, every other setting its default, with :data:`FAULTS`."""
    repo = tmp_path / "models"
    (repo / "acc" / "1").mkdir(parents=True)
    (repo / "acc" / "config.pbtxt").write_text(ACC)
    save(make_accumulator(corrid=True), repo / "acc" / "1" / "model.onnx")
    config = tmp_path / "daemon.toml"
    config.write_text(f'[runner]\nfault_plan = "{FAULTS}"\n')
    d = start_daemon(tmp_path, "--config", str(config), "--model-repository", str(repo))
    yield d
    stop_daemon(d)


def expected(values: list[int]) -> list[int]:
    """What NVIDIA's examples expect of ``simple_sequence``: the first step adds 1."""
    return [values[0] + 1, *values[1:]]


def _data(value: int) -> np.ndarray:
    return np.full(shape=[1, 1], fill_value=value, dtype=np.int32)


def test_nvidias_http_sequence_calls(daemon: Daemon) -> None:
    """simple_http_sequence_sync_infer_client: two int sequences and a uuid string one."""
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        for sid, values in (
            (1000, [0, *VALUES]),
            (1001, [100, *(-v for v in VALUES)]),
            (str(uuid.uuid4()), [20, *(-v for v in VALUES)]),
        ):
            got = []
            for count, value in enumerate(values, 1):
                inputs = [httpclient.InferInput("INPUT", [1, 1], "INT32")]
                inputs[0].set_data_from_numpy(_data(value))
                result = client.infer(
                    model_name="simple_sequence",
                    inputs=inputs,
                    outputs=[httpclient.InferRequestedOutput("OUTPUT")],
                    sequence_id=sid,
                    sequence_start=count == 1,
                    sequence_end=count == len(values),
                )
                got.append(int(result.as_numpy("OUTPUT")[0][0]))
            assert got == expected(values), sid


def test_nvidias_grpc_sequence_sync_calls(daemon: Daemon) -> None:
    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        for sid, values in ((1000, [0, *VALUES]), (str(uuid.uuid4()), [20, *VALUES])):
            got = []
            for count, value in enumerate(values, 1):
                inputs = [grpcclient.InferInput("INPUT", [1, 1], "INT32")]
                inputs[0].set_data_from_numpy(_data(value))
                result = client.infer(
                    model_name="simple_sequence",
                    inputs=inputs,
                    outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                    sequence_id=sid,
                    sequence_start=count == 1,
                    sequence_end=count == len(values),
                )
                got.append(int(result.as_numpy("OUTPUT")[0][0]))
            assert got == expected(values), sid


def test_nvidias_grpc_sequence_stream_calls(daemon: Daemon) -> None:
    """simple_grpc_sequence_stream_infer_client: three sequences sent at once on one stream,
    answers matched by request id."""
    answers: queue.Queue[Any] = queue.Queue()

    def callback(result: Any, error: Any) -> None:
        answers.put(error if error else result)

    sequences = {
        "1000": [0, *VALUES],
        "1001": [100, *(-v for v in VALUES)],
        str(uuid.uuid4()): [20, *(-v for v in VALUES)],
    }
    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        client.start_stream(callback=callback)
        for sid, values in sequences.items():
            for count, value in enumerate(values, 1):
                inputs = [grpcclient.InferInput("INPUT", [1, 1], "INT32")]
                inputs[0].set_data_from_numpy(_data(value))
                client.async_stream_infer(
                    model_name="simple_sequence",
                    inputs=inputs,
                    outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                    request_id=f"{sid}_{count}",
                    sequence_id=int(sid) if sid.isdigit() else sid,
                    sequence_start=count == 1,
                    sequence_end=count == len(values),
                )
        got: dict[str, list[int]] = {sid: [] for sid in sequences}
        for _ in range(sum(len(v) for v in sequences.values())):
            item = answers.get(timeout=30)
            assert not isinstance(item, InferenceServerException), item
            sid = item.get_response().id.rsplit("_", 1)[0]
            got[sid].append(int(item.as_numpy("OUTPUT")[0][0]))
        client.stop_stream()
    for sid, values in sequences.items():
        assert got[sid] == expected(values), sid


def test_sequence_errors_are_clear_and_per_request(daemon: Daemon) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        inputs = [httpclient.InferInput("INPUT", [1, 1], "INT32")]
        inputs[0].set_data_from_numpy(_data(1))
        for kwargs, text in (
            ({}, "must specify a non-zero or non-empty correlation ID"),
            ({"sequence_id": 4242}, "must specify the START flag on the first request"),
        ):
            with pytest.raises(InferenceServerException) as info:
                client.infer("acc", inputs, **kwargs)
            assert info.value.status() == "400" and text in info.value.message()
        meta = client.get_model_metadata("acc")
        assert [i["name"] for i in meta["inputs"]] == ["INPUT"]  # controls and state hidden
        assert [o["name"] for o in meta["outputs"]] == ["OUTPUT"]


def test_200_sequences_over_streams_and_http_equal_the_accumulator(faulty: Daemon) -> None:
    """200 sequences of 50 steps: half on four gRPC streams, half over HTTP from threads."""
    daemon = faulty
    rng = np.random.default_rng(5)
    plans = {sid: rng.integers(-20, 20, size=50).tolist() for sid in range(1, 201)}
    want = {
        sid: (np.cumsum(v) + np.r_[np.zeros(49, int), sid]).tolist() for sid, v in plans.items()
    }
    got: dict[int, list[int]] = {sid: [] for sid in plans}
    errors: list[Any] = []

    def http_worker(sids: list[int]) -> None:
        with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
            for k in range(50):  # the sequences of this worker interleaved, step by step
                for sid in sids:
                    inputs = [httpclient.InferInput("INPUT", [1, 1], "INT32")]
                    inputs[0].set_data_from_numpy(_data(plans[sid][k]))
                    try:
                        r = client.infer(
                            "acc",
                            inputs,
                            sequence_id=sid,
                            sequence_start=k == 0,
                            sequence_end=k == 49,
                        )
                    except InferenceServerException as exc:
                        errors.append(exc)
                        return
                    got[sid].append(int(r.as_numpy("OUTPUT")[0][0]))

    def stream_worker(sids: list[int]) -> None:
        answers: queue.Queue[Any] = queue.Queue()
        with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
            client.start_stream(callback=lambda result, error: answers.put(error or result))
            for k in range(50):
                for sid in sids:
                    inputs = [grpcclient.InferInput("INPUT", [1, 1], "INT32")]
                    inputs[0].set_data_from_numpy(_data(plans[sid][k]))
                    client.async_stream_infer(
                        "acc",
                        inputs,
                        request_id=f"{sid}_{k}",
                        sequence_id=sid,
                        sequence_start=k == 0,
                        sequence_end=k == 49,
                    )
            for _ in range(50 * len(sids)):
                item = answers.get(timeout=60)
                if isinstance(item, InferenceServerException):
                    errors.append(item)
                    continue
                sid, k = map(int, item.get_response().id.split("_"))
                got[sid].append((k, int(item.as_numpy("OUTPUT")[0][0])))  # type: ignore[arg-type]
            client.stop_stream()

    sids = list(plans)
    threads = [threading.Thread(target=http_worker, args=(sids[i:100:4],)) for i in range(4)]
    threads += [
        threading.Thread(target=stream_worker, args=(sids[100 + i :: 4],)) for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert not errors, [e.message() for e in errors[:3]]
    for sid in sids:
        answers = got[sid]
        if sid > 100:  # stream answers carry their step: in step order for the check
            answers = [v for _, v in sorted(answers)]  # type: ignore[misc]
        assert answers == want[sid], sid
    _, text = daemon.get("/metrics")
    assert metric(text, 'model_runtime_sequences_live{model="acc",version="1"}') == 0
    assert metric(text, 'model_runtime_sequence_steps_total{model="acc",version="1"}') == 200 * 50
    assert metric(text, 'model_runtime_sequence_failed_steps_total{model="acc",version="1"}') == 0
    restored = metric(text, 'model_runtime_sequence_restored_total{model="acc",version="1"}')
    assert restored and restored >= 1, "no sequence's state was counted as outliving a fault"
    resets = metric(text, 'model_runtime_replica_resets{model="acc",replica="0"}')
    restarts = metric(text, 'model_runtime_replica_restarts{model="acc",replica="1"}')
    assert resets and resets >= 1, "the recoverable faults did not happen"
    assert restarts and restarts >= 1, "instance 1's device never crashed"
