"""Models without a batch axis (Triton's ``max_batch_size: 0``): compiled with batch size 0,
each request one run at the model's own shape, never combined; served from a Triton config
with full shapes and ``max_batch_size: 0``; another shape is a 400 that names the input."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from model_runtime import ModelRunner, ModelRunnerConfig
from model_runtime.compiler import CompileOptions, compile_model
from model_runtime.errors import InputValidationError
from model_runtime.executable.container import Executable
from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon
from tests.models import make_mlp, make_no_batch, save

pytestmark = pytest.mark.timeout(120)

SHAPE = (3, 4, 4)
CONFIG = """
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 4, 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3, 4, 4 ] } ]
"""


def _expected(x: np.ndarray) -> np.ndarray:
    return x - x.mean()


def test_compile_without_batch_axis(tmp_path: Path) -> None:
    path = compile_model(make_no_batch(SHAPE), tmp_path / "n.mrx", CompileOptions(batch_size=0))
    m = Executable.load(path).metadata
    assert [(a.shape, a.batch_dim) for a in (*m.user_inputs, *m.user_outputs)] == [
        (SHAPE, None),
        (SHAPE, None),
    ]
    # Without a batch axis, a dynamic first dimension is one more dynamic dimension (Triton's
    # max_batch_size: 0 with dims [ -1, 4 ]): each request runs alone at its own shape.
    dyn = compile_model(make_mlp(sizes=(4, 2)), tmp_path / "d.mrx", CompileOptions(batch_size=0))
    d = Executable.load(dyn).metadata.user_inputs[0]
    assert (d.shape, d.batch_dim) == ((-1, 4), None)


def test_each_request_runs_alone(tmp_path: Path) -> None:
    path = compile_model(make_no_batch(SHAPE), tmp_path / "n.mrx", CompileOptions(batch_size=0))

    async def main() -> None:
        config = ModelRunnerConfig(batching_dim=0, timeout=0.05)
        async with ModelRunner(path, config) as runner:
            xs = [
                np.random.default_rng(i).standard_normal(SHAPE).astype(np.float32) for i in range(8)
            ]
            outs = await asyncio.gather(*(runner.execute({"x": x}) for x in xs))
            for x, out in zip(xs, outs, strict=True):  # combining two would change the mean
                np.testing.assert_allclose(out["y"], _expected(x), atol=1e-5)
            with pytest.raises(InputValidationError, match=r"\[3, 4, 4\]"):
                await runner.execute({"x": np.zeros((1, *SHAPE), np.float32)})

    asyncio.run(main())


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("nobatch")
    repo = tmp / "models"
    (repo / "densenet" / "1").mkdir(parents=True)
    (repo / "densenet" / "config.pbtxt").write_text(CONFIG)
    save(make_no_batch(SHAPE), repo / "densenet" / "1" / "model.onnx")
    d = start_daemon(tmp, "--model-repository", str(repo))
    yield d
    stop_daemon(d)


def test_daemon_serves_it_as_it_is(daemon: Daemon) -> None:
    meta = requests.get(daemon.url("/v2/models/densenet"), timeout=10).json()
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": list(SHAPE)}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": list(SHAPE)}]
    config = requests.get(daemon.url("/v2/models/densenet/config"), timeout=10).json()
    assert config["max_batch_size"] == 0
    assert config["input"][0]["dims"] == list(SHAPE)

    x = np.arange(48, dtype=np.float32).reshape(SHAPE)
    body = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": list(SHAPE), "data": x.ravel().tolist()}
        ]
    }
    r = requests.post(daemon.url("/v2/models/densenet/infer"), json=body, timeout=10)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(
        np.array(r.json()["outputs"][0]["data"]).reshape(SHAPE), _expected(x)
    )

    bad = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 48], "data": x.ravel().tolist()}]
    }
    r = requests.post(daemon.url("/v2/models/densenet/infer"), json=bad, timeout=10)
    assert r.status_code == 400
    assert "'x'" in r.json()["error"] and "[3, 4, 4]" in r.json()["error"]

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    try:
        assert client.get_model_config("densenet").config.max_batch_size == 0
        inp = grpcclient.InferInput("x", list(SHAPE), "FP32")
        inp.set_data_from_numpy(x + 1)
        out = client.infer("densenet", [inp]).as_numpy("y")
        np.testing.assert_allclose(out, _expected(x + 1), atol=1e-5)
    finally:
        client.close()
