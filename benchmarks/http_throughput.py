"""HTTP: the daemon vs MLServer vs KServe's Python server, same model, same load generator.

DESIGN §13, issue 13: every server serves the same ONNX file (the MLP 784-512-512-10 of
``tests/models.py``) with the same onnxruntime session (``peers/ort_session.py``: 1 intra-op
thread, spinning off) on loopback, no per-request logging:

* daemon: this checkout's ``model_runtime.server`` (devices ``cpu:1x1``, one replica, batch 32,
  its default batch timeout);
* mlserver: MLServer with a custom runtime (``peers/mlserver_runtime.py``) and its adaptive
  batching, max_batch_size 32, max_batch_time 2 ms;
* kserve: KServe's ``ModelServer`` with a ``kserve.Model`` running onnxruntime per request
  (``peers/kserve_server.py``).

The peers run from their own virtual environments (``make peers``); a peer whose venv is missing
or that fails to start is skipped, and the report says why. The load generator: C concurrent
clients (one keep-alive connection each, raw HTTP/1.1 on asyncio streams, prebuilt requests:
an HTTP client library cost more per request than the servers it measured, on the same two
cores), each sending single-sample v2 requests back to back for
``--seconds``, JSON, then binary (the v2 binary tensor extension, where the server supports it
over HTTP: MLServer does not). Every answer is checked against onnxruntime's own output for
that row; a wrong or failed answer is counted as an error, not as throughput. Prints a table with
daemon/peer ratios and writes ``benchmarks/results/http_throughput.json`` (after each server, so a
failure later keeps what was measured).

    .venv/bin/python benchmarks/http_throughput.py [--seconds 4] [--clients 1 16 64]
        [--servers daemon mlserver kserve] [--modes json binary] [--client-processes 1]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import multiprocessing
import os
import sys
import tempfile
import time
import traceback
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))

from benchmarks.peers import servers
from benchmarks.peers.ort_session import make_session
from tests.models import make_mlp, save

RESULTS = Path(__file__).parent / "results" / "http_throughput.json"
MODEL_NAME = "mlp"
INPUT, OUTPUT = "x", "logits"
ROWS = 64  # distinct samples, cycled through by the clients
RTOL, ATOL = 1e-4, 1e-4

Request = tuple[bytes, dict[str, str]]


def make_requests(rows: np.ndarray, mode: str) -> list[Request]:
    """One single-sample v2 request per row, JSON or binary."""
    out: list[Request] = []
    for row in rows:
        x = np.ascontiguousarray(row[None, :], dtype=np.float32)
        tensor: dict[str, Any] = {"name": INPUT, "datatype": "FP32", "shape": list(x.shape)}
        if mode == "json":
            tensor["data"] = x.ravel().tolist()
            body = orjson.dumps({"inputs": [tensor]})
            out.append((body, {"Content-Type": "application/json"}))
        else:
            tensor["parameters"] = {"binary_data_size": x.nbytes}
            head = orjson.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}})
            out.append(
                (
                    head + x.tobytes(),
                    {
                        "Content-Type": "application/octet-stream",
                        "Inference-Header-Content-Length": str(len(head)),
                    },
                )
            )
    return out


def decode_output(body: bytes, header_length: str | None) -> np.ndarray:
    """The flat FP32 values of output ``OUTPUT`` in a v2 answer (JSON or binary).

    Raises:
        KeyError, ValueError: the answer is not a v2 answer with that output.
    """
    n = len(body) if header_length is None else int(header_length)
    doc = orjson.loads(body[:n])
    offset = n
    for out in doc["outputs"]:
        size = (out.get("parameters") or {}).get("binary_data_size")
        if out["name"] == OUTPUT:
            if size is None:
                return np.asarray(out["data"], dtype=np.float32).ravel()
            return np.frombuffer(body[offset : offset + size], dtype=np.float32)
        offset += size or 0
    raise KeyError(f"no output {OUTPUT!r} in the answer")


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, dict[str, str], bytes]:
    """Send one prebuilt HTTP/1.1 request; its answer's status, headers (lower-case names) and
    body (``Content-Length`` or chunked)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while size := int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16):
            chunks.append((await reader.readexactly(size + 2))[:-2])
        await reader.readuntil(b"\r\n")  # the end of the (empty) trailers
        return int(status_line.split(" ", 2)[1]), headers, b"".join(chunks)
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split(" ", 2)[1]), headers, body


async def _load(
    url: str,
    clients: int,
    requests: list[Request],
    expected: np.ndarray,
    seconds: float,
    warmup: float,
    first: int,
) -> dict[str, Any]:
    """``clients`` concurrent clients for ``warmup`` then ``seconds``; checks every answer.

    Each client holds one keep-alive connection and sends prebuilt HTTP/1.1 requests on it, one
    at a time (no pipelining). Raw streams, not an HTTP client library: on this 2-core machine
    aiohttp's client spent more per request than the servers it measured, beside them.
    """
    target = urllib.parse.urlsplit(url)
    host, port = target.hostname or "127.0.0.1", target.port or 80
    raw = [
        b"".join(
            [
                f"POST {target.path} HTTP/1.1\r\nHost: {host}:{port}\r\n".encode(),
                *(f"{k}: {v}\r\n".encode() for k, v in headers.items()),
                f"Content-Length: {len(body)}\r\n\r\n".encode(),
                body,
            ]
        )
        for body, headers in requests
    ]
    latencies: list[float] = []
    errors = 0
    first_error = ""
    stop = 0.0

    async def client(k: int, counting: bool) -> None:
        nonlocal errors, first_error
        i = k
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                try:
                    status, headers, answer = await _exchange(reader, writer, raw[i % len(raw)])
                    if headers.get("connection", "").lower() == "close":
                        writer.close()
                        reader, writer = await asyncio.open_connection(host, port)
                    if status != 200:
                        raise ValueError(f"HTTP {status}: {answer[:200]!r}")
                    got = decode_output(answer, headers.get("inference-header-content-length"))
                    if not np.allclose(got, expected[i % len(raw)], rtol=RTOL, atol=ATOL):
                        raise ValueError(f"wrong answer for row {i % len(raw)}: {got[:4]}...")
                except Exception as exc:  # counted, never thrown: one bad answer must not end a run
                    if counting:
                        errors += 1
                        first_error = first_error or f"{type(exc).__name__}: {exc}"
                    if isinstance(exc, (OSError, asyncio.IncompleteReadError)):
                        writer.close()
                        reader, writer = await asyncio.open_connection(host, port)
                else:
                    if counting:
                        latencies.append(time.perf_counter() - t)
                i += clients
        finally:
            writer.close()

    for measuring, phase in ((False, warmup), (True, seconds)):
        stop = time.perf_counter() + phase
        t0 = time.perf_counter()
        await asyncio.gather(*(client(first + k, measuring) for k in range(clients)))
        elapsed = time.perf_counter() - t0
    return {
        "latencies": latencies,
        "elapsed": elapsed,
        "errors": errors,
        "first_error": first_error,
    }


def _run_load(*args: Any) -> dict[str, Any]:
    """One client process: its share of the clients, on uvloop where available."""
    try:
        import uvloop

        return uvloop.run(_load(*args))
    except ImportError:
        return asyncio.run(_load(*args))


def measure(
    url: str,
    clients: int,
    requests: list[Request],
    expected: np.ndarray,
    seconds: float,
    processes: int,
) -> dict[str, Any]:
    """Requests/s, p50/p99 and errors of ``clients`` clients, spread over ``processes``."""
    warmup = min(1.0, max(0.2, seconds / 4))
    procs = max(1, min(processes, clients))
    shares = [clients // procs + (k < clients % procs) for k in range(procs)]
    starts = [sum(shares[:k]) for k in range(procs)]
    if procs == 1:
        parts = [_run_load(url, clients, requests, expected, seconds, warmup, 0)]
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(procs, mp_context=ctx) as pool:
            futures = [
                pool.submit(_run_load, url, n, requests, expected, seconds, warmup, s)
                for n, s in zip(shares, starts, strict=True)
            ]
            parts = [f.result() for f in futures]
    lat = np.array([x for p in parts for x in p["latencies"]]) * 1e3
    elapsed = max(p["elapsed"] for p in parts)
    return {
        "req_per_s": len(lat) / elapsed,
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
        "requests": len(lat),
        "errors": sum(p["errors"] for p in parts),
        "first_error": next((p["first_error"] for p in parts if p["first_error"]), ""),
    }


def launchers(
    args: argparse.Namespace, model: Path, workdir: Path
) -> dict[str, Callable[[], AbstractContextManager[servers.Server]]]:
    return {
        "daemon": lambda: servers.daemon(
            model, MODEL_NAME, workdir / "daemon", args.daemon_devices, args.replicas, args.batch
        ),
        "mlserver": lambda: servers.mlserver(
            model,
            MODEL_NAME,
            workdir,
            args.threads,
            args.batch,
            args.max_batch_time_ms / 1e3,
            args.mlserver_workers,
        ),
        "kserve": lambda: servers.kserve(model, MODEL_NAME, workdir / "kserve", args.threads),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    """The rows, with daemon/peer throughput ratios at the same mode and clients."""
    daemon = {(r["mode"], r["clients"]): r["req_per_s"] for r in rows if r["server"] == "daemon"}
    print(
        f"{'server':<9} {'mode':<7} {'clients':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'errors':>6} {'daemon/this':>11}"
    )
    for r in rows:
        d = daemon.get((r["mode"], r["clients"]))
        ratio = (
            f"{d / r['req_per_s']:.2f}" if d and r["req_per_s"] and r["server"] != "daemon" else ""
        )
        print(
            f"{r['server']:<9} {r['mode']:<7} {r['clients']:>7} {r['req_per_s']:>9.0f} "
            f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['errors']:>6} {ratio:>11}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per point (after warm-up)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--servers", nargs="+", default=["daemon", "mlserver", "kserve"])
    parser.add_argument("--modes", nargs="+", default=["json", "binary"])
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads of the peers")
    parser.add_argument("--daemon-devices", default="cpu:1x1", help="MODEL_RUNTIME_DEVICES")
    parser.add_argument("--replicas", type=int, default=1, help="the daemon's replicas")
    parser.add_argument("--batch", type=int, default=32, help="batch size (MLServer's max)")
    parser.add_argument("--max-batch-time-ms", type=float, default=2.0, help="MLServer's")
    parser.add_argument("--mlserver-workers", type=int, default=1, help="parallel_workers")
    parser.add_argument("--client-processes", type=int, default=1, help="load generator processes")
    args = parser.parse_args()
    unknown = set(args.servers) - {"daemon", "mlserver", "kserve"}
    if unknown:
        parser.error(f"unknown servers: {sorted(unknown)}")

    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": len(os.sched_getaffinity(0)),
        "model": "mlp 784-512-512-10 (tests/models.make_mlp), ONNX, dynamic batch",
        "seconds": args.seconds,
        "clients": args.clients,
        "client_processes": args.client_processes,
        "threads": args.threads,
        "servers": {},
        "skipped": [],
        "rows": [],
    }
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((ROWS, 784)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="mr-http-bench-") as tmp:
        workdir = Path(tmp)
        model = save(make_mlp(), workdir / "mlp.onnx")
        expected = make_session(str(model), 1).run([OUTPUT], {INPUT: rows})[0]
        requests = {mode: make_requests(rows, mode) for mode in args.modes}
        launch = launchers(args, model, workdir)
        print(
            f"{doc['cores']} cores; {args.seconds} s per point; {args.client_processes} client "
            f"process(es); every answer checked",
            flush=True,
        )
        for name in args.servers:
            try:
                with launch[name]() as server:
                    doc["servers"][name] = {
                        "version": server.version,
                        "binary": server.binary,
                        "setup": server.setup,
                    }
                    print(f"{name} {server.version}: {server.setup}", flush=True)
                    for mode in args.modes:
                        if mode == "binary" and not server.binary:
                            reason = "no binary tensor extension over HTTP"
                            doc["skipped"].append({"server": name, "mode": mode, "why": reason})
                            print(f"  {name} {mode}: skipped ({reason})", flush=True)
                            continue
                        for c in args.clients:
                            r = measure(
                                server.url,
                                c,
                                requests[mode],
                                expected,
                                args.seconds,
                                args.client_processes,
                            )
                            row = {"server": name, "mode": mode, "clients": c, **r}
                            doc["rows"].append(row)
                            print(
                                f"  {name} {mode} {c:>3} clients: {r['req_per_s']:8.0f} req/s "
                                f"p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms "
                                f"errors {r['errors']} {r['first_error'][:120]}",
                                flush=True,
                            )
            except servers.PeerUnavailable as exc:
                doc["skipped"].append({"server": name, "mode": "all", "why": str(exc)})
                print(f"SKIPPED {name}: {exc}", flush=True)
            except Exception as exc:  # one server's failure keeps the others' results
                traceback.print_exc()
                doc["skipped"].append(
                    {"server": name, "mode": "all", "why": f"failed: {type(exc).__name__}: {exc}"}
                )
                print(f"FAILED {name}: {exc}", flush=True)
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print_table(doc["rows"])
    print(f"wrote {RESULTS}")
    if any(r["errors"] for r in doc["rows"]):
        print("WARNING: some answers were wrong or failed (column errors)")


if __name__ == "__main__":
    main()
