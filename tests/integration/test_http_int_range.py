"""Over HTTP, a JSON integer outside its tensor's datatype is a 400 naming the tensor: it is
never wrapped into range (``-1`` as UINT8 is not 255) and never reaches the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
from aiohttp.test_utils import TestClient, TestServer
from onnx import TensorProto, helper

from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.http.routes import HttpFrontEnd
from model_runtime.server.inference.plane import DataPlane, ServerOptions
from model_runtime.server.repository.repository import ModelRepository
from tests.integration.runner_support import compile_to
from tests.models import OPSET

pytestmark = pytest.mark.timeout(60)


def make_uint8_to_float() -> onnx.ModelProto:
    """``y = float(ids)``: ``ids`` uint8 [N, 2] -> ``y`` float32 [N, 2]."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["ids"], ["y"], to=TensorProto.FLOAT)],
        "uint8_to_float",
        [helper.make_tensor_value_info("ids", TensorProto.UINT8, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _infer(data: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": "ids", "datatype": "UINT8", "shape": [1, 2], "data": data}]}


async def test_out_of_range_integers_are_a_400_naming_the_tensor(tmp_path: Path) -> None:
    compile_to(make_uint8_to_float(), tmp_path, name="bytes", batch_size=2)
    repo = ModelRepository(ModelRunnerConfig(batching_dim=0), directory=tmp_path)
    repo.scan()
    async with repo:
        await repo.load("bytes")
        app = HttpFrontEnd(DataPlane(repo, ServerOptions())).app()
        async with TestClient(TestServer(app)) as client:
            for value in (-1, 256):
                resp = await client.post("/v2/models/bytes/infer", json=_infer([7, value]))
                assert resp.status == 400
                assert (await resp.json())["error"] == (
                    f"input 'ids': value {value} is out of the UINT8 range [0, 255]"
                )
            resp = await client.post("/v2/models/bytes/infer", json=_infer([0, 255]))
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["outputs"][0]["data"] == [0.0, 255.0]
            stats = await (await client.get("/v2/models/bytes/stats")).json()
    # Only the good request reached the model.
    assert stats["model_stats"][0]["inference_count"] == 1
