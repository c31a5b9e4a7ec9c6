"""Triton's ``L0_string_io`` against the daemon: BYTES elements that are not UTF-8 (serialized
protobufs) go through a python identity model unchanged, over gRPC and HTTP binary tensors;
in HTTP JSON, which has no way to write them, they are refused. Decimal strings and numbers
sent as BYTES round-trip every way.

An ONNX model cannot take them: onnxruntime's Python API passes string tensors as text (it
encodes and decodes UTF-8), so the daemon refuses such bytes for ONNX models with a 400 that
says so; Triton's test runs the python model only."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_daemon_support import (
    Daemon,
    all_loaded,
    start_daemon,
    stop_daemon,
    wait_for,
)
from tests.triton_qa_models import PYTHON_IDENTITY

pytestmark = pytest.mark.timeout(120)

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 8 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 8 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""

#: eight serialized protobufs, as Triton's test sends (none of them UTF-8)
NOT_UTF8 = [
    b"\nF\n'\n\x01a\x12\"\x1a \n\x1e\xfa\x03\x94\x01\x0f\xd7\x02\xf1\x05\xdf\x01",
    b"\n:\n\x1a\n\x01a\x12\x15\x1a\x13\n\x11*\xe3\x05\xc5\x06\xda\x07\xcb\x06~\xb1",
    b"\nL\n-\n\x01a\x12(\x1a&\n$\x87\x07\xce\x01\xe7\x06\xee\x04\xe1\x03\xf1\x03",
    b"\n2\n\x12\n\x01a\x12\r\x1a\x0b\n\t\x99\x02\xde\x04\x9f\x04\xc5\x053\n\r",
    b"\nJ\n\r\n\x01b\x12\x08\x1a\x06\n\x04\x9b\x94\xad\x04\n\r\n\x01c\x12\x08",
    b"\n3\n\x13\n\x01a\x12\x0e\x1a\x0c\n\n<\xe2\x05\x8a\x01\xb3\x07?\xfd\x01\x00\x00",
    b"\n&\n\x07\n\x01a\x12\x02\x1a\x00\n\x0c\n\x01b\x12\x07\x1a\x05\n\x03\x89\xcc=\x00",
    b"\nF\n'\n\x01a\x12\"\x1a \n\x1e\x97\x01\x93\x02\x9e\x01\xac\x06\xff\x01\xd8",
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("string_io")
    repo = tmp / "models"
    (repo / "string_identity" / "1").mkdir(parents=True)
    (repo / "string_identity" / "1" / "model.py").write_text(PYTHON_IDENTITY)
    (repo / "string_identity" / "config.pbtxt").write_text(CONFIG)
    d = start_daemon(tmp, "--model-repository", str(repo), wait_ready=False)
    try:
        wait_for(lambda: all_loaded(d), 120, "the model to load")
    except BaseException:
        stop_daemon(d)
        raise
    yield d
    stop_daemon(d)


def _clients(daemon: Daemon) -> list[tuple[Any, Any, bool, bool]]:
    """(client, module, binary outputs, binary inputs), as Triton's test lists them."""
    http = f"127.0.0.1:{daemon.port}"
    return [
        (grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}"), grpcclient, True, True),
        (httpclient.InferenceServerClient(http), httpclient, True, True),
        (httpclient.InferenceServerClient(http), httpclient, True, False),
        (httpclient.InferenceServerClient(http), httpclient, False, False),
        (httpclient.InferenceServerClient(http), httpclient, False, True),
    ]


def _echo(client: Any, module: Any, binary_out: bool, binary_in: bool, data: np.ndarray) -> Any:
    tensor = module.InferInput("INPUT0", list(data.shape), "BYTES")
    if module is httpclient:
        tensor.set_data_from_numpy(data, binary_data=binary_in)
        outputs = [module.InferRequestedOutput("OUTPUT0", binary_data=binary_out)]
    else:
        tensor.set_data_from_numpy(data)
        outputs = [module.InferRequestedOutput("OUTPUT0")]
    return client.infer("string_identity", [tensor], outputs=outputs).as_numpy("OUTPUT0")


def _as_bytes(values: np.ndarray) -> list[bytes]:
    return [v if isinstance(v, bytes) else str(v).encode() for v in values.ravel()]


@pytest.mark.parametrize("dtype", [object, np.bytes_])
def test_unicode_bytes(daemon: Daemon, dtype: Any) -> None:
    for client, module, binary_out, binary_in in _clients(daemon):
        try:
            for values in ([str(i) for i in range(10000, 10008)], list(range(10000, 10008))):
                data = np.array(values, dtype=dtype)
                out = _echo(client, module, binary_out, binary_in, data)
                assert _as_bytes(out) == [str(v).encode() for v in values]
            raw = np.array(NOT_UTF8, dtype=dtype)
            if binary_out and binary_in:
                out = _echo(client, module, binary_out, binary_in, raw)
                assert _as_bytes(out) == _as_bytes(raw)  # (np.bytes_ drops trailing NULs)
            else:  # JSON cannot carry them one way or the other
                with pytest.raises((InferenceServerException, UnicodeDecodeError)):
                    _echo(client, module, binary_out, binary_in, raw)
        finally:
            client.close()
