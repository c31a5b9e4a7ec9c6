"""Triton's ``L0_http`` body cases against the daemon, at the default body limit (64 MiB): a
JSON request whose size is one large string is read up to the limit (``http_input_size_limit``
``test_large_string_in_json``), a gzip body is bounded by what it inflates to, not by what was
sent (``test_default_limit_compressed``), and a body the client chunk-encoded itself is read
(``http_test`` ``test_content_encoding_chunked_manually``). HTTP only: these are HTTP's limits.

``simple_identity`` is Triton's example python model (a BYTES identity), written here as the
same ``model.py``; ``onnx_zero_1_float32`` an ONNX identity."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import numpy as np
import pytest
import requests

from tests.integration.test_daemon_support import (
    Daemon,
    all_loaded,
    start_daemon,
    stop_daemon,
    wait_for,
)
from tests.triton_qa_models import PYTHON_IDENTITY, write_identity

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

MIB = 1 << 20
LIMIT = 64 * MIB  # the default --http-max-input-size, Triton's and ours

SIMPLE_IDENTITY_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("http_limits")
    repo = tmp / "models"
    write_identity(repo, "onnx", 1, np.float32, [-1], 8)
    (repo / "simple_identity" / "1").mkdir(parents=True)
    (repo / "simple_identity" / "1" / "model.py").write_text(PYTHON_IDENTITY)
    (repo / "simple_identity" / "config.pbtxt").write_text(SIMPLE_IDENTITY_CONFIG)
    d = start_daemon(tmp, "--model-repository", str(repo), wait_ready=False)
    try:
        wait_for(lambda: all_loaded(d), 120, "the models to load")
    except BaseException:
        stop_daemon(d)
        raise
    yield d
    stop_daemon(d)


def _url(daemon: Daemon, model: str) -> str:
    return f"http://127.0.0.1:{daemon.port}/v2/models/{model}/infer"


def _string_request(size: int) -> tuple[bytes, int]:
    """A request whose JSON (as ``requests`` writes it) is ``size`` bytes, almost all of them
    one string; and that string's length."""
    doc = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1], "data": [""]}]}
    length = size - len(json.dumps(doc))
    doc["inputs"][0]["data"] = ["A" * length]
    body = json.dumps(doc).encode()
    assert len(body) == size
    return body, length


def test_large_string_in_json(daemon: Daemon) -> None:
    headers = {"Content-Type": "application/json"}
    url = _url(daemon, "simple_identity")
    over = requests.post(url, data=_string_request(LIMIT + 1)[0], headers=headers)
    assert over.status_code == 400, over.text[:300]
    assert "request JSON size of " in over.text
    assert " bytes exceeds the maximum allowed input size of " in over.text
    assert "Use --http-max-input-size to increase the limit." in over.text
    body, length = _string_request(LIMIT)
    at = requests.post(url, data=body, headers=headers)
    assert at.status_code == 200, at.text[:300]
    (out,) = at.json()["outputs"]
    assert out["shape"] == [1, 1] and out["data"][0] == "A" * length


def _compressed(target: int) -> bytes:
    """gzip of a 1000-float request padded with blanks to ``target`` bytes (Triton's test)."""
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1000],
                       "data": [1.0] * 1000}]}  # fmt: skip
    text = json.dumps(doc, indent=4)
    padded = text[:-1] + " " * (target - len(text)) + text[-1]
    return gzip.compress(padded.encode(), compresslevel=1)


def test_default_limit_compressed(daemon: Daemon) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    url = _url(daemon, "onnx_zero_1_float32")
    over = requests.post(url, data=_compressed(LIMIT + MIB), headers=headers)
    assert over.status_code == 400 and "exceeds the maximum allowed value" in over.text
    within = requests.post(url, data=_compressed(LIMIT - MIB), headers=headers)
    assert within.status_code == 200, within.text[:300]
    assert within.json()["outputs"][0]["data"] == [1.0] * 1000


def test_content_encoding_chunked_manually(daemon: Daemon) -> None:
    """The client encodes the body in chunks itself and says so; ``requests`` adds its own
    ``Content-Length`` (of the encoded body). The chunks are read (RFC 9112: the transfer
    coding decides), and the connection closes after the answer."""
    data = np.arange(8, dtype=np.float32).tobytes()
    body = f"{len(data):X}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    headers = {"Inference-Header-Content-Length": "0", "Transfer-Encoding": "chunked"}
    r = requests.post(_url(daemon, "onnx_zero_1_float32"), data=body, headers=headers)
    assert r.status_code == 200, r.text
    start = int(r.headers["Inference-Header-Content-Length"])
    assert r.content[start:] == data
    assert r.headers["Connection"] == "close"


def _rss(daemon: Daemon) -> int:
    with open(f"/proc/{daemon.proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_no_leak_on_invalid_inference_header_length(daemon: Daemon) -> None:
    """Malformed compressed requests (an Inference-Header-Content-Length past the body that
    1 MiB inflates to) are refused, 400 each, and leave the daemon's memory as it was."""
    body = gzip.compress(b" " * MIB)
    headers = {
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
        "Inference-Header-Content-Length": "9999999",
    }
    url = _url(daemon, "onnx_zero_1_float32")
    with requests.Session() as session:
        first = session.post(url, data=body, headers=headers)  # one-time allocations first
        assert first.status_code == 400 and "Inference-Header-Content-Length" in first.text
        before = _rss(daemon)
        for _ in range(100):
            assert session.post(url, data=body, headers=headers).status_code == 400
    assert _rss(daemon) - before < 32 * MIB
