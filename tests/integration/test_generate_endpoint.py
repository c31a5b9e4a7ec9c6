"""Triton's generate extension against the daemon: the calls of Triton's own
``qa/L0_http/generate_endpoint_test.py`` (written here) on our ``mock_llm`` python model
(decoupled: it streams its prompt back), and the same endpoint on an ONNX model."""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon
from tests.models import make_add_sub, save

pytestmark = pytest.mark.timeout(180)

REPOSITORY = Path(__file__).resolve().parents[1] / "repositories" / "python"
MODEL = "mock_llm"
TEXT = "hello world"
SSE = "text/event-stream; charset=utf-8"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    repo = tmp_path_factory.mktemp("generate") / "models"
    repo.mkdir()
    shutil.copytree(REPOSITORY / MODEL, repo / MODEL)
    (repo / "add_sub_onnx" / "1").mkdir(parents=True)
    save(make_add_sub(), repo / "add_sub_onnx" / "1" / "model.onnx")
    (repo / "add_sub_onnx" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    d = start_daemon(tmp_path_factory.mktemp("generate-daemon"), "--model-repository", str(repo))
    try:
        yield d
    finally:
        stop_daemon(d)


def _post(daemon: Daemon, route: str, inputs: Any, *, stream: bool = False) -> requests.Response:
    data = inputs if isinstance(inputs, str) else json.dumps(inputs)
    headers = {"Accept": "text/event-stream"} if route == "generate_stream" else {}
    url = daemon.url(f"/v2/models/{MODEL}/{route}")
    return requests.post(url, data=data, headers=headers, stream=stream, timeout=60)


def _events(response: requests.Response) -> list[dict[str, Any]]:
    """The SSE events of a whole response body, each checked to be ``data: ...\\n\\n``."""
    assert response.headers["Content-Type"] == SSE
    body = response.content.decode()
    assert body == "" or body.endswith("\n\n"), body
    events = []
    for chunk in body.split("\n\n")[:-1]:
        assert chunk.startswith("data: "), chunk
        events.append(json.loads(chunk.removeprefix("data: ")))
    return events


def _expect_failure(daemon: Daemon, route: str, inputs: Any, message: str) -> None:
    r = _post(daemon, route, inputs)
    assert r.headers["Content-Type"] == "application/json"  # errors are always JSON
    assert r.status_code >= 400, r.text
    assert message in r.json()["error"]


def test_generate(daemon: Daemon) -> None:
    r = _post(daemon, "generate", {"PROMPT": TEXT, "STREAM": False})
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/json"
    data = r.json()
    assert data["TEXT"] == TEXT
    assert data["model_name"] == MODEL and data["model_version"] == "1"


def test_generate_with_all_inputs(daemon: Daemon) -> None:
    r = _post(daemon, "generate", {"PROMPT": TEXT, "STREAM": False, "input_ids": [100, 200]})
    assert r.status_code == 200, r.text
    assert r.json()["TEXT"] == TEXT


def test_request_id(daemon: Daemon) -> None:
    data = _post(daemon, "generate", {"PROMPT": TEXT, "id": "42", "STREAM": False}).json()
    assert data["id"] == "42" and data["TEXT"] == TEXT
    assert "id" not in _post(daemon, "generate", {"PROMPT": TEXT, "STREAM": False}).json()
    data = _post(daemon, "generate", {"PROMPT": TEXT, "id": "", "STREAM": False}).json()
    assert "id" not in data and data["TEXT"] == TEXT


def test_generate_stream(daemon: Daemon) -> None:
    r = _post(daemon, "generate_stream", {"PROMPT": [TEXT], "STREAM": True, "REPETITION": 3})
    assert r.status_code == 200
    assert [e["TEXT"] for e in _events(r)] == [TEXT] * 3


def test_streaming(daemon: Daemon) -> None:
    """Each response reaches the client as the model sends it (DELAY s apart), not at the end."""
    inputs = {"PROMPT": [TEXT], "STREAM": True, "REPETITION": 3, "DELAY": 1}
    past = time.monotonic()
    gaps = []
    with _post(daemon, "generate_stream", inputs, stream=True) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                now = time.monotonic()
                gaps.append(now - past)
                past = now
    assert len(gaps) == 3
    assert all(0.5 < gap < 3 for gap in gaps), gaps


def test_missing_inputs(daemon: Daemon) -> None:
    for inputs in ({}, {"abc": 123}):
        for route in ("generate", "generate_stream"):
            _expect_failure(
                daemon, route, inputs, "expected number of inputs between 2 and 3 but got 0"
            )
    for inputs in ({"PROMPT": "hello"}, {"STREAM": False}, {"STREAM": False, "other": "param"}):
        for route in ("generate", "generate_stream"):
            _expect_failure(
                daemon, route, inputs, "expected number of inputs between 2 and 3 but got 1"
            )


def test_invalid_input_types(daemon: Daemon) -> None:
    invalid_bool = "attempt to access JSON non-boolean as boolean"
    invalid_string = "attempt to access JSON non-string as string"
    cases = [
        ({"PROMPT": 123, "STREAM": False}, invalid_string),
        ({"PROMPT": "hello", "STREAM": "false"}, invalid_bool),
        ({"PROMPT": True, "STREAM": 123}, invalid_string),  # parsed in order
        ({"STREAM": 123, "PROMPT": True}, invalid_bool),
    ]
    for inputs, message in cases:
        for route in ("generate", "generate_stream"):
            _expect_failure(daemon, route, inputs, message)


def test_json_dtype_size_expansion_exceeds_limit_error(daemon: Daemon) -> None:
    text = base64.b64encode(bytes([1] * (64 * 1024 * 1024))).decode()
    message = " bytes exceeds the maximum allowed input size of "
    _expect_failure(daemon, "generate", {"PROMPT": text, "STREAM": False}, message)
    half = len(text) // 2
    inputs = {"INPUT0": text[:half], "INPUT1": text[half:], "STREAM": False}
    _expect_failure(daemon, "generate", inputs, message)


def test_duplicate_inputs(daemon: Daemon) -> None:
    dupe_prompt = "input 'PROMPT' already exists in request"
    dupe_stream = "input 'STREAM' already exists in request"
    cases = [
        ('{"PROMPT": "hello", "STREAM": false, "PROMPT": "duplicate"}', dupe_prompt),
        ('{"PROMPT": "hello", "STREAM": false, "STREAM": false}', dupe_stream),
        (
            '{"PROMPT": "hello", "STREAM": false, "PROMPT": "duplicate", "STREAM": true}',
            dupe_prompt,
        ),
        (
            '{"PROMPT": "hello", "STREAM": false, "STREAM": true, "PROMPT": "duplicate"}',
            dupe_stream,
        ),
    ]
    for inputs, message in cases:
        for route in ("generate", "generate_stream"):
            _expect_failure(daemon, route, inputs, message)


def test_generate_stream_response_error(daemon: Daemon) -> None:
    inputs = {"PROMPT": [TEXT], "STREAM": True, "REPETITION": 0, "FAIL_LAST": True}
    r = _post(daemon, "generate_stream", inputs)
    # The first response is the error: the status says so, the body is still SSE.
    assert r.status_code >= 400
    assert _events(r) == [{"error": "An Error Occurred"}]
    inputs["REPETITION"] = 1
    r = _post(daemon, "generate_stream", inputs)
    assert r.status_code == 200  # the first response succeeded: each must be checked
    events = _events(r)
    assert [e.get("TEXT") for e in events[:1]] == [TEXT]
    assert events[1:] == [{"error": "An Error Occurred"}]


def test_race_condition(daemon: Daemon) -> None:
    one = {"PROMPT": "hello", "STREAM": False, "param": "segfault"}
    many = {"PROMPT": "hello", "STREAM": True, "REPETITION": 3, "param": "segfault"}
    statuses: list[int] = []

    def call(inputs: dict[str, Any]) -> None:
        statuses.append(_post(daemon, "generate_stream", inputs).status_code)

    threads = [threading.Thread(target=call, args=(x,)) for _ in range(50) for x in (one, many)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert statuses == [200] * 100


def test_one_response(daemon: Daemon) -> None:
    for stream in (True, False):
        inputs = {"PROMPT": TEXT, "STREAM": stream}
        assert _post(daemon, "generate_stream", inputs).status_code == 200
        r = _post(daemon, "generate", inputs)
        assert r.status_code == 200, r.text
        assert r.json()["TEXT"] == TEXT


@pytest.mark.parametrize("repetition", [0, 2])
def test_other_than_one_response(daemon: Daemon, repetition: int) -> None:
    inputs = {"PROMPT": TEXT, "STREAM": True, "REPETITION": repetition}
    r = _post(daemon, "generate_stream", inputs)
    assert r.status_code == 200 and len(_events(r)) == repetition
    r = _post(daemon, "generate", inputs)
    assert r.status_code == 400
    assert "generate expects model to produce exactly 1 response" in r.json()["error"]


def test_complex_schema(daemon: Daemon) -> None:
    params = {"PARAM_0": 0, "PARAM_1": True, "PARAM_2": 123.123}
    inputs: dict[str, Any] = {"PROMPT": TEXT, "STREAM": True, "PARAMS": params}
    _expect_failure(daemon, "generate", inputs, "parameter 'PARAMS' has invalid type")
    inputs = {"PROMPT": {"USER": "hello world", "BOT": "world hello"}, "STREAM": True}
    _expect_failure(daemon, "generate", inputs, "attempt to access JSON non-string as string")


def test_close_connection_during_streaming(daemon: Daemon) -> None:
    inputs = {"PROMPT": [TEXT], "STREAM": True, "REPETITION": 3, "DELAY": 1}
    r = _post(daemon, "generate_stream", inputs, stream=True)
    r.close()
    assert requests.get(daemon.url("/v2/health/live"), timeout=10).status_code == 200
    # The model is free again once its cancelled request ends: it answers the next one.
    r = _post(daemon, "generate", {"PROMPT": TEXT, "STREAM": False})
    assert r.status_code == 200 and r.json()["TEXT"] == TEXT


def test_parameters(daemon: Daemon) -> None:
    inputs: dict[str, Any] = {"PROMPT": [TEXT], "STREAM": True, "parameters": {"REPETITION": 3}}
    r = _post(daemon, "generate_stream", inputs)
    assert [e["TEXT"] for e in _events(r)] == [TEXT] * 3
    inputs = {"PROMPT": [TEXT], "STREAM": True, "parameters": 1}
    _expect_failure(daemon, "generate", inputs, "Expected JSON object for keyword: 'parameters'")
    inputs = {"PROMPT": [TEXT], "STREAM": True, "parameters": {"nested": {"twice": 1}}}
    _expect_failure(
        daemon,
        "generate",
        inputs,
        "Converting keyword: 'parameters': parameter 'nested' has invalid type.",
    )


def test_0_dimension_output(daemon: Daemon) -> None:
    inputs = {"PROMPT": TEXT, "STREAM": False, "REPETITION": 0, "OUTPUT_0_DIM": True}
    r = _post(daemon, "generate", inputs)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/json"
    assert r.json()["TEXT"] == []


def test_generate_on_an_onnx_model(daemon: Daemon) -> None:
    """A model that answers once answers generate and generate_stream alike; a version in the
    path is honoured."""
    inputs = {"INPUT0": [1.0, 2.0, 3.0, 4.0], "INPUT1": [0.5, 1.0, 1.5, -2.0], "id": "7"}
    url = daemon.url("/v2/models/add_sub_onnx/versions/1/generate")
    data = requests.post(url, json=inputs, timeout=30).json()
    assert data["OUTPUT0"] == [1.5, 3.0, 4.5, 2.0] and data["OUTPUT1"] == [0.5, 1.0, 1.5, 6.0]
    assert data["id"] == "7" and data["model_name"] == "add_sub_onnx"
    r = requests.post(
        daemon.url("/v2/models/add_sub_onnx/generate_stream"), json=inputs, timeout=30
    )
    assert [e["OUTPUT0"] for e in _events(r)] == [[1.5, 3.0, 4.5, 2.0]]
    r = requests.post(url, json={"INPUT0": [1.0, 2.0, 3.0], "INPUT1": [1.0] * 4}, timeout=30)
    assert r.status_code == 400
    assert (
        "The schema can not convert input 'INPUT0' to tensor with proper shape" in r.json()["error"]
    )
