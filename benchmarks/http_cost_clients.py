"""The load generator of :mod:`benchmarks.http_cost`, run as its own process: C callers over
raw HTTP/1.1 keep-alive connections (binary or JSON infer, prebuilt requests, each connection
sending its next request once its answer is in) or over gRPC (grpcio, six calls to a
connection; ``grpcs``: over TLS), printing ``{"seconds", "errors", "lost"}`` as JSON.

    python benchmarks/http_cost_clients.py PORT MODE CLIENTS TOTAL [TARGET [CA_FILE]]

TARGET: a key of :data:`benchmarks.http_cost_python.TARGETS` (default ``digits``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.http_cost_python import TARGETS, Target, rows_of


def _request(mode: str, port: int, row: np.ndarray, target: Target) -> bytes:
    x = np.ascontiguousarray(row[None, :])
    tensor: dict[str, Any] = {"name": target.input, "datatype": target.datatype,
                              "shape": list(x.shape)}  # fmt: skip
    extra = b""
    if mode == "json":
        tensor["data"] = x.ravel().tolist()
        body = orjson.dumps({"inputs": [tensor]})
    else:
        tensor["parameters"] = {"binary_data_size": x.nbytes}
        head = orjson.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}})
        body = head + x.tobytes()
        extra = b"Inference-Header-Content-Length: %d\r\n" % len(head)
    return (
        b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
        b"Content-Type: application/octet-stream\r\n%sContent-Length: %d\r\n\r\n"
        % (target.name.encode(), port, extra, len(body))
    ) + body


class _Client(asyncio.Protocol):
    """One keep-alive connection sending its next request once its answer is in."""

    def __init__(self, load: _Load) -> None:
        self.load = load
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.load.send(self)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            start = head.find(b"content-length:")
            length = int(head[start + 15 : head.find(b"\r\n", start)].strip())
            total = end + 4 + length
            if len(buf) < total:
                return
            ok = head.startswith(b"http/1.1 200")
            del buf[:total]
            self.load.answered(self, ok)

    def connection_lost(self, exc: Exception | None) -> None:
        self.load.lost += 1


class _Load:
    def __init__(self, requests: list[bytes], total: int) -> None:
        self.requests = requests
        self.total = total
        self.sent = self.done = self.errors = self.lost = 0
        self.finished = asyncio.get_running_loop().create_future()

    def send(self, conn: _Client) -> None:
        if self.sent >= self.total:
            return
        assert conn.transport is not None
        conn.transport.write(self.requests[self.sent % len(self.requests)])
        self.sent += 1

    def answered(self, conn: _Client, ok: bool) -> None:
        self.done += 1
        self.errors += not ok
        if self.done >= self.total and not self.finished.done():
            self.finished.set_result(None)
        self.send(conn)


async def _drive(port: int, mode: str, clients: int, total: int, target: Target) -> dict[str, Any]:
    requests = [_request(mode, port, r, target) for r in rows_of(target)]
    loop = asyncio.get_running_loop()
    load = _Load(requests, total)
    t0 = time.perf_counter()
    for _ in range(clients):
        await loop.create_connection(lambda: _Client(load), "127.0.0.1", port)
    await asyncio.wait_for(load.finished, 600)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "errors": load.errors, "lost": load.lost}


#: gRPC calls in flight that share one connection (mode ``grpc``).
CALLS_PER_CHANNEL = 6


async def _drive_grpc(
    port: int, clients: int, total: int, target: Target, ca: bytes = b""
) -> dict[str, Any]:
    """``clients`` callers of ModelInfer, each calling again once answered, over one channel
    (its own connection) per :data:`CALLS_PER_CHANNEL` of them (``ca``: over TLS, the server's
    certificate signed by this CA, PEM)."""
    import grpc

    from model_runtime.server.triton import grpc_service_pb2 as pb

    requests = []
    for r in rows_of(target):
        request = pb.ModelInferRequest(model_name=target.name)
        request.inputs.add(name=target.input, datatype=target.datatype, shape=[1, len(r)])
        request.raw_input_contents.append(r.tobytes())
        requests.append(request.SerializeToString())
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection per channel
    address = f"127.0.0.1:{port}"
    count = -(-clients // CALLS_PER_CHANNEL)
    if ca:
        credentials = grpc.ssl_channel_credentials(ca)
        channels = [grpc.aio.secure_channel(address, credentials, options=options)
                    for _ in range(count)]  # fmt: skip
    else:
        channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(count)]
    methods = [c.unary_unary("/inference.GRPCInferenceService/ModelInfer") for c in channels]
    counts = {"sent": 0, "errors": 0}

    async def caller(i: int) -> None:
        method = methods[i % len(methods)]
        while counts["sent"] < total:
            request = requests[counts["sent"] % len(requests)]
            counts["sent"] += 1
            try:
                await method(request)
            except grpc.RpcError:
                counts["errors"] += 1

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(caller(i) for i in range(clients))), 600)
    seconds = time.perf_counter() - t0
    for channel in channels:
        await channel.close()
    return {"seconds": seconds, "errors": counts["errors"], "lost": 0}


def _client_main(
    port: int, mode: str, clients: int, total: int, target: Target, ca: str = ""
) -> None:
    if mode in ("grpc", "grpcs"):
        pem = Path(ca).read_bytes() if ca else b""
        result = asyncio.run(_drive_grpc(port, clients, total, target, pem))
        print(json.dumps(result))
        return
    try:
        import uvloop

        result = uvloop.run(_drive(port, mode, clients, total, target))
    except ImportError:
        result = asyncio.run(_drive(port, mode, clients, total, target))
    print(json.dumps(result))


if __name__ == "__main__":
    port, mode, clients, total, *rest = sys.argv[1:]
    _client_main(
        int(port), mode, int(clients), int(total), TARGETS[rest[0] if rest else "digits"], *rest[1:]
    )
