"""Shared memory through the HTTP front end in process, over the fake runner of
``test_server_app.py``: a region unregistered while a request uses it stays until the request
is answered, every request gives its regions back whatever becomes of it, a server with client
shared memory off says so, and what Triton refuses in a request is refused with its text.
(The real daemon with tritonclient: ``tests/integration/test_shared_memory_flows.py``.)"""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]
import asyncio
import itertools
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from model_runtime.errors import ApplicationRuntimeError, ProtocolError
from model_runtime.server.grpc.codec import parse_model_infer_request
from model_runtime.server.tensors.codec import parse_infer_request
from model_runtime.server.tensors.request import InferRequest, TensorSpec
from model_runtime.server.tensors.shm import DISABLED, SharedMemoryRegistry
from model_runtime.server.tensors.shm_io import decode_in_thread
from model_runtime.server.triton import grpc_service_pb2 as pb
from tests.unit.test_server_app import W, serving

pytestmark = pytest.mark.timeout(20)
_count = itertools.count()
X = np.arange(8, dtype=np.float32).reshape(2, 4)


@pytest.fixture
def key() -> Iterator[str]:
    """A 4 KiB POSIX shared memory object holding X at 0 (unlinked at the end)."""
    name = f"/mrt_server_{os.getpid()}_{next(_count)}"
    fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        os.pwrite(fd, X.tobytes(), 0)
        os.close(fd)
        yield name
    finally:
        _posixshmem.shm_unlink(name)


def _read(key: str, offset: int, count: int, dtype: Any) -> np.ndarray:
    fd = _posixshmem.shm_open(key, os.O_RDONLY, 0)
    try:
        return np.frombuffer(os.pread(fd, count * np.dtype(dtype).itemsize, offset), dtype)
    finally:
        os.close(fd)


def _doc(**output: Any) -> dict[str, Any]:
    """A request for logits of X from region ``r``, into region ``r`` at 1024."""
    region = {"shared_memory_region": "r", "shared_memory_byte_size": X.nbytes}
    out = {"shared_memory_region": "r", "shared_memory_byte_size": 24, "shared_memory_offset": 1024}
    return {
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [2, 4], "parameters": region}],
        "outputs": [{"name": "logits", "parameters": {**out, **output}}],
    }


async def test_a_region_unregistered_during_a_request_serves_it_then_goes(
    tmp_path: Path, key: str
) -> None:
    async with serving(tmp_path) as (client, fake, _):
        resp = await client.post(
            "/v2/systemsharedmemory/region/r/register",
            json={"key": key, "offset": 0, "byte_size": 4096},
        )
        assert resp.status == 200
        fake.gate = asyncio.Event()
        request = asyncio.ensure_future(client.post("/v2/models/fake/infer", json=_doc()))
        await fake.entered.wait()
        assert (await client.post("/v2/systemsharedmemory/unregister")).status == 200
        # Triton's rule: still listed (and its name taken) until the request is answered.
        status = await (await client.get("/v2/systemsharedmemory/status")).json()
        assert status == [{"name": "r", "key": key, "offset": 0, "byte_size": 4096}]
        fake.gate.set()
        resp = await request
        assert resp.status == 200, await resp.text()
        doc = await resp.json()
        assert doc["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [2, 3]}]
        np.testing.assert_array_equal(_read(key, 1024, 6, np.float32), (X @ W).ravel())
        assert (await (await client.get("/v2/systemsharedmemory/status")).json()) == []
        resp = await client.get("/v2/systemsharedmemory/region/r/status")
        assert resp.status == 404
        assert (await resp.json())["error"] == "Unable to find system shared memory region: 'r'"


@pytest.mark.parametrize("failure", ["runner", "decode", "output_too_small", "cancelled"], ids=str)
async def test_every_request_gives_its_regions_back(tmp_path: Path, key: str, failure: str) -> None:
    """Whatever becomes of a request, its regions are released: an unregister afterwards
    takes effect at once."""
    async with serving(tmp_path) as (client, fake, _):
        register = {"key": key, "byte_size": 4096}
        resp = await client.post("/v2/systemsharedmemory/region/r/register", json=register)
        assert resp.status == 200
        doc = _doc()
        if failure == "runner":
            fake.error = ApplicationRuntimeError("the device failed")
        elif failure == "decode":  # after both regions were leased
            doc["outputs"].append({"name": "logits"})
        elif failure == "output_too_small":
            doc["outputs"][0]["parameters"]["shared_memory_byte_size"] = 20
        if failure == "cancelled":
            fake.gate = asyncio.Event()
            request = asyncio.ensure_future(client.post("/v2/models/fake/infer", json=doc))
            await fake.entered.wait()
            request.cancel()
            await fake.cancel_seen.wait()
        else:
            resp = await client.post("/v2/models/fake/infer", json=doc)
            assert resp.status in (400, 500)
        if failure == "output_too_small":
            assert resp.status == 500
            assert (await resp.json())["error"] == (
                "shared memory size specified with the request for output 'logits' (20 bytes) "
                "should be at least 24 bytes to hold the results"
            )
        assert (await client.post("/v2/systemsharedmemory/unregister")).status == 200
        for _ in range(100):  # a cancelled handler finishes on its own schedule
            status = await (await client.get("/v2/systemsharedmemory/status")).json()
            if not status:
                break
            await asyncio.sleep(0.01)
        assert status == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["inputs"][0].update(data=X.ravel().tolist()),
         "unexpected 'data' provided when using shared memory for input tensor 'pixels' for "
         "model 'fake'"),
        (lambda d: d["outputs"][0]["parameters"].update(classification=2),
         "Output can't set both 'shared_memory_region' and 'classification'"),
        (lambda d: d["outputs"][0]["parameters"].update(binary_data=True),
         "Output can't set both 'shared_memory_region' and 'binary_data'"),
        (lambda d: d["inputs"][0]["parameters"].update(shared_memory_offset=-1),
         "invalid value for 'shared_memory_offset' parameter for tensor 'pixels', expected an "
         "integer in [0, 18446744073709551615], got -1"),
        (lambda d: d["inputs"][0]["parameters"].update(shared_memory_region=7),
         "invalid value type for 'shared_memory_region' parameter for tensor 'pixels', expected "
         "a string"),
    ],
)  # fmt: skip
async def test_what_triton_refuses_in_a_request_is_a_400_with_its_text(
    tmp_path: Path, key: str, change: Any, message: str
) -> None:
    async with serving(tmp_path) as (client, fake, _):
        register = {"key": key, "byte_size": 4096}
        await client.post("/v2/systemsharedmemory/region/r/register", json=register)
        doc = _doc()
        change(doc)
        resp = await client.post("/v2/models/fake/infer", json=doc)
        assert (resp.status, (await resp.json())["error"]) == (400, message)
        assert fake.calls == []


async def test_routes_answer_triton_s_methods_and_bodies(tmp_path: Path, key: str) -> None:
    async with serving(tmp_path) as (client, _, _):
        resp = await client.post("/v2/systemsharedmemory/status")
        assert (resp.status, (await resp.json())["error"]) == (405, "Method Not Allowed")
        assert (await client.get("/v2/systemsharedmemory/region/r/register")).status == 405
        for body, message in [
            ({"byte_size": 8}, "Shared memory register request has no 'key' field"),
            ({"key": key}, "Shared memory register request has no 'byte_size' field"),
            ({"key": key, "byte_size": -1}, "Unable to parse 'byte_size'"),
        ]:
            resp = await client.post("/v2/systemsharedmemory/region/r/register", json=body)
            assert resp.status == 400 and message in (await resp.json())["error"]
        resp = await client.post("/v2/systemsharedmemory/register", json={"key": key})
        assert (resp.status, (await resp.json())["error"]) == (
            400,
            "'region name' is necessary to register system shared memory region",
        )
        resp = await client.post("/v2/cudasharedmemory/register", json={})
        assert (await resp.json())["error"] == (
            "'region name' is necessary to register cuda shared memory region"
        )
        assert (await client.post("/v2/cudasharedmemory/unregister")).status == 200
        assert (await (await client.get("/v2/cudasharedmemory/status")).json()) == []


async def test_client_shared_memory_off_is_refused_as_triton_refuses_it(
    tmp_path: Path, key: str
) -> None:
    async with serving(tmp_path, allow_client_shm=False) as (client, _, _):
        meta = await (await client.get("/v2")).json()
        assert "system_shared_memory" not in meta["extensions"]
        for path in ("region/r/register", "unregister", "region/r/unregister"):
            resp = await client.post(f"/v2/systemsharedmemory/{path}", json={"key": key})
            assert (resp.status, (await resp.json())["error"]) == (501, DISABLED)
        assert (await (await client.get("/v2/systemsharedmemory/status")).json()) == []
        resp = await client.post("/v2/models/fake/infer", json=_doc())
        assert resp.status == 404
        assert (await resp.json())["error"] == "Unable to find shared memory region: 'r'"


async def test_an_output_region_shrunk_while_its_request_runs_fails_that_request(
    tmp_path: Path, key: str
) -> None:
    """The client shrinks the object after the request leased its output region and before
    the result is written: the request gets a 400 that says the region shrank, nothing is
    written (the object is not grown back), and the server serves on."""
    async with serving(tmp_path) as (client, fake, _):
        register = {"key": key, "byte_size": 4096}
        resp = await client.post("/v2/systemsharedmemory/region/r/register", json=register)
        assert resp.status == 200
        fake.gate = asyncio.Event()
        request = asyncio.ensure_future(client.post("/v2/models/fake/infer", json=_doc()))
        await asyncio.wait_for(fake.entered.wait(), 5)
        fd = _posixshmem.shm_open(key, os.O_RDWR, 0)
        try:
            os.ftruncate(fd, 0)  # the output's bytes (at 1024) are gone
            fake.gate.set()
            resp = await request
            assert (resp.status, (await resp.json())["error"]) == (
                400,
                f"shared memory region 'r' shrank: its object '{key}' holds 0 bytes now, "
                "less than the 4096 it was registered with",
            )
            assert os.fstat(fd).st_size == 0
            os.ftruncate(fd, 4096)
            os.pwrite(fd, X.tobytes(), 0)
        finally:
            os.close(fd)
        fake.gate = None
        resp = await client.post("/v2/models/fake/infer", json=_doc())
        assert resp.status == 200, await resp.text()
        np.testing.assert_array_equal(_read(key, 1024, 6, np.float32), (X @ W).ravel())


def test_an_input_in_a_region_is_the_request_s_own_copy_in_both_codecs(key: str) -> None:
    """One copy up to the runner: the decoded input is a contiguous, writable array of its
    own (what the client writes to the region afterwards does not show through)."""
    specs = (TensorSpec("pixels", "FP32", (-1, 4)),)
    outs = (TensorSpec("logits", "FP32", (-1, 3)),)
    regions = SharedMemoryRegistry()
    regions.register("r", key, 0, 4096)
    body = orjson.dumps(_doc())
    grpc_request = pb.ModelInferRequest(model_name="fake")
    tensor = grpc_request.inputs.add(name="pixels", datatype="FP32", shape=[2, 4])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].int64_param = X.nbytes
    parsed = [
        parse_infer_request(body, None, specs, outs, model="fake", regions=regions),
        parse_model_infer_request(grpc_request, specs, outs, model="fake", regions=regions),
    ]
    fd = _posixshmem.shm_open(key, os.O_RDWR, 0)
    os.pwrite(fd, np.float32(-1).tobytes(), 0)
    os.close(fd)
    for request in parsed:
        pixels = request.inputs["pixels"]
        np.testing.assert_array_equal(pixels, X)
        assert pixels.dtype == np.float32 and pixels.flags.c_contiguous
        request.release()
    tensor.contents.fp32_contents.extend(X.ravel().tolist())
    with pytest.raises(ProtocolError) as info:
        parse_model_infer_request(grpc_request, specs, outs, model="fake", regions=regions)
    assert str(info.value) == (
        "unexpected 'content' provided when using shared memory for input tensor 'pixels' for "
        "model 'fake'"
    )
    regions.unregister()
    assert regions.status() == []  # every lease was given back, the failed decode's too


async def test_a_request_decoded_in_a_thread_gives_its_regions_back_when_its_caller_goes(
    key: str,
) -> None:
    """A big request is decoded off the event loop; if its client goes meanwhile, the handler
    is cancelled at once, and the regions the decoder leased are released when it finishes."""
    regions = SharedMemoryRegistry()
    regions.register("r", key, 0, 4096)
    leased, finish = threading.Event(), threading.Event()

    def decode() -> InferRequest:
        request = InferRequest(None, {}, (), leases=[regions.lease("r", 0, 8)])
        leased.set()
        finish.wait(10)
        return request

    handler = asyncio.ensure_future(decode_in_thread(decode))
    await asyncio.to_thread(leased.wait, 10)
    handler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handler
    regions.unregister()
    assert [s.name for s in regions.status()] == ["r"]  # still leased by the decoder
    finish.set()
    for _ in range(500):
        if not regions.status():
            break
        await asyncio.sleep(0.01)
    assert regions.status() == []
