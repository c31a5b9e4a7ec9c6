"""A client that shrinks its shared memory object under the real daemon (``ftruncate``) fails
its own requests, never the daemon: before a request, while requests stream in over HTTP and
gRPC, and under an output. Each such request gets a 400 (gRPC INVALID_ARGUMENT) that says the
region shrank; a well-behaved client beside it is served throughout, and the daemon lives.
(The daemon reads regions with ``preadv`` and writes them with ``pwrite``; a daemon that mapped
them died of SIGBUS here.) Every object a test creates is unlinked, pass or fail."""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon
from tests.models import make_simple, save

pytestmark = pytest.mark.timeout(60)

WIDTH = 1 << 16  # 256 KiB inputs: a read of the region takes long enough to be cut short
A = np.arange(WIDTH, dtype=np.int32).reshape(1, WIDTH)
B = np.ones((1, WIDTH), dtype=np.int32)
SIZE = A.nbytes
_count = itertools.count()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    repo = tmp_path_factory.mktemp("shrink") / "models"
    (repo / "wide" / "1").mkdir(parents=True)
    (repo / "wide" / "config.pbtxt").write_text(
        "max_batch_size: 8\n"
        f'input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ {WIDTH} ] }}, '
        f'{{ name: "INPUT1" data_type: TYPE_INT32 dims: [ {WIDTH} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ {WIDTH} ] }}, '
        f'{{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ {WIDTH} ] }} ]\n'
    )
    save(make_simple(width=WIDTH), repo / "wide" / "1" / "model.onnx")
    d = start_daemon(repo.parent, "--model-repository", str(repo))  # the defaults: shm on
    yield d
    stop_daemon(d)
    assert d.proc.returncode == 0  # it served on, then drained


@pytest.fixture
def objects() -> Iterator[Callable[[str], str]]:
    """``create(name)`` -> key: a POSIX shared memory object of ``SIZE`` bytes holding A;
    every one is unlinked at the end, pass or fail."""
    made: list[str] = []

    def create(name: str) -> str:
        key = f"/mrt_shrink_{os.getpid()}_{next(_count)}_{name}"
        fd = _posixshmem.shm_open(key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        made.append(key)
        os.pwrite(fd, A.tobytes(), 0)
        os.close(fd)
        return key

    try:
        yield create
    finally:
        for key in made:
            _posixshmem.shm_unlink(key)


def _truncate(key: str, size: int = 0) -> None:
    fd = _posixshmem.shm_open(key, os.O_RDWR, 0)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


Client = Any  # httpclient or grpcclient InferenceServerClient


def _clients(daemon: Daemon) -> dict[str, tuple[Any, Callable[[], Client]]]:
    return {
        "http": (httpclient, lambda: httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")),
        "grpc": (
            grpcclient,
            lambda: grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}"),
        ),
    }


def _infer(module: Any, client: Client, region: str, out_region: str | None = None) -> Any:
    """``wide`` on INPUT0 from ``region`` and B in the request; OUTPUT0 into ``out_region``
    (None: in the response)."""
    inputs = [module.InferInput(n, [1, WIDTH], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_shared_memory(region, SIZE)
    inputs[1].set_data_from_numpy(B)
    out = module.InferRequestedOutput("OUTPUT0")
    if out_region is not None:
        out.set_shared_memory(out_region, SIZE)
    return client.infer("wide", inputs, outputs=[out])


def _shrank(err: InferenceServerException, protocol: str, region: str, key: str) -> bool:
    """The answer says region ``region`` (object ``key``) shrank: a 400 / INVALID_ARGUMENT."""
    code = str(err.status()).removeprefix("StatusCode.")
    text = str(err.message())
    expected = f"shared memory region '{region}' shrank: its object '{key}' holds "
    return code == ("400" if protocol == "http" else "INVALID_ARGUMENT") and text.startswith(
        expected
    )


def _alive(daemon: Daemon) -> None:
    assert daemon.proc.poll() is None, f"the daemon died: exit status {daemon.proc.returncode}"
    assert daemon.get("/v2/health/ready")[0] == 200


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_region_shrunk_before_a_request_fails_that_request(
    daemon: Daemon, objects: Callable[[str], str], protocol: str
) -> None:
    module, connect = _clients(daemon)[protocol]
    key, steady = objects("shrunk"), objects("steady")
    with connect() as client:
        client.register_system_shared_memory("shrunk", key, SIZE)
        client.register_system_shared_memory("steady", steady, SIZE)
        try:
            _truncate(key)
            with pytest.raises(InferenceServerException) as info:
                _infer(module, client, "shrunk")
            assert _shrank(info.value, protocol, "shrunk", key), info.value
            assert f"holds 0 bytes now, less than the {SIZE} it was registered with" in str(
                info.value.message()
            )
            result = _infer(module, client, "steady")
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        finally:
            client.unregister_system_shared_memory()
    _alive(daemon)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_region_shrunk_while_requests_stream_fails_them_and_the_daemon_serves_on(
    daemon: Daemon, objects: Callable[[str], str], protocol: str
) -> None:
    """For ~1.5 s a client's requests read its region while another thread of it shrinks the
    object to 0 and writes it back, over and over. Each of its requests is answered: the sum,
    or the error that says the region shrank. A second client with a region of its own is
    served correctly all along."""
    module, connect = _clients(daemon)[protocol]
    key, steady = objects("shrinking"), objects("steady")
    stop = threading.Event()
    outcomes: dict[str, list[Any]] = {"ok": [], "shrank": [], "steady": [], "other": []}

    def shrink() -> None:
        fd = _posixshmem.shm_open(key, os.O_RDWR, 0)
        try:
            while not stop.is_set():
                os.ftruncate(fd, 0)
                stop.wait(0.001)  # pacing, not ordering: shrunk about half the time
                os.pwrite(fd, A.tobytes(), 0)  # grown back, holding A again
                stop.wait(0.001)
        finally:
            os.close(fd)

    def well_behaved() -> None:
        with connect() as other:
            while not stop.is_set():
                try:
                    result = _infer(module, other, "steady")
                    outcomes["steady"].append(np.array_equal(result.as_numpy("OUTPUT0"), A + B))
                except Exception as exc:
                    outcomes["other"].append(exc)
                    break

    with connect() as client:
        client.register_system_shared_memory("shrinking", key, SIZE)
        client.register_system_shared_memory("steady", steady, SIZE)
        threads = [threading.Thread(target=shrink), threading.Thread(target=well_behaved)]
        for t in threads:
            t.start()
        try:
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                try:
                    result = _infer(module, client, "shrinking")
                    outcomes["ok"].append(np.array_equal(result.as_numpy("OUTPUT0"), A + B))
                except InferenceServerException as exc:
                    key_of = "shrank" if _shrank(exc, protocol, "shrinking", key) else "other"
                    outcomes[key_of].append(exc)
                except Exception as exc:  # (the connection refused: the daemon is gone)
                    outcomes["other"].append(exc)
                    break
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        _alive(daemon)
        assert not outcomes["other"], outcomes["other"][:3]
        assert outcomes["shrank"], "no request met the shrunk object"
        assert all(outcomes["ok"]), "a request read something other than A"
        assert outcomes["steady"] and all(outcomes["steady"])
        # Its object holds A again: the region serves as before.
        np.testing.assert_array_equal(
            _infer(module, client, "shrinking").as_numpy("OUTPUT0"), A + B
        )
        client.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_output_region_shrunk_fails_the_request_and_is_not_grown_back(
    daemon: Daemon, objects: Callable[[str], str], protocol: str
) -> None:
    module, connect = _clients(daemon)[protocol]
    key, out_key = objects("in"), objects("out")
    with connect() as client:
        client.register_system_shared_memory("in", key, SIZE)
        client.register_system_shared_memory("out", out_key, SIZE)
        try:
            _truncate(out_key)
            with pytest.raises(InferenceServerException) as info:
                _infer(module, client, "in", out_region="out")
            assert _shrank(info.value, protocol, "out", out_key), info.value
            fd = _posixshmem.shm_open(out_key, os.O_RDONLY, 0)
            try:
                assert os.fstat(fd).st_size == 0  # the server did not write past its end
            finally:
                os.close(fd)
            _truncate(out_key, SIZE)  # the client gives it its bytes back: served again
            _infer(module, client, "in", out_region="out")
            fd = _posixshmem.shm_open(out_key, os.O_RDONLY, 0)
            try:
                got = np.frombuffer(os.pread(fd, SIZE, 0), np.int32)
            finally:
                os.close(fd)
            np.testing.assert_array_equal(got, (A + B).ravel())
        finally:
            client.unregister_system_shared_memory()
    _alive(daemon)
