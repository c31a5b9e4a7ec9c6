"""The runtime on a real multi-node Ray cluster, on loopback (DESIGN.md §14, issue 17).

A head (no CPUs: it runs Serve's controller and a proxy) and two worker nodes of one CPU each,
every node on 127.0.0.1; the demo model served by two Ray replicas, one per worker node
(``max_replicas_per_node=1``). Triton's own HTTP client talks to Serve's proxy: both replicas
answer (each says which it is in the response's ``parameters``), health and metadata work,
errors are the daemon's; then a worker node is removed under load: every request in flight
gets an answer or a typed error within its deadline (none hangs), later requests are all
answered by the survivor, and Serve starts the lost replica again on a node added with room.
"""

from __future__ import annotations

import os

# Ray swaps a loopback address for the machine's external one when it connects (it assumes a
# cluster spans machines); this keeps every address of the test cluster on 127.0.0.1. It is
# read when ray is imported, so it comes first.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import gc
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import tritonclient.http as httpclient
from geventhttpclient.response import HTTPParseError
from ray import serve
from ray.cluster_utils import Cluster
from tritonclient.utils import InferenceServerException

from model_runtime.demo import DEMO_MODEL_NAME, DEMO_ONNX_PATH, load_demo_samples
from model_runtime.errors import InputValidationError, UnknownModelError
from model_runtime.ray import APP_NAME, DEPLOYMENT_NAME, build_application, http_options
from model_runtime.server.daemon.options import DaemonOptions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

MODEL = DEMO_MODEL_NAME
ATOL = 1e-4
NODE = {"node_ip_address": "127.0.0.1", "object_store_memory": 100 * 1024 * 1024}
READY_TIMEOUT = 60.0
REQUEST_TIMEOUT = 6.0


@dataclass
class RayServe:
    cluster: Cluster
    port: int
    workers: list[Any] = field(default_factory=list)
    #: Every client made, kept until the module ends: a client that is garbage collected in
    #: another thread (Ray's) fails there, on its gevent hub.
    clients: list[httpclient.InferenceServerClient] = field(default_factory=list)

    def client(self, concurrency: int = 1) -> httpclient.InferenceServerClient:
        """A new client with ``concurrency`` connections of its own (Serve's proxies each
        prefer their node's replica, so one keep-alive connection reaches one replica)."""
        client = httpclient.InferenceServerClient(
            f"127.0.0.1:{self.port}",
            concurrency=concurrency,
            connection_timeout=10.0,
            network_timeout=10.0,
        )
        self.clients.append(client)
        return client


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def ray_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayServe]:
    cache = tmp_path_factory.mktemp("ray") / "cache"
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, **NODE}
    )
    try:
        rs = RayServe(cluster, _free_port())
        rs.workers = [cluster.add_node(num_cpus=1, **NODE) for _ in range(2)]
        ray.init(
            address=cluster.address,
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            log_to_driver=False,
        )
        # A request timeout under the clients' 10 s: a request that lost its replica with
        # its node is answered (408 from the proxy) before the client gives up on it.
        opts = DaemonOptions(
            host="127.0.0.1",
            port=rs.port,
            models=[f"{MODEL}={DEMO_ONNX_PATH}"],
            executable_cache=Path(cache),
            grace_period=5.0,
            request_timeout=REQUEST_TIMEOUT,
        )
        serve.start(http_options=http_options(opts))
        app = build_application(opts, replicas=2, max_replicas_per_node=1)
        serve.run(app, name=APP_NAME, route_prefix="/")
        _wait_for_route(rs.port)
        yield rs
        for client in rs.clients:
            client.close()
        rs.clients.clear()
        gc.collect()  # here, in the thread that made them
    finally:
        try:
            if ray.is_initialized():
                serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()


def _wait_for_route(port: int, timeout: float = 60.0) -> None:
    """Until the proxy routes to the application: ``serve.run`` returns once it is deployed,
    and a loaded host may answer Ray's own 404 (no route yet) for a moment after."""
    url = f"http://127.0.0.1:{port}/v2/health/ready"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the Ray Serve proxy did not route {url} within {timeout} s")
        time.sleep(0.2)


def _pixels(pixels: np.ndarray) -> httpclient.InferInput:
    inp = httpclient.InferInput("pixels", list(pixels.shape), "FP32")
    inp.set_data_from_numpy(pixels, binary_data=True)
    return inp


def _infer(client: httpclient.InferenceServerClient, rows: slice) -> tuple[str, str]:
    """One request of demo samples; checks the logits; returns (replica, node) that answered."""
    pixels, _, logits = load_demo_samples()
    result = client.infer(MODEL, [_pixels(pixels[rows])])
    out = result.as_numpy("logits")
    assert out is not None
    np.testing.assert_allclose(out, logits[rows], atol=ATOL)
    params = result.get_response()["parameters"]
    return params["ray_replica"], params["ray_node"]


def _answering(rs: RayServe, want: int, attempts: int = 40) -> dict[str, str]:
    """replica -> node of the replicas seen answering, over new connections, until ``want``
    distinct ones answered (or ``attempts`` ran out)."""
    seen: dict[str, str] = {}
    for i in range(attempts):
        replica, node = _infer(rs.client(), slice(i % 8, i % 8 + 4))
        seen[replica] = node
        if len(seen) >= want:
            break
    return seen


def test_both_replicas_answer_on_their_own_nodes(ray_serve: RayServe) -> None:
    seen = _answering(ray_serve, want=2)
    assert len(seen) == 2, f"only {seen} answered"
    assert len(set(seen.values())) == 2  # one replica per worker node
    workers = {w.node_id for w in ray_serve.workers}
    assert set(seen.values()) == workers


def test_health_metadata_and_errors_through_the_proxy(ray_serve: RayServe) -> None:
    client = ray_serve.client()
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready(MODEL)
    meta = client.get_model_metadata(MODEL)
    assert meta["name"] == MODEL
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("pixels", "FP32", [-1, 64])
    ]
    assert {t["name"] for t in meta["outputs"]} == {"logits", "probabilities"}
    assert client.get_model_config(MODEL)["name"] == MODEL
    assert client.get_server_metadata()["name"] == "model-runtime"
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", [_pixels(np.zeros((1, 64), np.float32))])
    assert info.value.status() == "400"
    assert "unknown model" in str(info.value)
    with pytest.raises(InferenceServerException) as info:
        client.infer(MODEL, [_pixels(np.zeros((1, 63), np.float32))])
    assert info.value.status() == "400"


def test_deployment_handle_infer(ray_serve: RayServe) -> None:
    handle = serve.get_app_handle(APP_NAME)
    pixels, _, logits = load_demo_samples()
    out = handle.infer.remote(MODEL, {"pixels": pixels[:5]}).result(timeout_s=30)
    np.testing.assert_allclose(out["logits"], logits[:5], atol=ATOL)
    with pytest.raises(InputValidationError):
        handle.infer.remote(MODEL, {"pixels": pixels[:5, :10]}).result(timeout_s=30)
    with pytest.raises(UnknownModelError):
        handle.infer.remote("nope", {"pixels": pixels[:5]}).result(timeout_s=30)


def _running_replicas() -> int:
    status = serve.status().applications[APP_NAME].deployments[DEPLOYMENT_NAME]
    return int(status.replica_states.get("RUNNING", 0))


def _outcome(request: Any) -> tuple[str, str | None]:
    """How an async request ended: ``ok`` (checked) and its replica, or its typed error."""
    _, _, logits = load_demo_samples()
    try:
        result = request.get_result(block=True, timeout=15.0)
    except InferenceServerException as exc:
        return f"http {exc.status()}", None
    except ConnectionError:  # its connection went with its node's proxy
        return "connection lost", None
    except HTTPParseError:  # ... in the middle of its answer ("Incomplete response")
        return "connection lost", None
    out = result.as_numpy("logits")
    np.testing.assert_allclose(out, logits[:4], atol=ATOL)
    return "ok", result.get_response()["parameters"]["ray_replica"]


def test_losing_a_node_under_load(ray_serve: RayServe) -> None:
    rs = ray_serve
    seen = _answering(rs, want=2)
    assert len(seen) == 2
    lost = rs.workers.pop(0)
    doomed = {replica for replica, node in seen.items() if node == lost.node_id}
    pixels, _, _ = load_demo_samples()
    # Eight connections, four requests in flight at a time, while a node goes away.
    client = rs.client(concurrency=8)
    remover = threading.Thread(target=lambda: (time.sleep(1.0), rs.cluster.remove_node(lost)))
    outcomes: Counter[str] = Counter()
    replicas: Counter[str | None] = Counter()
    slowest = 0.0
    remover.start()
    t_end = time.monotonic() + 4.0
    while time.monotonic() < t_end or remover.is_alive():
        t0 = time.monotonic()
        pending = [client.async_infer(MODEL, [_pixels(pixels[:4])]) for _ in range(8)]
        for request in pending:
            outcome, replica = _outcome(request)
            outcomes[outcome] += 1
            replicas[replica] += 1
        slowest = max(slowest, time.monotonic() - t0)
    remover.join()
    # Both replicas served the load; every request got an answer or a typed error (a 5xx, a
    # 408 past the request timeout, or the connection to the lost node's proxy reset), none
    # waited out the client's 10 s.
    assert doomed & set(replicas), (doomed, replicas, outcomes)
    assert outcomes["ok"] > 0, outcomes
    assert slowest < 10.0, (slowest, outcomes)
    # A 5xx from Serve (500, 502, 503, 504), the proxy's 408 past the request timeout (a
    # request that went to the lost node's replica), or the connection reset, refused or aborted.
    typed = {f"http {code}" for code in (408, 500, 502, 503, 504)} | {"ok", "connection lost"}
    assert set(outcomes) <= typed, outcomes

    # Later requests: every one answered, by the replica that is left.
    survivors = set(seen) - doomed
    for i in range(10):
        replica, _ = _infer(rs.client(), slice(i, i + 2))
        assert replica in survivors

    # Serve starts the lost replica again once a node has room (max one per node).
    fresh = rs.cluster.add_node(num_cpus=1, **NODE)
    rs.workers.append(fresh)
    deadline = time.monotonic() + READY_TIMEOUT
    while _running_replicas() < 2:
        assert time.monotonic() < deadline, serve.status()
        time.sleep(0.25)
    seen = _answering(rs, want=2)
    assert fresh.node_id in seen.values()
