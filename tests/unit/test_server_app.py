"""The HTTP front end in process, over a fake runner: routes, status codes, error bodies,
metrics, drain and disconnect cancellation. (The real daemon is tested in
``tests/integration/test_daemon.py``.)"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import structlog
from aiohttp.test_utils import TestClient, TestServer

from actors.session.state import ReplicaStatus
from model_runtime.errors import (
    ApplicationRuntimeError,
    InputValidationError,
    QueueFullError,
    RunnerStoppedError,
    UnknownModelError,
)
from model_runtime.io import DataDesc
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.grpc.server import start_grpc_server
from model_runtime.server.http.routes import HttpFrontEnd
from model_runtime.server.inference.plane import DataPlane, ServerOptions
from model_runtime.server.observability.metrics import DaemonMetrics
from model_runtime.server.repository.repository import ModelRepository
from model_runtime.server.serving import RunnerLike, ServingRunner
from model_runtime.server.tensors.binary import HEADER_LENGTH
from model_runtime.server.triton import grpc_service_pb2 as pb, grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(20)
W = np.arange(12, dtype=np.float32).reshape(4, 3)


class FakeRunner:
    """A runner computing ``pixels @ W``; ``gate`` holds requests; ``error`` fails them."""

    def __init__(self) -> None:
        self.status = [ReplicaStatus.READY]
        self.gate: asyncio.Event | None = None
        self.error: BaseException | None = None
        self.cancelled = 0
        self.closed = False
        self.entered = asyncio.Event()
        self.cancel_seen = asyncio.Event()
        self.calls: list[dict[str, Any]] = []
        self.actor_wake = asyncio.Event()
        self.actor: asyncio.Future[None] | None = None

    async def start(self) -> None:
        # Like a real runner's actors: a task that outlives start() and logs now and then.
        self.actor = asyncio.ensure_future(self._actor())

    async def _actor(self) -> None:
        while True:
            await self.actor_wake.wait()
            self.actor_wake.clear()
            structlog.get_logger("fake.actor").info("actor_event")

    async def close(self) -> None:
        self.closed = True
        self.status = [ReplicaStatus.STOPPED]
        if self.actor is not None:
            self.actor.cancel()

    async def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
    ) -> dict[str, np.ndarray]:
        self.calls.append({"timeout": timeout, "priority": priority})
        x = inputs["pixels"]
        if x.ndim != 2 or x.shape[1] != 4:
            raise InputValidationError(f"input 'pixels' has shape {list(x.shape)}")
        self.entered.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            self.cancel_seen.set()
            raise
        if self.error is not None:
            raise self.error
        return {"logits": x @ W, "label": (x @ W).argmax(1).astype(np.int64)}

    def get_execute_inputs(self) -> list[DataDesc]:
        return [DataDesc("pixels", 64, (4, 4), np.dtype(np.float32))]

    def get_execute_outputs(self) -> list[DataDesc]:
        return [
            DataDesc("logits", 48, (4, 3), np.dtype(np.float32)),
            DataDesc("label", 32, (4,), np.dtype(np.int64)),
        ]

    def replica_status(self) -> list[ReplicaStatus]:
        return list(self.status)

    @property
    def is_ready(self) -> bool:
        return ReplicaStatus.READY in self.status

    async def get_monitoring_statistics_total_count(self, replica_id: int = 0) -> dict[str, float]:
        return {
            "read_queue_monitoring_statistics_count": 2.0,
            "computation_monitoring_statistics_count": 2.0,
        }

    async def get_monitoring_statistics_mean(self, replica_id: int = 0) -> dict[str, float]:
        return {
            "read_queue_monitoring_statistics_mean_us": 10.0,
            "computation_monitoring_statistics_mean_us": 5.0,
        }


@asynccontextmanager
async def serving(
    tmp_path: Path, **options: Any
) -> AsyncIterator[tuple[TestClient[Any, Any], FakeRunner, DataPlane]]:
    (tmp_path / "fake.mrx").write_bytes(b"")
    (tmp_path / "other.mrx").write_bytes(b"")
    fake = FakeRunner()

    def factory(path: Path, config: ModelRunnerConfig) -> RunnerLike:
        return fake if path.stem == "fake" else FakeRunner()

    repo = ModelRepository(
        ModelRunnerConfig(batching_dim=0), directory=tmp_path, runner_factory=factory
    )
    repo.scan()
    async with repo:
        await repo.load("fake")
        plane = DataPlane(repo, ServerOptions(**options))
        app = HttpFrontEnd(plane).app()
        async with TestClient(TestServer(app, handler_cancellation=True)) as client:
            yield client, fake, plane


def _infer_doc(rows: int = 2, **extra: Any) -> dict[str, Any]:
    data = np.arange(rows * 4, dtype=np.float32).tolist()
    return {
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [rows, 4], "data": data}],
        **extra,
    }


async def test_health_metadata_and_json_inference(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, _, _):
        assert (await client.get("/v2/health/live")).status == 200
        assert (await (await client.get("/v2/health/ready")).json()) == {"ready": True}
        meta = await (await client.get("/v2")).json()
        assert "binary_tensor_data" in meta["extensions"]
        model = await (await client.get("/v2/models/fake")).json()
        assert model["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 4]}]
        assert [o["datatype"] for o in model["outputs"]] == ["FP32", "INT64"]
        assert (await client.get("/v2/models/fake/versions/1/ready")).status == 200
        resp = await client.post("/v2/models/fake/infer", json=_infer_doc(id="q1"))
        assert resp.status == 200, await resp.text()
        doc = await resp.json()
        assert doc["id"] == "q1" and doc["model_name"] == "fake"
        expected = np.arange(8, dtype=np.float32).reshape(2, 4) @ W
        assert doc["outputs"][0]["data"] == expected.ravel().tolist()
        assert doc["outputs"][1] == {
            "name": "label",
            "datatype": "INT64",
            "shape": [2],
            "data": [2, 2],
        }


async def test_binary_request_and_response(tmp_path: Path) -> None:
    x = np.ones((3, 4), dtype=np.float32)
    head = json.dumps(
        {
            "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [3, 4],
                        "parameters": {"binary_data_size": x.nbytes}}],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    async with serving(tmp_path) as (client, _, _):
        resp = await client.post(
            "/v2/models/fake/infer",
            data=head + x.tobytes(),
            headers={HEADER_LENGTH: str(len(head))},
        )
        assert resp.status == 200, await resp.text()
        n = int(resp.headers[HEADER_LENGTH])
        body = await resp.read()
        out = json.loads(body[:n])["outputs"]
        assert [o["name"] for o in out] == ["logits"]
        np.testing.assert_array_equal(np.frombuffer(body[n:], "<f4").reshape(3, 3), x @ W)


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v2/models/nope/infer", _infer_doc(), 400,
         "Request for unknown model: 'nope' is not found"),
        ("/v2/models/fake/versions/7/infer", _infer_doc(), 404,
         "Request for unknown model: 'fake' version 7 is not found"),
        ("/v2/models/fake/infer", b"{oops", 400, "not valid JSON"),
        ("/v2/models/fake/infer", {"inputs": [{"name": "pixels", "datatype": "FP32",
                                               "shape": [1, 3], "data": [1, 2, 3]}]},
         400, "has shape [1, 3]"),
        ("/v2/repository/models/..%2Fetc/load", b"", 400, "invalid model name"),
        ("/v2/repository/models/missing/load", b"", 400,
         "failed to load 'missing', failed to poll from model repository"),
    ],
)  # fmt: skip
async def test_errors_are_json_with_status(
    tmp_path: Path, path: str, body: Any, status: int, message: str
) -> None:
    async with serving(tmp_path) as (client, _, _):
        kwargs = {"data": body} if isinstance(body, bytes) else {"json": body}
        resp = await client.post(path, **kwargs)
        assert resp.status == status
        assert message in (await resp.json())["error"]


async def test_runtime_errors_map_to_status_codes(tmp_path: Path) -> None:
    async with serving(tmp_path, request_timeout=0.2) as (client, fake, _):
        fake.error = ApplicationRuntimeError("device exploded")
        resp = await client.post("/v2/models/fake/infer", json=_infer_doc())
        assert resp.status == 500 and "device exploded" in (await resp.json())["error"]
        fake.error = RunnerStoppedError("no replica is in service")
        assert (await client.post("/v2/models/fake/infer", json=_infer_doc())).status == 503
        fake.error, fake.gate = None, asyncio.Event()
        resp = await client.post("/v2/models/fake/infer", json=_infer_doc())
        # Triton's answer to a request past its timeout: UNAVAILABLE, in its words
        assert resp.status == 503 and "Request timeout expired" in (await resp.json())["error"]
        assert fake.cancelled == 1
        metrics = await (await client.get("/metrics")).text()
        line = 'requests_total{model="fake",outcome="failure",reason="request_timeout"} 1.0'
        assert line in metrics
        assert 'reason="runtime_error"} 1.0' in metrics


async def test_a_body_over_the_limit_is_tritons_400_and_closes_the_connection(
    tmp_path: Path,
) -> None:
    limit = 1000
    async with serving(tmp_path, max_body_size=limit) as (client, _, _):
        body = orjson.dumps(_infer_doc(rows=100))
        resp = await client.post(
            "/v2/models/fake/infer", data=body, headers={"Content-Type": "application/json"}
        )
        assert resp.status == 400
        assert (await resp.json())["error"] == (
            f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size of "
            f"{limit} bytes. Use --http-max-input-size to increase the limit."
        )
        assert resp.headers.get("Connection", "").lower() == "close"
        resp = await client.post(
            "/v2/models/fake/infer", data=body, headers={HEADER_LENGTH: str(len(body))}
        )
        assert (resp.status, (await resp.json())["error"]) == (
            400,
            f"request size of {len(body)} bytes exceeds the maximum allowed input size of "
            f"{limit}. Use --http-max-input-size to increase the limit.",
        )

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b" " * 500

        resp = await client.post("/v2/models/fake/infer", data=chunks())
        assert resp.status == 400
        assert (
            "exceeds the maximum allowed input size of 1000 bytes" in (await resp.json())["error"]
        )


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_compressed_bodies_are_read_and_bounded_inflated(
    tmp_path: Path, encoding: str
) -> None:
    """tritonclient's request_compression_algorithm: gzip and deflate bodies are read; one that
    inflates past the limit is refused as soon as it does, in Triton's words."""

    def compress(data: bytes) -> bytes:
        if encoding == "gzip":
            return gzip.compress(data)
        return zlib.compress(data)  # HTTP's "deflate" is zlib's format

    headers = {"Content-Encoding": encoding, "Content-Type": "application/json"}
    async with serving(tmp_path, max_body_size=4000) as (client, _, _):
        doc = _infer_doc(rows=2)
        resp = await client.post(
            "/v2/models/fake/infer", data=compress(orjson.dumps(doc)), headers=headers
        )
        assert resp.status == 200, await resp.text()
        bomb = compress(orjson.dumps(doc) + b" " * 200_000)  # ~200 kB inflated, <1 kB sent
        assert len(bomb) < 4000
        resp = await client.post("/v2/models/fake/infer", data=bomb, headers=headers)
        assert (resp.status, (await resp.json())["error"]) == (
            400,
            "Decompressed data size exceeds the maximum allowed value of 4000 bytes. Use "
            "--http-max-input-size to increase the limit.",
        )


async def test_an_encoding_triton_does_not_read_is_refused_in_its_words(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, _, _):
        resp = await client.post(
            "/v2/models/fake/infer",
            data=orjson.dumps(_infer_doc()),
            headers={"Content-Encoding": "br"},
        )
        assert resp.status == 501  # Triton's UNSUPPORTED over HTTP
        assert (await resp.json())["error"] == "Unsupported compression type"
        assert resp.headers["Accept-Encoding"] == "gzip, deflate"


async def test_readiness_follows_replica_state(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, fake, _):
        fake.status = [ReplicaStatus.RESETTING]
        resp = await client.get("/v2/models/fake/ready")
        assert resp.status == 503 and "resetting" in (await resp.json())["error"]
        assert (await client.get("/v2/health/ready")).status == 503
        metrics = await (await client.get("/metrics")).text()
        assert (
            'model_runtime_replica_state{device="",model="fake",replica="0",state="resetting"} 1.0'
            in metrics
        )
        assert 'model_runtime_model_ready{model="fake"} 0.0' in metrics
        fake.status = [ReplicaStatus.FAILED, ReplicaStatus.READY]
        assert (await client.get("/v2/models/fake/ready")).status == 200


async def test_repository_index_load_unload(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, fake, _):
        index = await (await client.post("/v2/repository/index")).json()
        assert {(m["name"], m["state"]) for m in index} == {
            ("fake", "READY"),
            ("other", "UNAVAILABLE"),
        }
        assert (await client.post("/v2/repository/models/other/load")).status == 200
        assert (await client.get("/v2/models/other/ready")).status == 200
        assert (await client.post("/v2/repository/models/fake/unload")).status == 200
        assert fake.closed
        resp = await client.post("/v2/models/fake/infer", json=_infer_doc())
        assert resp.status == 503 and "UNAVAILABLE" in (await resp.json())["error"]


async def test_stats_and_metrics(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, _, _):
        for _ in range(3):
            assert (
                await client.post("/v2/models/fake/infer", json=_infer_doc(rows=2))
            ).status == 200
        stats = (await (await client.get("/v2/models/fake/stats")).json())["model_stats"][0]
        assert stats["inference_count"] == 6
        assert stats["inference_stats"]["success"]["count"] == 3
        assert stats["inference_stats"]["queue"] == {"count": 2, "ns": 20_000}
        text = await (await client.get("/metrics")).text()
        assert 'model_runtime_inferences_total{model="fake"} 6.0' in text
        assert 'model_runtime_pending_requests{model="fake"} 0.0' in text
        assert 'phase="read_queue"' in text


async def test_drain_refuses_new_and_finishes_inflight(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, fake, server):
        fake.gate = asyncio.Event()
        inflight = asyncio.ensure_future(client.post("/v2/models/fake/infer", json=_infer_doc()))
        await asyncio.wait_for(fake.entered.wait(), 5)
        drained = asyncio.ensure_future(server.drain(5.0))
        resp = await client.post("/v2/models/fake/infer", json=_infer_doc())
        assert resp.status == 503 and "draining" in (await resp.json())["error"]
        assert (await client.get("/v2/health/ready")).status == 503
        assert not drained.done()
        fake.gate.set()
        assert (await inflight).status == 200
        assert await drained
        text = await (await client.get("/metrics")).text()
        assert 'outcome="failure",reason="draining"} 1.0' in text
        assert "model_runtime_draining 1.0" in text


async def test_client_disconnect_cancels_the_request(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, fake, server):
        fake.gate = asyncio.Event()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await client.post("/v2/models/fake/infer", json=_infer_doc())
        await asyncio.wait_for(fake.cancel_seen.wait(), 5)
        text = await (await client.get("/metrics")).text()
        assert 'reason="cancelled"} 1.0' in text
        assert server.metrics.pending.labels("fake")._value.get() == 0


# -- protocol honesty: timeout, priority, classification, refusals ------------------------------


async def test_the_timeout_parameter_reaches_the_runner_and_is_enforced(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, fake, _):  # request_timeout: the default 60 s
        resp = await client.post("/v2/models/fake/infer", json=_infer_doc())
        assert resp.status == 200 and fake.calls[-1]["timeout"] == 60.0
        fake.gate = asyncio.Event()
        t0 = asyncio.get_running_loop().time()
        doc = _infer_doc(parameters={"timeout": 200_000})  # microseconds, as Triton sends it
        resp = await client.post("/v2/models/fake/infer", json=doc)
        assert resp.status == 503 and fake.calls[-1]["timeout"] == 0.2
        assert asyncio.get_running_loop().time() - t0 < 5


async def test_priority_levels_reach_execute_highest_first(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, fake, _):
        got = {}
        for level in (0, 1, 2, 7):
            doc = _infer_doc(parameters={"priority": level})
            assert (await client.post("/v2/models/fake/infer", json=doc)).status == 200
            got[level] = fake.calls[-1]["priority"]
        # execute(): higher is packed first, 0 the default. Level 1 first, then 2, then 7,
        # then requests at the default level (no levels configured).
        assert got[1] > got[2] > got[7] > got[0] == 0
    async with serving(tmp_path, priority_levels=4, default_priority_level=2) as (client, fake, _):
        got = {}
        for level in (0, 1, 2, 3):
            doc = _infer_doc(parameters={"priority": level})
            assert (await client.post("/v2/models/fake/infer", json=doc)).status == 200
            got[level] = fake.calls[-1]["priority"]
        assert got[1] > got[2] == got[0] == 0 > got[3]  # the default level is level 2
        # past the levels: the default level, as Triton's InferenceRequest::SetPriority reads it
        doc = _infer_doc(parameters={"priority": 5})
        assert (await client.post("/v2/models/fake/infer", json=doc)).status == 200
        assert fake.calls[-1]["priority"] == 0


UNSUPPORTED = [
    ({"parameters": {"sequence_id": 7, "sequence_start": True}}, "model 'fake' is stateless"),
    ({"parameters": {"sequence_end": True}}, "is stateless"),
    ({"parameters": {"timeout": -5}}, "timeout must be a non-negative integer of microseconds"),
    ({"parameters": {"priority": "high"}}, "priority must be an integer level"),
    ({"outputs": [{"name": "logits", "parameters": {"shared_memory_region": "r"}}]},
     "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
     "for tensor 'logits'"),
    ({"outputs": [{"name": "logits", "parameters": {"top_k": 2}}]}, "['top_k'] are not supported"),
    ({"outputs": [{"name": "logits", "parameters": {"classification": -1}}]},
     "classification must be a non-negative integer"),
    ({"model_config": {"x": 1}}, "unknown request field(s) ['model_config']"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "message"), UNSUPPORTED)
async def test_what_is_not_supported_is_a_400_that_says_so(
    tmp_path: Path, extra: dict[str, Any], message: str
) -> None:
    async with serving(tmp_path) as (client, fake, _):
        resp = await client.post("/v2/models/fake/infer", json=_infer_doc(**extra))
        assert resp.status == 400
        assert message in (await resp.json())["error"]
        assert fake.calls == []  # refused before it reached the runner


async def test_an_unsupported_input_parameter_is_a_400(tmp_path: Path) -> None:
    doc = _infer_doc()
    doc["inputs"][0]["parameters"] = {"shared_memory_byte_size": 32, "my_param": 1}
    async with serving(tmp_path) as (client, _, _):
        resp = await client.post("/v2/models/fake/infer", json=doc)
        assert resp.status == 400
        assert "input 'pixels'" in (error := (await resp.json())["error"])
        assert "parameter(s) ['my_param'] are not supported" in error
        doc["inputs"][0]["parameters"] = {"shared_memory_byte_size": 32}  # Triton's text:
        resp = await client.post("/v2/models/fake/infer", json=doc)
        assert resp.status == 400
        assert (await resp.json())["error"] == (
            "'shared_memory_byte_size' can not be specified without 'shared_memory_region' "
            "parameter for tensor 'pixels'"
        )


async def test_classification_returns_the_top_classes_as_bytes(tmp_path: Path) -> None:
    x = np.array([[1, 0, 0, 0], [0, 0, 3, 0]], np.float32)  # x @ W: rows of W, scaled
    doc = {
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [2, 4],
                    "data": x.ravel().tolist()}],
        "outputs": [{"name": "logits", "parameters": {"classification": 2}}],
    }  # fmt: skip
    async with serving(tmp_path) as (client, _, _):
        resp = await client.post("/v2/models/fake/infer", json=doc)
        assert resp.status == 200, await resp.text()
        out = (await resp.json())["outputs"]
        # W = [[0,1,2],[3,4,5],[6,7,8],[9,10,11]]: row 0 -> [0,1,2], row 1 -> 3*[6,7,8]
        assert out == [{"name": "logits", "datatype": "BYTES", "shape": [2, 2],
                        "data": ["2.000000:2", "1.000000:1", "24.000000:2",
                                 "21.000000:1"]}]  # fmt: skip
        doc["outputs"] = [{"name": "logits", "parameters": {"class_count": 1, "binary_data": True}}]
        resp = await client.post("/v2/models/fake/infer", json=doc)
        n = int(resp.headers[HEADER_LENGTH])
        body = await resp.read()
        head = json.loads(body[:n])["outputs"][0]
        assert head["datatype"] == "BYTES" and head["shape"] == [2, 1]
        assert body[n:] == b"\x0a\x00\x00\x002.000000:2" + b"\x0b\x00\x00\x0024.000000:2"
        assert head["parameters"]["binary_data_size"] == len(body) - n


async def test_a_full_queue_is_503_with_retry_after_and_one_summary_line(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, fake, _):
        fake.error = QueueFullError("model 'fake': 4 requests already wait (max_queue_size 4)")
        with structlog.testing.capture_logs() as events:
            for _ in range(5):
                resp = await client.post("/v2/models/fake/infer", json=_infer_doc())
                assert resp.status == 503 and resp.headers["Retry-After"] == "1"
                assert "max_queue_size 4" in (await resp.json())["error"]
        refused = [e for e in events if e["log_level"] == "warning"]
        assert [e["event"] for e in refused] == ["requests_refused_queue_full"]
        text = await (await client.get("/metrics")).text()
        assert 'reason="queue_full"} 5.0' in text


async def test_the_repository_itself_answers_unknown_names_in_tritons_words(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as (client, _, server):
        with pytest.raises(UnknownModelError) as name:
            server.repository.get("nope")
        assert str(name.value) == "Request for unknown model: 'nope' is not found"
        with pytest.raises(UnknownModelError) as version:
            server.repository.get("fake", "7")
        assert str(version.value) == "Request for unknown model: 'fake' version 7 is not found"
        resp = await client.post("/v2/repository/models/nope/unload")
        assert (resp.status, (await resp.json())["error"]) == (400, str(name.value))
        # A load says it the way Triton's load does, and nothing else.
        resp = await client.post("/v2/repository/models/missing/load")
        assert (resp.status, (await resp.json())["error"]) == (
            400,
            "failed to load 'missing', failed to poll from model repository",
        )


class _Ran:
    """A runner that has run ``runs`` batches on its one replica (all the metrics read)."""

    def __init__(self, runs: int) -> None:
        self.state = SimpleNamespace(runs=runs, status=ReplicaStatus.READY)

    def replica_states(self) -> list[Any]:
        return [self.state]

    def replica_status(self) -> list[ReplicaStatus]:
        return [ReplicaStatus.READY]

    async def get_monitoring_statistics_mean(self, replica_id: int = 0) -> dict[str, float]:
        return {}

    async def get_monitoring_statistics_total_count(self, replica_id: int = 0) -> dict[str, float]:
        return {}


async def test_a_retiring_runner_is_counted_once_whatever_was_scraped_before() -> None:
    metrics = DaemonMetrics()
    old, new = _Ran(3), _Ran(0)
    serving = ServingRunner(old)  # type: ignore[arg-type]
    await metrics.read_runner("m", "1", serving)  # a scrape: 3
    old.state.runs = 5
    serving.current = new  # type: ignore[assignment]  # a reload's swap
    new.state.runs = 1
    await metrics.read_runner("m", "1", serving)  # a scrape before the old one retires: +1
    await metrics.retire_runner("m", "1", old)  # what the old one ran since its last read: +2
    assert metrics.totals("m", "1").exec_count == 6
    new.state.runs = 4
    await metrics.read_runner("m", "1", serving)  # +3
    assert metrics.totals("m", "1").exec_count == 9


# -- gRPC: the same admission as HTTP ------------------------------------------------------------


def _grpc_request(model: str = "fake", rows: int = 2) -> Any:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="pixels", datatype="FP32", shape=[rows, 4])
    request.raw_input_contents.append(np.arange(rows * 4, dtype=np.float32).tobytes())
    return request


async def _grpc_code(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


async def test_grpc_infer_is_admitted_as_over_http_and_released_once_answered(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as (client, fake, server):
        # A frozen clock: no rate window closes, and the runner's refusal latches for good.
        server.admission.clock = lambda: 100.0
        state = server.admission.model("fake")
        grpc_server, port = await start_grpc_server(server, "127.0.0.1", 0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
                await stub.ModelInfer(_grpc_request(), timeout=5)
                assert state.inflight == 0  # answered: released
                fake.error = InputValidationError("input 'pixels' is wrong")
                code, _ = await _grpc_code(stub.ModelInfer(_grpc_request(), timeout=5))
                assert code is grpc.StatusCode.INVALID_ARGUMENT and state.inflight == 0
                # The runner's refusal: released with queue_full, its in-flight count latched.
                fake.error = QueueFullError("model 'fake': 4 requests already wait")
                code, message = await _grpc_code(stub.ModelInfer(_grpc_request(), timeout=5))
                assert (code, message) == (grpc.StatusCode.UNAVAILABLE, str(fake.error))
                assert state.inflight == 0
                fake.error, fake.gate = None, asyncio.Event()
                fake.entered.clear()
                held = asyncio.ensure_future(stub.ModelInfer(_grpc_request(), timeout=5))
                await fake.entered.wait()
                calls = len(fake.calls)
                with structlog.testing.capture_logs() as events:
                    code, message = await _grpc_code(stub.ModelInfer(_grpc_request(), timeout=5))
                    resp = await client.post("/v2/models/fake/infer", json=_infer_doc())
                # Refused before it was decoded or reached the runner, with the HTTP 503's words.
                assert (code, message) == (grpc.StatusCode.UNAVAILABLE, state.message)
                assert len(fake.calls) == calls
                assert resp.status == 503 and (await resp.json())["error"] == state.message
                assert "grpc_request_failed" not in {e["event"] for e in events}
                fake.gate.set()
                await held
                assert state.inflight == 0
                # An unknown name is answered as such and leaves no admission state behind.
                code, _ = await _grpc_code(stub.ModelInfer(_grpc_request("nope"), timeout=5))
                assert code is grpc.StatusCode.INVALID_ARGUMENT
                assert "nope" not in server.admission.models
        finally:
            await grpc_server.stop(None)
        text = await (await client.get("/metrics")).text()
        refused = 'model_runtime_requests_refused_total{model="fake",reason="queue_full"}'
        assert f"{refused} 2.0" in text  # the gRPC refusal and the HTTP one


async def test_grpc_registers_only_model_infer_and_serves_every_method(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # grpc.aio's accept loop waits on one pending call per registered method for every call
    # it accepts: only the per-request method is registered; the others are found by name.
    registered: list[str] = []
    add = grpc.aio._server.Server.add_registered_method_handlers

    def spy(self: Any, service: str, handlers: dict[str, Any]) -> None:
        registered.extend(handlers)
        add(self, service, handlers)

    monkeypatch.setattr(grpc.aio._server.Server, "add_registered_method_handlers", spy)
    async with serving(tmp_path) as (_, _, server):
        grpc_server, port = await start_grpc_server(server, "127.0.0.1", 0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
                answer = await stub.ModelInfer(_grpc_request(), timeout=5)
                assert list(answer.outputs[0].shape) == [2, 3]
                assert (await stub.ServerLive(pb.ServerLiveRequest(), timeout=5)).live
                ready = await stub.ModelReady(pb.ModelReadyRequest(name="fake"), timeout=5)
                assert ready.ready
                meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="fake"), timeout=5)
                assert [t.name for t in meta.inputs] == ["pixels"]
        finally:
            await grpc_server.stop(None)
    assert registered == ["ModelInfer"]


# -- logs: one access line per request, no request context leaking into actors ------------------


async def test_one_access_log_line_per_request(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, _, _):
        with structlog.testing.capture_logs() as events:
            await client.get("/v2/health/live", headers={"X-Request-ID": "abc-1"})
            await client.post("/v2/models/fake/infer", json=_infer_doc())
            await client.get("/v2/models/nope")
        lines = [e for e in events if e["event"] == "http_request"]
        assert [(e["method"], e["path"], e["status"]) for e in lines] == [
            ("GET", "/v2/health/live", 200),
            ("POST", "/v2/models/fake/infer", 200),
            ("GET", "/v2/models/nope", 400),
        ]
        assert lines[0]["request_id"] == "abc-1" and all(e["log_level"] == "info" for e in lines)
        assert all(isinstance(e["duration_ms"], float) for e in lines)
        assert len({e["request_id"] for e in lines}) == 3
    async with serving(tmp_path, access_log=False) as (client, _, _):
        with structlog.testing.capture_logs() as events:
            await client.get("/v2/health/live")
        assert not [e for e in events if e["event"] == "http_request"]


async def test_a_sane_request_id_is_echoed_and_a_hostile_one_replaced(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, _, _):
        resp = await client.get("/v2/health/live", headers={"X-Request-ID": "trace-9"})
        assert resp.headers["X-Request-ID"] == "trace-9"
        resp = await client.get("/v2/health/live", headers={"X-Request-ID": "x\u2028" + "y" * 500})
        assert len(resp.headers["X-Request-ID"]) == 16


async def test_actors_started_by_a_load_do_not_log_its_request_id(tmp_path: Path) -> None:
    merge = [structlog.contextvars.merge_contextvars]
    async with serving(tmp_path) as (client, fake, server):
        with structlog.testing.capture_logs(processors=merge) as events:
            resp = await client.post(
                "/v2/repository/models/other/load", headers={"X-Request-ID": "load-42"}
            )
            assert resp.status == 200 and resp.headers["X-Request-ID"] == "load-42"
            other = getattr(server.repository.get("other").runner, "current", None)
            assert isinstance(other, FakeRunner)  # behind the repository's serving facade
            await client.post(
                "/v2/models/fake/infer", json=_infer_doc(), headers={"X-Request-ID": "inf-7"}
            )
            for runner in (other, fake):
                runner.actor_wake.set()
            for _ in range(100):
                if len([e for e in events if e["event"] == "actor_event"]) == 2:
                    break
                await asyncio.sleep(0.01)
        actor_lines = [e for e in events if e["event"] == "actor_event"]
        assert len(actor_lines) == 2
        assert all("request_id" not in e for e in actor_lines), actor_lines
        access = [e for e in events if e["event"] == "http_request"]
        assert [e["request_id"] for e in access] == ["load-42", "inf-7"]


async def test_what_triton_cannot_read_is_answered_in_its_words(tmp_path: Path) -> None:
    """L0_http test_negative_dimensions (Triton reads a shape as unsigned: INTERNAL, 500, in
    its JSON reader's words) and test_repository_index_deeply_nested_json ('ready' nested
    250,000 deep is no boolean: 400); the server stays up."""
    async with serving(tmp_path) as (client, _, _):
        doc = _infer_doc()
        doc["inputs"][0]["shape"] = [2, -5]
        resp = await client.post("/v2/models/fake/infer", json=doc)
        assert resp.status == 500
        assert (await resp.json())["error"] == (
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer"
        )
        depth = 250_000
        body = '{"ready":' + "[" * depth + "true" + "]" * depth + "}"
        resp = await client.post("/v2/repository/index", data=body)
        assert resp.status == 400
        assert "Invalid value for 'ready': expected a boolean" in (await resp.json())["error"]
        assert (await client.get("/v2/health/live")).status == 200
