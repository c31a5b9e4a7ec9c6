"""Triton's trace extension on the real daemon (after Triton's qa/L0_trace): settings over
HTTP and gRPC, per model and global; Triton's trace file with each request's timestamps from
where the runtime was; sampling by rate and count; OpenTelemetry spans received on a loopback
OTLP/HTTP collector, continuing the client's W3C trace."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from model_runtime.demo import DEMO_ONNX_PATH
from tests.ensemble_models import write_add_sub_ensemble
from tests.integration.test_daemon_support import (
    MODEL,
    REPO_ROOT,
    Daemon,
    http,
    infer_doc,
    running,
    samples,
    start_daemon,
    stop_daemon,
    wait_for,
)

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = [pytest.mark.timeout(120)]

ORDER = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    tmp = tmp_path_factory.mktemp("trace")
    trace_file = tmp / "trace.json"
    repo = tmp / "models"  # a python model beside the demo's ONNX one
    shutil.copytree(REPO_ROOT / "tests" / "repositories" / "python" / "add_sub", repo / "add_sub")
    write_add_sub_ensemble(repo)  # and an ensemble over an ONNX model
    d = start_daemon(
        tmp,
        f"--trace-config=triton,file={trace_file}",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=1",
        f"--model-repository={repo}",
        f"{MODEL}={DEMO_ONNX_PATH}",
    )
    try:
        yield d, trace_file
    finally:
        stop_daemon(d)


def _infer(d: Daemon, **extra: Any) -> None:
    pixels, _ = samples()
    assert d.post(f"/v2/models/{MODEL}/infer", infer_doc(pixels[:1], **extra))[0] == 200


def _traces(path: Path) -> dict[int, dict[str, Any]]:
    """Trace id -> its head and its timestamps by name."""
    out: dict[int, dict[str, Any]] = {}
    for obj in json.loads(path.read_text()) if path.exists() else []:
        trace = out.setdefault(obj["id"], {"stamps": {}})
        if "timestamps" in obj:
            for stamp in obj["timestamps"]:
                trace["stamps"][stamp["name"]] = stamp["ns"]
        else:
            trace.update(obj)
    return out


def test_each_request_is_traced_in_order(traced: tuple[Daemon, Path]) -> None:
    d, path = traced
    before = set(_traces(path))
    _infer(d, id="req-7")
    pixels, _ = samples()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{d.grpc_port}") as client:
        one = grpcclient.InferInput("pixels", [1, *pixels.shape[1:]], "FP32")
        one.set_data_from_numpy(pixels[:1])
        client.infer(MODEL, [one])
    new = {i: t for i, t in _traces(path).items() if i not in before}
    assert len(new) == 2
    for trace in new.values():
        assert trace["model_name"] == MODEL and trace["model_version"] == 1
        names = list(trace["stamps"])
        assert names == ORDER, names
        times = [trace["stamps"][n] for n in ORDER]
        assert times == sorted(times), trace  # each taken where the request was
    assert any(t.get("request_id") == "req-7" for t in new.values())


def test_tensors_level_records_inputs_and_outputs(traced: tuple[Daemon, Path]) -> None:
    d, path = traced
    assert d.post("/v2/trace/setting", {"trace_level": ["TIMESTAMPS", "TENSORS"]})[0] == 200
    try:
        before = len(json.loads(path.read_text()))
        _infer(d)
    finally:
        d.post("/v2/trace/setting", {"trace_level": None})
    new = json.loads(path.read_text())[before:]
    tensors = {o["activity"]: o["tensor"] for o in new if "activity" in o}
    pixels, _ = samples()
    sent = tensors["TENSOR_QUEUE_INPUT"]
    assert (sent["name"], sent["dtype"]) == ("pixels", "FP32")
    assert sent["shape"] == ",".join(map(str, pixels[:1].shape))
    assert [float(v) for v in sent["data"].split(",")] == pixels[:1].ravel().tolist()
    assert tensors["TENSOR_BACKEND_OUTPUT"]["dtype"] == "FP32"


def test_settings_http(traced: tuple[Daemon, Path]) -> None:
    d, path = traced
    initial = {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": str(path),
        "trace_mode": "triton",
    }
    assert d.get("/v2/trace/setting") == (200, initial)
    assert "trace" in d.get("/v2")[1]["extensions"]
    model = f"/v2/models/{MODEL}/trace/setting"
    assert d.get(model) == (200, initial)
    assert d.post(model, {"trace_rate": "3"}) == (200, initial | {"trace_rate": "3"})
    assert d.get("/v2/trace/setting") == (200, initial)  # the global one is untouched
    assert d.post("/v2/trace/setting", {"trace_level": ["TIMESTAMPS", "TENSORS"]})[1][
        "trace_level"
    ] == ["TIMESTAMPS", "TENSORS"]
    # the model's own rate stays; its level falls back to the global one
    assert d.get(model)[1] | {} == initial | {"trace_rate": "3",
                                              "trace_level": ["TIMESTAMPS", "TENSORS"]}  # fmt: skip
    cleared = {"trace_level": None, "trace_rate": None}
    assert d.post(model, cleared) == (200, initial | {"trace_level": ["TIMESTAMPS", "TENSORS"]})
    assert d.post("/v2/trace/setting", cleared) == (200, initial)
    refused = "trace file location can not be updated through network protocol"
    assert d.post(model, {"trace_file": "x.json"}) == (501, {"error": refused})
    assert d.post("/v2/trace/setting", {"trace_rate": "abc"}) == (
        400,
        {"error": "Unable to parse 'trace_rate', got: abc"},
    )
    assert d.post("/v2/trace/setting", {"trace_level": ["OFF", "TIMESTAMPS"]}) == (
        400,
        {"error": "Expect only one trace level 'OFF' is specified"},
    )
    status, doc = d.get("/v2/models/nope/trace/setting")
    assert (status, doc) == (400, {"error": "Request for unknown model : nope"})
    assert d.get("/v2/trace/setting") == (200, initial)


def test_count_and_rate_sample_requests(traced: tuple[Daemon, Path]) -> None:
    d, path = traced
    before = len(_traces(path))
    assert d.post("/v2/trace/setting", {"trace_count": "2"})[1]["trace_count"] == "2"
    for _ in range(4):
        _infer(d)
    assert len(_traces(path)) == before + 2  # two traced, then the count is spent
    assert d.get("/v2/trace/setting")[1]["trace_count"] == "0"
    assert d.post("/v2/trace/setting", {"trace_count": None, "trace_rate": "2"})[0] == 200
    for _ in range(4):
        _infer(d)
    assert len(_traces(path)) == before + 4  # every 2nd request
    d.post("/v2/trace/setting", {"trace_rate": None})


def test_settings_grpc(traced: tuple[Daemon, Path]) -> None:
    d, path = traced
    with grpcclient.InferenceServerClient(f"127.0.0.1:{d.grpc_port}") as client:
        got = client.get_trace_settings(model_name=MODEL, as_json=True)["settings"]
        assert got["trace_level"] == {"value": ["TIMESTAMPS"]}
        assert got["trace_file"] == {"value": [str(path)]}
        changed = client.update_trace_settings(MODEL, {"trace_rate": "5"}, as_json=True)
        assert changed["settings"]["trace_rate"] == {"value": ["5"]}
        assert d.get(f"/v2/models/{MODEL}/trace/setting")[1]["trace_rate"] == "5"
        client.update_trace_settings(MODEL, {"trace_rate": None})
        with pytest.raises(InferenceServerException, match="can not be updated"):
            client.update_trace_settings(settings={"trace_file": "x"})
        with pytest.raises(InferenceServerException, match="Expecting value >= -1"):
            client.update_trace_settings(settings={"trace_count": "-5"})
        with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
            client.get_trace_settings(model_name="nope")


def test_a_python_models_requests_are_traced(traced: tuple[Daemon, Path]) -> None:
    d, path = traced
    before = set(_traces(path))
    doc = {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.0]}
            for n in ("INPUT0", "INPUT1")
        ]
    }
    assert d.post("/v2/models/add_sub/infer", doc)[0] == 200
    (trace,) = (t for i, t in _traces(path).items() if i not in before)
    assert trace["model_name"] == "add_sub"
    assert list(trace["stamps"]) == ORDER  # computed: sent to its instance -> answered
    times = [trace["stamps"][n] for n in ORDER]
    assert times == sorted(times)


def test_an_ensemble_request_and_each_of_its_steps_are_traced(
    traced: tuple[Daemon, Path],
) -> None:
    d, path = traced
    for wanted in (["OUTPUT0"], ["OUTPUT0", "OUTPUT1"]):  # one step; two at once
        before = set(_traces(path))
        doc = {
            "inputs": [
                {"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                for n in ("INPUT0", "INPUT1")
            ],
            "outputs": [{"name": n} for n in wanted],
        }
        assert d.post("/v2/models/ensemble_add_sub/infer", doc)[0] == 200
        new = [t for i, t in _traces(path).items() if i not in before]
        models = sorted(t["model_name"] for t in new)
        assert models == ["ensemble_add_sub"] + ["simple"] * len(wanted), new
        for trace in new:
            stamps = list(trace["stamps"])
            assert stamps[0] == "REQUEST_START" and stamps[-1] == "REQUEST_END", trace


class _Collector(BaseHTTPRequestHandler):
    spans: list[Any] = []

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                type(self).spans.extend((rs.resource, s) for s in ss.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_opentelemetry_spans_continue_the_clients_trace(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    try:
        with running(
            tmp_path,
            "--trace-config=mode=opentelemetry",
            f"--trace-config=opentelemetry,url={url}",
            "--trace-config=opentelemetry,resource=service.name=mr-test",
            "--trace-config=opentelemetry,bsp_schedule_delay=50",
            "--trace-config=level=TIMESTAMPS",
            "--trace-config=rate=1",
        ) as d:
            pixels, _ = samples()
            import urllib.request

            body = json.dumps(infer_doc(pixels[:1])).encode()
            request = urllib.request.Request(
                d.url(f"/v2/models/{MODEL}/infer"),
                data=body,
                headers={"traceparent": f"00-{trace_id}-{parent}-01"},
            )
            with urllib.request.urlopen(request, timeout=10) as resp:
                assert resp.status == 200
            wait_for(lambda: len(_Collector.spans) >= 3, 20, "three spans")
    finally:
        server.shutdown()
    by_name = {s.name: (r, s) for r, s in _Collector.spans}
    assert set(by_name) >= {"InferRequest", MODEL, "compute"}
    resource, root = by_name["InferRequest"]
    assert root.trace_id.hex() == trace_id and root.parent_span_id.hex() == parent
    attrs = {a.key: a.value.string_value for a in resource.attributes}
    assert attrs["service.name"] == "mr-test"
    _, model = by_name[MODEL]
    _, compute = by_name["compute"]
    assert model.parent_span_id == root.span_id and compute.parent_span_id == model.span_id
    assert {a.key for a in model.attributes} >= {"triton.model_name", "triton.model_version"}
    assert [e.name for e in compute.events] == ORDER[2:6]
    assert root.start_time_unix_nano <= compute.start_time_unix_nano
    assert compute.end_time_unix_nano <= root.end_time_unix_nano
    assert abs(root.start_time_unix_nano / 1e9 - time.time()) < 60  # wall-clock times


__all__ = ["http"]
