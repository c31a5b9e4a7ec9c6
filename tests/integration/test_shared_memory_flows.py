"""Triton's system shared memory extension against the real daemon, driven by ``tritonclient``
as NVIDIA's ``simple_http_shm_client.py`` and ``simple_grpc_shm_client.py`` drive Triton: the
client creates POSIX shared memory objects, registers them, sends requests whose inputs and
outputs name regions, and reads the results from shared memory. Then what Triton refuses, with
Triton's texts and codes, and the daemon serves on. Every object a test creates is unlinked,
pass or fail."""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon
from tests.models import make_simple, make_string_identity, save

pytestmark = pytest.mark.timeout(120)

A = np.arange(16, dtype=np.int32)
B = np.ones(16, dtype=np.int32)
SIZE = A.nbytes  # 64
_count = itertools.count()


def _config(datatype: str, names: tuple[str, ...], outs: tuple[str, ...], dims: int) -> str:
    def listed(tensors: tuple[str, ...]) -> str:
        return ", ".join(
            f'{{ name: "{n}" data_type: TYPE_{datatype} dims: [ {dims} ] }}' for n in tensors
        )

    return f"max_batch_size: 8\ninput [ {listed(names)} ]\noutput [ {listed(outs)} ]\n"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("shm") / "models"
    pair, outs = ("INPUT0", "INPUT1"), ("OUTPUT0", "OUTPUT1")
    builds = {
        "simple": (make_simple(), _config("INT32", pair, outs, 16)),
        "simple_identity": (make_string_identity(), _config("STRING", pair[:1], outs[:1], 1)),
    }
    for name, (model, config) in builds.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        save(model, repo / name / "1" / "model.onnx")
    return repo


@pytest.fixture(scope="module")
def daemon(repository: Path) -> Iterator[Daemon]:
    d = start_daemon(repository.parent, "--model-repository", str(repository))
    yield d
    stop_daemon(d)
    assert d.proc.returncode == 0  # every refusal below left it serving, then it drained


Create = Callable[[str, int], tuple[str, Any]]


@pytest.fixture
def objects() -> Iterator[Create]:
    """``create(name, byte_size)`` -> (key, handle): a POSIX shared memory object made by
    tritonclient, unique to this process and test; every one is destroyed and unlinked at the
    end, pass or fail."""
    made: list[tuple[str, Any]] = []

    def create(name: str, byte_size: int) -> tuple[str, Any]:
        key = f"/mrt_test_{os.getpid()}_{next(_count)}_{name}"
        handle = shm.create_shared_memory_region(name, key, byte_size)
        made.append((key, handle))
        return key, handle

    try:
        yield create
    finally:
        for key, handle in made:
            try:
                shm.destroy_shared_memory_region(handle)
            except shm.SharedMemoryException:
                pass
            try:
                _posixshmem.shm_unlink(key)
            except FileNotFoundError:
                pass  # destroyed above: this is the check that nothing is left


def _refused(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def _regions(create: Create, register: Callable[[str, str, int], Any]) -> tuple[Any, Any]:
    """The example's two regions: inputs (INPUT0 then INPUT1) and outputs, each 128 bytes,
    registered as ``input_data`` and ``output_data``."""
    out_key, out_handle = create("output_data", 2 * SIZE)
    register("output_data", out_key, 2 * SIZE)
    in_key, in_handle = create("input_data", 2 * SIZE)
    shm.set_shared_memory_region(in_handle, [A])
    shm.set_shared_memory_region(in_handle, [B], offset=SIZE)
    register("input_data", in_key, 2 * SIZE)
    return in_handle, out_handle


def test_http_simple_shm_client_flow(daemon: Daemon, objects: Create) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        assert "system_shared_memory" in client.get_server_metadata()["extensions"]
        client.unregister_system_shared_memory()
        client.unregister_cuda_shared_memory()
        _, out_handle = _regions(objects, client.register_system_shared_memory)
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("input_data", SIZE)
        inputs[1].set_shared_memory("input_data", SIZE, offset=SIZE)
        names = ("OUTPUT0", "OUTPUT1")
        outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in names]
        outputs[0].set_shared_memory("output_data", SIZE)
        outputs[1].set_shared_memory("output_data", SIZE, offset=SIZE)
        results = client.infer("simple", inputs, outputs=outputs)
        out0, out1 = results.get_output("OUTPUT0"), results.get_output("OUTPUT1")
        # Triton's answer: what and where, no data (the data is in shared memory).
        assert out0 == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
        dtype = utils.triton_to_np_dtype(out0["datatype"])
        got0 = shm.get_contents_as_numpy(out_handle, dtype, out0["shape"])
        got1 = shm.get_contents_as_numpy(out_handle, dtype, out1["shape"], offset=SIZE)
        np.testing.assert_array_equal(got0[0], A + B)
        np.testing.assert_array_equal(got1[0], A - B)
        status = client.get_system_shared_memory_status()
        assert [(r["name"], r["offset"], r["byte_size"]) for r in status] == [
            ("input_data", 0, 2 * SIZE),
            ("output_data", 0, 2 * SIZE),
        ]
        assert status[0]["key"].endswith("_input_data")
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []


def test_grpc_simple_shm_client_flow(daemon: Daemon, objects: Create) -> None:
    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        assert "system_shared_memory" in client.get_server_metadata().extensions
        client.unregister_system_shared_memory()
        client.unregister_cuda_shared_memory()
        _, out_handle = _regions(objects, client.register_system_shared_memory)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("input_data", SIZE)
        inputs[1].set_shared_memory("input_data", SIZE, offset=SIZE)
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory("output_data", SIZE)
        outputs[1].set_shared_memory("output_data", SIZE, offset=SIZE)
        results = client.infer("simple", inputs, outputs=outputs)
        out0, out1 = results.get_output("OUTPUT0"), results.get_output("OUTPUT1")
        assert (out0.datatype, list(out0.shape)) == ("INT32", [1, 16])
        assert list(results.get_response().raw_output_contents) == [b"", b""]
        dtype = utils.triton_to_np_dtype(out0.datatype)
        got0 = shm.get_contents_as_numpy(out_handle, dtype, out0.shape)
        got1 = shm.get_contents_as_numpy(out_handle, dtype, out1.shape, offset=SIZE)
        np.testing.assert_array_equal(got0[0], A + B)
        np.testing.assert_array_equal(got1[0], A - B)
        status = client.get_system_shared_memory_status()
        assert sorted(status.regions) == ["input_data", "output_data"]
        assert status.regions["input_data"].byte_size == 2 * SIZE
        client.unregister_system_shared_memory("input_data")
        assert sorted(client.get_system_shared_memory_status().regions) == ["output_data"]
        client.unregister_system_shared_memory()
        assert not client.get_system_shared_memory_status().regions


def test_shm_and_request_data_mix_and_bytes_tensors_travel_through_regions(
    daemon: Daemon, objects: Create
) -> None:
    """One input in a region and one in the request (HTTP binary, gRPC raw contents); BYTES
    in and out of regions (4-byte length, then the bytes), over both protocols."""
    words = np.array([[b"shared"], [b""], [b"memory \xe2\x9c\x93"]], dtype=object)
    serialized = serialize_byte_tensor(words)
    serial = serialized.item()
    with (
        httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as http,
        grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as grpc_client,
    ):
        key, handle = objects("mixed", SIZE)
        shm.set_shared_memory_region(handle, [A])
        http.register_system_shared_memory("mixed", key, SIZE)
        s_key, s_handle = objects("strings", 2 * len(serial))
        shm.set_shared_memory_region(s_handle, [serialized])
        http.register_system_shared_memory("strings", s_key, 2 * len(serial))
        for module, client in ((httpclient, http), (grpcclient, grpc_client)):
            inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_shared_memory("mixed", SIZE)
            inputs[1].set_data_from_numpy(B.reshape(1, 16))
            result = client.infer("simple", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0")[0], A + B)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1")[0], A - B)

            strings = module.InferInput("INPUT0", [3, 1], "BYTES")
            strings.set_shared_memory("strings", len(serial))
            out = module.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory("strings", len(serial), offset=len(serial))
            client.infer("simple_identity", [strings], outputs=[out])
            echoed = shm.get_contents_as_numpy(s_handle, np.object_, [3, 1], offset=len(serial))
            assert echoed.tolist() == words.tolist()
            blank = np.zeros(len(serial), np.uint8)  # the next protocol writes it again
            shm.set_shared_memory_region(s_handle, [blank], offset=len(serial))
        http.unregister_system_shared_memory()


def _http_error(call: Callable[[], Any]) -> tuple[str, str]:
    err = _refused(call)
    return str(err.status()), str(err.message())


def _grpc_error(call: Callable[[], Any]) -> tuple[str, str]:
    err = _refused(call)
    return str(err.status()).removeprefix("StatusCode."), str(err.message())


def test_what_triton_refuses_is_refused_with_its_texts_and_codes(
    daemon: Daemon, objects: Create
) -> None:
    key, handle = objects("region", 2 * SIZE)
    shm.set_shared_memory_region(handle, [A, B])
    with (
        httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as http,
        grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as grpc_client,
    ):
        http.register_system_shared_memory("region", key, 2 * SIZE)
        exists = "shared memory region 'region' already in manager"
        for call, answer in [
            (lambda: http.register_system_shared_memory("region", key, 8), ("400", exists)),
            (lambda: grpc_client.register_system_shared_memory("region", key, 8),
             ("ALREADY_EXISTS", exists)),
            (lambda: http.register_system_shared_memory("r2", "/mrt_no_such_key", 8),
             ("500", "Unable to open shared memory region: '/mrt_no_such_key'")),
            (lambda: grpc_client.register_system_shared_memory("r2", "/mrt_no_such_key", 8),
             ("INTERNAL", "Unable to open shared memory region: '/mrt_no_such_key'")),
            (lambda: http.register_system_shared_memory("r2", "/../../etc/passwd", 8),
             ("400", "cannot register shared memory region 'r2' - invalid shm key "
                     "'/../../etc/passwd'")),
            (lambda: grpc_client.register_system_shared_memory("r2", "///", 8),
             ("INVALID_ARGUMENT", "cannot register shared memory region 'r2' - invalid shm key "
                                  "'///'")),
            (lambda: http.register_system_shared_memory(
                "r2", "//triton_python_backend_shm_region_x", 8),
             ("400", "cannot register shared memory region 'r2' with key "
                     "'//triton_python_backend_shm_region_x' as the key contains the reserved "
                     "prefix 'triton_python_backend_shm_region_'")),
            (lambda: http.register_system_shared_memory("r2", key, 2 * SIZE, offset=1),
             ("400", "failed to register shared memory region 'r2': invalid args (offset 1 + "
                     f"byte_size {2 * SIZE} is past the end of '{key}', {2 * SIZE} bytes)")),
            (lambda: http.get_system_shared_memory_status("nope"),
             ("404", "Unable to find system shared memory region: 'nope'")),
            (lambda: grpc_client.get_system_shared_memory_status("nope"),
             ("NOT_FOUND", "Unable to find system shared memory region: 'nope'")),
            (lambda: http.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 8),
             ("400", "failed to register CUDA shared memory region: 'gpu', GPUs not supported")),
            (lambda: grpc_client.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 8),
             ("INVALID_ARGUMENT",
              "failed to register CUDA shared memory region: 'gpu', GPUs not supported")),
            (lambda: http.get_cuda_shared_memory_status("region"),
             ("404", "The region named 'region' is registered as system shared memory, not CUDA "
                     "shared memory")),
        ]:  # fmt: skip
            error = (_http_error if answer[0].isdigit() else _grpc_error)(call)
            assert error == answer
        http.unregister_system_shared_memory("never_registered")  # Triton: no error
        grpc_client.unregister_cuda_shared_memory("region")  # no CUDA region: nothing to do
        assert http.get_cuda_shared_memory_status() == []

        def http_infer(
            in_offset: int = 0, in_size: int = SIZE, out_size: int = SIZE, name: str = "region"
        ) -> Any:
            inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_shared_memory(name, in_size, offset=in_offset)
            inputs[1].set_data_from_numpy(B.reshape(1, 16))
            out = httpclient.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory("region", out_size)
            return http.infer("simple", inputs, outputs=[out])

        def grpc_infer(in_offset: int = 0, in_size: int = SIZE, name: str = "region") -> Any:
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_shared_memory(name, in_size, offset=in_offset)
            inputs[1].set_data_from_numpy(B.reshape(1, 16))
            return grpc_client.infer("simple", inputs)

        for call, answer in [
            (lambda: http_infer(name="nope"),
             ("404", "Unable to find shared memory region: 'nope'")),
            (lambda: grpc_infer(name="nope"),
             ("NOT_FOUND", "Unable to find shared memory region: 'nope'")),
            (lambda: http_infer(in_offset=2 * SIZE),
             ("400", "Invalid offset for shared memory region: 'region'")),
            (lambda: grpc_infer(in_offset=SIZE + 1),
             ("INVALID_ARGUMENT", "Invalid offset + byte size for shared memory region: 'region'")),
            (lambda: http_infer(in_offset=32, in_size=2**64 - 32),
             ("400", "Integer overflow detected: byte_size (18446744073709551584) + offset (32) "
                     "exceeds maximum value (18446744073709551615) for region 'region'")),
            (lambda: http_infer(in_size=2 * SIZE),
             ("400", "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected "
                     "64, got 128")),
            (lambda: grpc_infer(in_size=SIZE // 2),
             ("INVALID_ARGUMENT", "input byte size mismatch for input 'INPUT0' for model "
                                  "'simple'. Expected 64, got 32")),
            (lambda: http_infer(out_size=SIZE // 2),
             ("500", "shared memory size specified with the request for output 'OUTPUT0' (32 "
                     "bytes) should be at least 64 bytes to hold the results")),
        ]:  # fmt: skip
            error = (_http_error if answer[0].isdigit() else _grpc_error)(call)
            assert error == answer
        result = http_infer()  # after all that, the same region serves
        assert result.get_output("OUTPUT0") == {
            "name": "OUTPUT0",
            "datatype": "INT32",
            "shape": [1, 16],
        }
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [16]), A + B)
        http.unregister_system_shared_memory()


def test_a_daemon_started_without_client_shared_memory_refuses_it(
    repository: Path, objects: Create
) -> None:
    key, _ = objects("off", SIZE)
    args = ("--model-repository", str(repository), "--no-allow-client-shm")
    d = start_daemon(repository.parent, *args)
    try:
        with (
            httpclient.InferenceServerClient(f"127.0.0.1:{d.port}") as http,
            grpcclient.InferenceServerClient(f"127.0.0.1:{d.grpc_port}") as grpc_client,
        ):
            assert "system_shared_memory" not in http.get_server_metadata()["extensions"]
            disabled = (
                "Client shared memory is disabled. Start the server with '--allow-client-shm' "
                "to enable."
            )
            register = http.register_system_shared_memory
            assert _http_error(lambda: register("off", key, SIZE)) == ("501", disabled)
            register = grpc_client.register_system_shared_memory
            assert _grpc_error(lambda: register("off", key, SIZE)) == ("UNIMPLEMENTED", disabled)
            assert http.get_system_shared_memory_status() == []
    finally:
        stop_daemon(d)
    assert d.proc.returncode == 0
