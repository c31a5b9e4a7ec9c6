"""Where the daemon's gRPC time goes: server CPU per call and latency, perf_analyzer at each
concurrency, for four servers of the demo model measured one after the other (``--pairs``
rounds, order alternated), so that a busy host costs each alike:

* ``http``: the daemon over HTTP (its protocol-level fast path);
* ``grpc``: the same daemon over gRPC (its default transport: nghttp2);
* ``app``: :class:`~model_runtime.server.grpc.native.GrpcApp` on h2corn with handlers that
  decode the request and answer a canned message (our framing and protobuf, no data plane);
* ``base``: gRPC of a daemon of another checkout (``--base DIR``: its code first on the path);
* ``nghttp2``: gRPC of a second daemon of this checkout on ``--grpc-transport nghttp2``;
* ``asgi``: the floor, an ASGI app on h2corn that reads the body and sends canned bytes;
* ``ngapp``: ``app`` on the nghttp2 transport (:mod:`~model_runtime.server.grpc.h2proto`).

CPU per call: the server process's user + system time over the calls it served in the run
(the daemon's model statistics; the others count their calls in shared memory).

    python benchmarks/grpc_cost.py [--seconds 2] [--pairs 2] [--concurrency 1 16]
        [--modes http grpc app asgi]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.peers import servers  # noqa: E402
from model_runtime.demo import DEMO_ONNX_PATH  # noqa: E402
from tests import perf_analyzer  # noqa: E402

MODEL = "digits"
MODES = ("http", "grpc", "app", "asgi", "base", "nghttp2", "ngapp")
SERVICE = "/inference.GRPCInferenceService/"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def daemon(
    workdir: Path, devices: str, base: str | None = None, *args: str
) -> Iterator[tuple[int, str, str]]:
    http_port, grpc_port = servers.free_port(), servers.free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEMO_ONNX_PATH, workdir / f"{MODEL}.onnx")
    cmd = [
        sys.executable, "-m", "model_runtime.server", "--port", str(http_port),
        "--grpc-port", str(grpc_port), "--metrics-port", "0", "--no-access-log",
        "--log-format", "json", "--executable-cache", str(workdir / "cache"),
        f"{MODEL}={workdir / f'{MODEL}.onnx'}", *args,
    ]  # fmt: skip
    env = {"MODEL_RUNTIME_DEVICES": devices, "MODEL_RUNTIME_DIR": str(workdir / "run"),
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    if base is not None:
        env["PYTHONPATH"] = os.pathsep.join([base, os.environ.get("PYTHONPATH", "")])
    url = f"http://127.0.0.1:{http_port}"
    ready = f"{url}/v2/models/{MODEL}/ready"
    with servers.serve("daemon", cmd, env, ready, workdir / "daemon.log") as proc:
        yield proc.pid, url, f"127.0.0.1:{grpc_port}"


def canned(grpc_url: str) -> dict[str, bytes]:
    """The daemon's serialized answers to what perf_analyzer asks, by method name."""
    import grpc
    import numpy as np

    from model_runtime.server.triton import grpc_service_pb2 as pb, grpc_service_pb2_grpc as rpc

    with grpc.insecure_channel(grpc_url) as channel:
        stub = rpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        server = stub.ServerMetadata(pb.ServerMetadataRequest())
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=MODEL))
        config = stub.ModelConfig(pb.ModelConfigRequest(name=MODEL))
        request = pb.ModelInferRequest(model_name=MODEL)
        request.inputs.add(name=meta.inputs[0].name, datatype="FP32", shape=[1, 64])
        request.raw_input_contents.append(np.zeros((1, 64), np.float32).tobytes())
        answer = stub.ModelInfer(request)
        stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name=MODEL))
    return {
        "ServerMetadata": server.SerializeToString(),
        "ModelMetadata": meta.SerializeToString(),
        "ModelConfig": config.SerializeToString(),
        "ModelInfer": answer.SerializeToString(),
        "ModelStatistics": stats.SerializeToString(),
    }


STATS = (SERVICE + "ModelStatistics").encode()


def stats_now(answers: dict[str, bytes], calls: int) -> bytes:
    """The canned statistics with ``calls`` successes (perf_analyzer reads their change)."""
    from model_runtime.server.triton import grpc_service_pb2 as pb

    doc = pb.ModelStatisticsResponse.FromString(answers["ModelStatistics"])
    stats = doc.model_stats[0]
    stats.inference_count = stats.execution_count = calls
    for part in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        getattr(stats.inference_stats, part).count = calls
        getattr(stats.inference_stats, part).ns = calls * 1000
    wire: bytes = doc.SerializeToString()
    return wire


def _serve(mode: str, port: int, answers: dict[str, bytes], calls: Any) -> None:
    import h2corn
    import uvloop

    from model_runtime.server.grpc.framing import frame

    if mode == "asgi":
        framed = {(SERVICE + k).encode(): frame(v) for k, v in answers.items()}
        start = {
            "type": "http.response.start", "status": 200, "trailers": True,
            "headers": [(b"content-type", b"application/grpc")],
        }  # fmt: skip
        trailers = {"type": "http.response.trailers", "headers": [(b"grpc-status", b"0")]}

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            while (await receive()).get("more_body"):
                pass
            path = scope["raw_path"]
            if path == STATS:
                body = frame(stats_now(answers, calls.value))
            else:
                body = framed[path]
                calls.value += 1
            await send(start)
            await send({"type": "http.response.body", "body": body})
            await send(trailers)

    else:
        import grpc

        from model_runtime.server.grpc.native import GrpcApp
        from model_runtime.server.triton import grpc_service_pb2 as pb

        def handler(name: str) -> Any:
            answer = getattr(pb, f"{name}Response").FromString(answers[name])

            async def behaviour(request: Any, context: Any) -> Any:
                if name == "ModelStatistics":
                    return pb.ModelStatisticsResponse.FromString(stats_now(answers, calls.value))
                calls.value += 1
                return answer

            return grpc.unary_unary_rpc_method_handler(
                behaviour,
                request_deserializer=getattr(pb, f"{name}Request").FromString,
                response_serializer=lambda m: m.SerializeToString(),
            )

        app = GrpcApp({n: handler(n) for n in answers}, max_message_size=64 << 20)

    async def main() -> None:
        if mode == "ngapp":
            from model_runtime.server.grpc import ngserver  # noqa: F401  (its header tables)
            from model_runtime.server.grpc.h2proto import H2Protocol, ProtocolLimits

            limits = ProtocolLimits(
                app, max_streams=256, idle_timeout=75.0, write_timeout=10.0,
                max_connections=1024,
            )  # fmt: skip
            loop = asyncio.get_running_loop()
            server = await loop.create_server(lambda: H2Protocol(limits), "127.0.0.1", port)
            await server.serve_forever()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1024)
        config = h2corn.Config(
            bind=(f"fd://{sock.fileno()}",), grpc=True, http1=False, lifespan="off",
            access_log=False, runtime_threads=1,
        )  # fmt: skip
        await h2corn.Server(app, config).serve()  # type: ignore[arg-type]

    uvloop.run(main())


@contextmanager
def empty_server(mode: str, answers: dict[str, bytes]) -> Iterator[tuple[int, str, Any]]:
    ctx = mp.get_context("spawn")
    calls = ctx.Value("q", 0, lock=False)
    port = servers.free_port()
    proc = ctx.Process(target=_serve, args=(mode, port, answers, calls), daemon=True)
    proc.start()
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or not proc.is_alive():
                raise RuntimeError(f"{mode} server did not start") from None
            time.sleep(0.1)
    try:
        assert proc.pid is not None
        yield proc.pid, f"127.0.0.1:{port}", calls
    finally:
        proc.terminate()
        proc.join(5)


def served(url: str) -> tuple[int, int]:
    """The daemon's successful inferences and its model's executions (batches run)."""
    with urllib.request.urlopen(f"{url}/v2/models/{MODEL}/stats", timeout=10) as resp:
        stats = json.load(resp)["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"]), int(stats["execution_count"])


def measure(
    pid: int, url: str, protocol: str, count: Any, c: int, seconds: float
) -> dict[str, float] | None:
    cpu0, (n0, e0) = cpu_seconds(pid), count()
    try:
        r = perf_analyzer.run(
            MODEL, url, protocol=protocol, concurrency=c, measurement_ms=int(seconds * 1000),
            timeout=300, extra=["-s", "50", "-r", "6"],
        )  # fmt: skip
    except perf_analyzer.PerfAnalyzerError as exc:
        lines = str(exc).splitlines()
        print(f"{url} c={c}: {lines[0]}", *lines[-6:], sep="\n")
        return None
    cpu1, (n1, e1) = cpu_seconds(pid), count()
    return {
        "throughput": r.throughput,
        "p50_us": r.p50_us,
        "p99_us": r.p99_us,
        "cpu_us_per_call": (cpu1 - cpu0) * 1e6 / max(1, n1 - n0),
        "batch": (n1 - n0) / max(1, e1 - e0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--devices", default="cpu:1x1")
    parser.add_argument("--base", help="a checkout whose daemon is mode base")
    args = parser.parse_args()
    if perf_analyzer.command() is None:
        print("grpc_cost: perf_analyzer is not installed (make perf-analyzer); skipped")
        return 0
    with tempfile.TemporaryDirectory(prefix="grpc-cost-") as tmp, ExitStack() as stack:
        pid, http, grpc_url = stack.enter_context(daemon(Path(tmp) / "d", args.devices))

        def successes() -> tuple[int, int]:
            return served(http)

        targets: dict[str, tuple[int, str, str, Any]] = {
            "http": (pid, http.removeprefix("http://"), "http", successes),
            "grpc": (pid, grpc_url, "grpc", successes),
        }
        if "base" in args.modes:
            bpid, bhttp, bgrpc = stack.enter_context(
                daemon(Path(tmp) / "b", args.devices, args.base)
            )

            def base_successes() -> tuple[int, int]:
                return served(bhttp)

            targets["base"] = (bpid, bgrpc, "grpc", base_successes)
        if "nghttp2" in args.modes:
            npid, nhttp, ngrpc = stack.enter_context(
                daemon(Path(tmp) / "n", args.devices, None, "--grpc-transport", "nghttp2")
            )

            def ng_successes(nhttp: str = nhttp) -> tuple[int, int]:
                return served(nhttp)

            targets["nghttp2"] = (npid, ngrpc, "grpc", ng_successes)
        answers = canned(grpc_url)
        for mode in ("app", "asgi", "ngapp"):
            if mode in args.modes:
                epid, url, calls = stack.enter_context(empty_server(mode, answers))
                targets[mode] = (epid, url, "grpc", lambda calls=calls: (calls.value, calls.value))
        runs: dict[tuple[str, int], list[dict[str, float]]] = {}
        for c in args.concurrency:
            for i in range(args.pairs):
                order = args.modes if i % 2 == 0 else args.modes[::-1]
                for mode in order:
                    got = measure(*targets[mode], c, args.seconds)
                    if got is not None:
                        runs.setdefault((mode, c), []).append(got)
                        print(f"pair {i} {mode:>7} c={c:<3} {got['throughput']:8.0f} infer/s "
                              f"{got['cpu_us_per_call']:6.0f} cpu us/call  batch "
                              f"{got['batch']:4.1f}", flush=True)  # fmt: skip
    print(f"{'mode':>5} {'c':>3} {'infer/s':>8} {'p50 us':>7} {'p99 us':>7} {'cpu us/call':>11} "
          f"{'batch':>5}")  # fmt: skip
    for c in args.concurrency:
        for mode in args.modes:
            point = runs.get((mode, c))
            if not point:
                print(f"{mode:>5} {c:>3} no stable measurement")
                continue
            med = {k: statistics.median(r[k] for r in point) for k in point[0]}
            print(f"{mode:>5} {c:>3} {med['throughput']:>8.0f} {med['p50_us']:>7.0f} "
                  f"{med['p99_us']:>7.0f} {med['cpu_us_per_call']:>11.0f} "
                  f"{med['batch']:>5.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
