"""Triton's ``L0_infer_zero`` against the daemon: identity models over every input, with and
without a batch axis (``max_batch_size: 0`` and all dims -1), fed zero-sized tensors (``[0]``,
``[3, 0]``) and small ones, over HTTP (binary and JSON tensors), gRPC and gRPC streaming.

Triton's ensembles of that directory (``simple_zero``, ``sequence_zero``, ``fan_zero``) run
models that are not ONNX nor python: not ported (ensembles: tests/integration/test_ensembles.py)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.test_daemon_support import (
    Daemon,
    all_loaded,
    start_daemon,
    stop_daemon,
    wait_for,
)
from tests.triton_qa_models import write_identity, zero_model_name

pytestmark = pytest.mark.timeout(300)

#: (dtype, dims, io_cnt): the identity models of Triton's generator.
MODELS: list[tuple[Any, list[int], int]] = [
    (bool, [-1], 1),
    (np.float32, [-1], 1),
    (np.float32, [-1], 3),
    (np.float16, [-1, -1], 1),
    (np.float16, [-1, -1], 3),
    (object, [-1], 1),
    (object, [-1, -1], 3),
]

#: test name -> (dtype, one shape per input), as Triton's ``infer_zero_test.py``.
CASES: dict[str, tuple[Any, list[list[int]]]] = {
    "ff1_sanity": (np.float32, [[1]]),
    "ff1": (np.float32, [[0]]),
    "ff3_sanity": (np.float32, [[1], [2], [1]]),
    "ff3_0": (np.float32, [[0], [0], [0]]),
    "ff3_1": (np.float32, [[0], [0], [1]]),
    "ff3_2": (np.float32, [[0], [1], [0]]),
    "ff3_3": (np.float32, [[1], [0], [0]]),
    "ff3_4": (np.float32, [[1], [0], [1]]),
    "hh1_sanity": (np.float16, [[2, 2]]),
    "hh1_0": (np.float16, [[1, 0]]),
    "hh1_1": (np.float16, [[0, 1]]),
    "hh1_2": (np.float16, [[0, 0]]),
    "hh3_sanity": (np.float16, [[2, 2], [2, 2], [1, 1]]),
    "hh3_0": (np.float16, [[0, 0], [0, 0], [0, 0]]),
    "hh3_1": (np.float16, [[0, 1], [0, 1], [2, 3]]),
    "hh3_2": (np.float16, [[1, 0], [1, 3], [0, 1]]),
    "hh3_3": (np.float16, [[1, 1], [3, 0], [0, 0]]),
    "hh3_4": (np.float16, [[1, 1], [0, 6], [2, 2]]),
    "oo1_sanity": (object, [[2]]),
    "oo1": (object, [[0]]),
    "oo3_sanity": (object, [[2, 2], [2, 2], [1, 1]]),
    "oo3_0": (object, [[0, 0], [0, 0], [0, 0]]),
    "oo3_1": (object, [[0, 1], [0, 1], [2, 3]]),
    "oo3_2": (object, [[1, 0], [1, 3], [0, 1]]),
    "oo3_3": (object, [[1, 1], [3, 0], [0, 0]]),
    "oo3_4": (object, [[1, 1], [0, 6], [2, 2]]),
    "bb1_sanity": (bool, [[10]]),
    "bb1_0": (bool, [[0]]),
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("infer_zero")
    repo = tmp / "models"
    for dtype, dims, io_cnt in MODELS:
        write_identity(repo, "onnx", io_cnt, dtype, dims, 8)
        write_identity(repo, "onnx_nobatch", io_cnt, dtype, dims, 0)
    d = start_daemon(tmp, "--model-repository", str(repo), wait_ready=False)
    try:  # fourteen models: more than the harness's minute on a busy machine
        wait_for(lambda: all_loaded(d), 240, "the models to load")
    except BaseException:
        stop_daemon(d)
        raise
    yield d
    stop_daemon(d)


def _input(rng: np.random.Generator, dtype: Any, shape: list[int]) -> np.ndarray:
    if np.dtype(dtype) == np.dtype(bool):
        return rng.choice([False, True], size=shape)
    if np.dtype(dtype) == np.dtype(object):
        ints = rng.integers(-(2**31), 2**31 - 1, size=shape)
        return np.array([str(x).encode() for x in ints.ravel()], dtype=object).reshape(shape)
    return rng.integers(-128, 127, size=shape).astype(dtype)


def _triton_type(dtype: Any) -> str:
    return {"bool": "BOOL", "float16": "FP16", "float32": "FP32", "object": "BYTES"}[
        np.dtype(dtype).name
    ]


def _infer_all_ways(daemon: Daemon, model: str, arrays: list[np.ndarray]) -> None:
    """One identity call per way a Triton client makes it; each answers the inputs back."""
    dtype = arrays[0].dtype
    kind = _triton_type(dtype)
    http = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    try:
        for binary in (True, False) if dtype != np.float16 else (True,):
            inputs = []
            for i, a in enumerate(arrays):
                inputs.append(httpclient.InferInput(f"INPUT{i}", list(a.shape), kind))
                inputs[-1].set_data_from_numpy(a, binary_data=binary)
            outputs = [
                httpclient.InferRequestedOutput(f"OUTPUT{i}", binary_data=binary)
                for i in range(len(arrays))
            ]
            result = http.infer(model, inputs, outputs=outputs, request_id="1")
            assert result.get_response()["model_name"] == model
            _check(result, arrays)
        g_inputs = []
        for i, a in enumerate(arrays):
            g_inputs.append(grpcclient.InferInput(f"INPUT{i}", list(a.shape), kind))
            g_inputs[-1].set_data_from_numpy(a)
        g_outputs = [grpcclient.InferRequestedOutput(f"OUTPUT{i}") for i in range(len(arrays))]
        result = grpc.infer(model, g_inputs, outputs=g_outputs, request_id="2")
        assert result.get_response().model_name == model
        _check(result, arrays)
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        grpc.start_stream(lambda result, error: answers.put((result, error)))
        try:
            grpc.async_stream_infer(model, g_inputs, outputs=g_outputs, request_id="3")
            streamed, error = answers.get(timeout=30)
        finally:
            grpc.stop_stream()
        assert error is None, error
        _check(streamed, arrays)
    finally:
        http.close()
        grpc.close()


def _check(result: Any, arrays: list[np.ndarray]) -> None:
    for i, a in enumerate(arrays):
        out = result.as_numpy(f"OUTPUT{i}")
        assert out is not None and out.shape == a.shape, (i, None if out is None else out.shape)
        if a.dtype == np.dtype(object):
            got = [x.encode() if isinstance(x, str) else bytes(x) for x in out.ravel()]
            assert got == list(a.ravel())
        else:  # tritonclient reads an empty binary output as float64, from Triton too
            assert out.dtype == a.dtype or out.size == 0
            np.testing.assert_array_equal(out, a)


@pytest.mark.parametrize("case", list(CASES))
def test_infer_zero(daemon: Daemon, case: str) -> None:
    dtype, shapes = CASES[case]
    rng = np.random.default_rng(len(case))
    for bs in (1, 8):
        arrays = [_input(rng, dtype, [bs, *s]) for s in shapes]
        _infer_all_ways(daemon, zero_model_name("onnx", len(shapes), dtype), arrays)
    arrays = [_input(rng, dtype, s) for s in shapes]
    _infer_all_ways(daemon, zero_model_name("onnx_nobatch", len(shapes), dtype), arrays)
