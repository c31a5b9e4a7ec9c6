"""Issue 31: the daemon against NVIDIA's real Triton server, both driven by perf_analyzer.

Both serve the same ONNX file (the MLP 784-512-512-10 of ``tests/models.py``, as
``benchmarks/http_throughput.py`` makes it) with the same compute, on loopback:

* ours: ``python -m model_runtime.server`` (``model-runtime serve``),
  ``MODEL_RUNTIME_DEVICES=cpu:1x1`` (one device, one intra-op thread), one replica, batch 32,
  its defaults otherwise;
* triton: the ``tritonserver`` of the nvidia-pytriton wheel (``make triton-peer``), the python
  backend running ``peers/triton_model/model.py``: one instance, Triton's dynamic batcher
  (``max_batch_size`` 32, ``max_queue_delay_microseconds`` 0, its default), each batch ONE
  onnxruntime run with the session every peer gets (``peers/ort_session.py``: 1 intra-op thread).

Both are started, one after the other, on free loopback ports, and stay up; then, at each point
(protocol x concurrency), the runs alternate ours, Triton, ours, Triton (``--pairs`` pairs), so
drift on this 2-core machine hits both. The server not measured is idle: its CPU time during
each run is recorded (``idle_cpu_s``). Two load generators, each with the same settings for both:

* perf_analyzer (``tests/perf_analyzer.py``), HTTP and gRPC, ``--measurement-interval``
  ``--seconds`` x 1000 ms, stability ``--stability`` % over 3 windows, at most ``--max-trials``;
  batch 1, its random input data;
* our own (``benchmarks/loadgen.py``), HTTP/1.1 JSON only (it has no gRPC), closed loop, C
  keep-alive connections, every answer checked against onnxruntime's, ``--seconds`` x 3 per run
  after a short warm-up.

Writes ``benchmarks/results/triton_peer.json``: every run (throughput, p50/p99, CPU of both
servers, the perf_analyzer command), the medians and ours/Triton ratios per point, the commands
that started both servers, Triton's setup (layout, environment, config.pbtxt, what its stub
runs), versions, and the host's other busy processes before and after.

    .venv/bin/python benchmarks/triton_peer.py [--seconds 1] [--pairs 2] [--clients 1 16 64]
        [--protocols http grpc] [--tools perf_analyzer loadgen]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.loadgen import OK, request_bytes
from benchmarks.loadgen_pool import Client
from benchmarks.peers import servers, triton_server
from benchmarks.peers.ort_session import make_session
from benchmarks.peers.runs import (
    busy_processes,
    group_cpu_s,
    host_busy_s,
    pa_version,
    perf_analyzer_run,
    warm,
)
from benchmarks.peers.triton_server import Running
from tests import perf_analyzer
from tests.models import make_mlp, save

RESULTS = Path(__file__).parent / "results" / "triton_peer.json"
MODEL_NAME, INPUT, OUTPUT, WIDTH, CLASSES = "mlp", "x", "logits", 784, 10
BATCH = 32
ROWS = 64  # distinct samples for our load generator
SERVERS = ("ours", "triton")


@contextmanager
def ours(
    model: Path,
    workdir: Path,
    devices: str,
    *,
    ports: tuple[int, int] | None = None,
    options: tuple[str, ...] = (),
) -> Iterator[Running]:
    """This checkout's daemon on ``model``, HTTP and gRPC on ``ports`` (default: free loopback
    ports); ``options`` are added to its command line.

    Raises:
        servers.PeerUnavailable: it did not start (its log's tail).
    """
    http, grpc = ports or (servers.free_port(), servers.free_port())
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "model_runtime.server", "--host", "127.0.0.1",
        "--port", str(http), "--grpc-port", str(grpc), "--metrics-port", "0", "--no-access-log",
        "--log-format", "json",
        "--replicas", "1", "--batch-size", str(BATCH), "--executable-cache", str(workdir / "cache"),
        *options, f"{MODEL_NAME}={model}",
    ]  # fmt: skip
    env = {
        "MODEL_RUNTIME_DEVICES": devices,
        "MODEL_RUNTIME_DIR": str(workdir / "run"),  # device locks of its own
        "PYTHONUNBUFFERED": "1",
    }
    base = f"http://127.0.0.1:{http}"
    ready = f"{base}/v2/models/{MODEL_NAME}/ready"
    with triton_server.serve("ours", cmd, env, ready, workdir / "daemon.log") as proc:
        yield Running(
            proc=proc,
            http=f"127.0.0.1:{http}",
            grpc=f"127.0.0.1:{grpc}",
            version=version("model-runtime"),
            setup=f"model-runtime serve, devices {devices}, 1 replica, batch {BATCH}, defaults",
            command=tuple(cmd),
            extra={"env": env},
        )


def measure_loadgen(client: Client, c: int, args: argparse.Namespace) -> dict[str, Any]:
    """One closed-loop run of our load generator (after a short warm-up)."""
    warm = client.closed_loop(c, min(1.0, args.seconds))
    seconds = 3 * args.seconds
    rec = client.closed_loop(c, seconds)
    ok = rec.count(OK)
    lat = rec.latency(OK) * 1e6
    return {
        "per_s": ok / seconds,
        "p50_us": float(np.percentile(lat, 50)) if ok else None,
        "p99_us": float(np.percentile(lat, 99)) if ok else None,
        "answered_ok": ok,
        "errors": int(len(rec.kind) - ok),
        "generator_cpu_s": warm.cpu_s + rec.cpu_s,
    }


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (tool, protocol, clients), in the order run: each server's median, ours/Triton,
    the pairs' ratios."""
    rows = []
    keys = list(dict.fromkeys((r["tool"], r["protocol"], r["clients"]) for r in runs))
    for tool, protocol, c in keys:
        at = [r for r in runs if (r["tool"], r["protocol"], r["clients"]) == (tool, protocol, c)]
        row: dict[str, Any] = {"tool": tool, "protocol": protocol, "clients": c}
        for name in SERVERS:
            mine = [r for r in at if r["server"] == name and r.get("per_s")]
            row[f"{name}_per_s"] = statistics.median(r["per_s"] for r in mine) if mine else None
            for q in ("p50_us", "p99_us"):
                vals = [r[q] for r in mine if r.get(q) is not None]
                row[f"{name}_{q}"] = statistics.median(vals) if vals else None
            # CPU cores the server kept busy (its CPU seconds over the run's wall time)
            cores = [r["server_cpu_s"] / r["wall_s"] for r in mine if r.get("wall_s")]
            row[f"{name}_cores"] = round(statistics.median(cores), 2) if cores else None
        o, t = row["ours_per_s"], row["triton_per_s"]
        row["ratio"] = o / t if o and t else None
        by_pair: dict[int, dict[str, float]] = {}
        for r in at:
            if r.get("per_s"):
                by_pair.setdefault(r["pair"], {})[r["server"]] = r["per_s"]
        row["pair_ratios"] = [
            p["ours"] / p["triton"] for _, p in sorted(by_pair.items()) if len(p) == 2
        ]
        row["errors"] = [r["error"].splitlines()[0] for r in at if r.get("error")]
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'tool':<14} {'proto':<5} {'C':>3} {'ours/s':>9} {'triton/s':>9} {'ours/tri':>8} "
        f"{'ours p50us':>10} {'tri p50us':>10} {'cores o/t':>10}  pairs"
    )

    def f(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for r in rows:
        cores = f"{f(r['ours_cores'], '.2f')}/{f(r['triton_cores'], '.2f')}"
        print(
            f"{r['tool']:<14} {r['protocol']:<5} {r['clients']:>3} {f(r['ours_per_s'], '9.0f')} "
            f"{f(r['triton_per_s'], '9.0f')} {f(r['ratio'], '8.2f')} "
            f"{f(r['ours_p50_us'], '10.0f')} {f(r['triton_p50_us'], '10.0f')} {cores:>10}  "
            + " ".join(f"{x:.2f}" for x in r["pair_ratios"]),
            flush=True,
        )


def _record(
    doc: dict[str, Any], live: dict[str, Running], name: str, measure: Any, **point: Any
) -> None:
    """Run ``measure()`` against ``name``, with the CPU time around it of both servers, of the
    load generator (perf_analyzer: a child; ours: its workers' own count), and of everything
    else on the machine (``foreign_cpu_s``: not zero when the host was not quiet)."""
    before = {n: group_cpu_s(s.proc.pid) for n, s in live.items()}
    host0, mine0, t0 = host_busy_s(), os.times(), time.monotonic()
    result = measure()
    wall = time.monotonic() - t0
    host1, mine1 = host_busy_s(), os.times()
    after = {n: group_cpu_s(s.proc.pid) for n, s in live.items()}
    other = [n for n in live if n != name]
    run = {"server": name, **point, **result, "wall_s": round(wall, 2)}
    run["server_cpu_s"] = round(after[name] - before[name], 2)
    run["idle_cpu_s"] = round(after[other[0]] - before[other[0]], 2) if other else None
    own = sum(mine1[:4]) - sum(mine0[:4])  # this process and its waited children
    generator = own + result.get("generator_cpu_s", 0.0)
    servers_s = sum(after[n] - before[n] for n in live)
    run["generator_cpu_s"] = round(generator, 2)
    run["foreign_cpu_s"] = round(max(0.0, host1 - host0 - servers_s - generator), 2)
    doc["runs"].append(run)
    figure = "FAILED" if run.get("per_s") is None else f"{run['per_s']:8.0f}/s"
    print(
        f"  {point['tool']:<13} {point['protocol']:<4} c={point['clients']:<3} "
        f"pair {point['pair']} {name:<6} {figure} (cpu s: server {run['server_cpu_s']}, idle "
        f"peer {run['idle_cpu_s']}, generator {run['generator_cpu_s']}, foreign "
        f"{run['foreign_cpu_s']}, wall {run['wall_s']})",
        flush=True,
    )


def perf_analyzer_phase(
    doc: dict[str, Any], live: dict[str, Running], args: argparse.Namespace
) -> None:
    """Each protocol (after a warm-up of each server), each concurrency: ``--pairs`` times
    ours then Triton."""
    for protocol in args.protocols:
        for srv in live.values():
            warm(srv, MODEL_NAME, protocol)
        for c in args.clients:
            for pair in range(args.pairs):
                for name in live:
                    _record(
                        doc, live, name,
                        lambda n=name, p=protocol, c=c: perf_analyzer_run(
                            live[n], MODEL_NAME, p, c, args),
                        tool="perf_analyzer", protocol=protocol, clients=c, pair=pair,
                    )  # fmt: skip
            _write(doc)


def loadgen_phase(
    doc: dict[str, Any],
    live: dict[str, Running],
    stack: ExitStack,
    rows: np.ndarray,
    expected: np.ndarray,
    args: argparse.Namespace,
) -> None:
    """Our load generator over HTTP JSON, one client per server (closed with ``stack``), each
    concurrency: ``--pairs`` times ours then Triton."""
    clients = {}
    for name, srv in live.items():
        host, port = srv.http.split(":")
        path = f"/v2/models/{MODEL_NAME}/infer"
        reqs = [request_bytes(host, int(port), path, _json_body(r)) for r in rows]
        clients[name] = stack.enter_context(_client(host, int(port), reqs, expected, args))
    for c in args.clients:
        for pair in range(args.pairs):
            for name in live:
                _record(
                    doc, live, name,
                    lambda n=name, c=c: measure_loadgen(clients[n], c, args),
                    tool="loadgen", protocol="http", clients=c, pair=pair,
                )  # fmt: skip
        _write(doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="perf_analyzer window (s)")
    parser.add_argument("--pairs", type=int, default=2, help="ours/Triton runs per point")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    parser.add_argument("--tools", nargs="+", default=["perf_analyzer", "loadgen"])
    # perf_analyzer's own default is 10 %: on two cores shared with the tool, 4 of 24 runs
    # (both servers, mostly gRPC) missed it in 6 windows even on a quiet host.
    parser.add_argument("--stability", type=int, default=20, help="perf_analyzer -s (%%)")
    parser.add_argument("--max-trials", type=int, default=6, help="perf_analyzer -r")
    parser.add_argument("--devices", default="cpu:1x1", help="our MODEL_RUNTIME_DEVICES")
    parser.add_argument("--threads", type=int, default=1, help="Triton model's intra-op threads")
    parser.add_argument("--max-queue-delay-us", type=int, default=0, help="Triton's batcher")
    parser.add_argument("--loadgen-processes", type=int, default=1)
    args = parser.parse_args()
    started = time.monotonic()
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": len(os.sched_getaffinity(0)),
        "model": "mlp 784-512-512-10 (tests/models.make_mlp), ONNX, dynamic batch",
        "seconds": args.seconds,
        "pairs": args.pairs,
        "clients": args.clients,
        "protocols": args.protocols,
        "perf_analyzer": {
            "flags": f"-b 1 (default), --measurement-interval {int(args.seconds * 1000)}, "
            f"-s {args.stability}, -r {args.max_trials}, random input data (default)",
            "version": pa_version(),
        },
        "loadgen": {
            "protocol": "HTTP/1.1 JSON only (benchmarks/loadgen.py has no gRPC)",
            "processes": args.loadgen_processes,
            "seconds": 3 * args.seconds,
        },
        "host_busy_before": busy_processes(),
        "loadavg_before": os.getloadavg(),
        "servers": {},
        "skipped": [],
        "runs": [],
        "rows": [],
    }
    print(f"{doc['cores']} cores; other busy processes: {doc['host_busy_before'] or 'none'}")
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="mr-triton-peer-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        model = save(make_mlp(), work / "mlp.onnx")
        expected = make_session(str(model), 1).run([OUTPUT], {INPUT: rows})[0]
        launch = {
            "ours": lambda: ours(model, work / "ours", args.devices),
            "triton": lambda: triton_server.triton(
                model, MODEL_NAME, work / "triton", threads=args.threads,
                max_batch_size=BATCH, max_queue_delay_us=args.max_queue_delay_us,
                io=(INPUT, WIDTH, OUTPUT, CLASSES),
            ),
        }  # fmt: skip
        live: dict[str, Running] = {}
        for name in SERVERS:  # one at a time: each is ready before the next starts
            try:
                srv = stack.enter_context(launch[name]())
            except servers.PeerUnavailable as exc:
                doc["skipped"].append({"what": name, "why": str(exc)})
                print(f"SKIPPED {name}: {exc}", flush=True)
                continue
            live[name] = srv
            doc["servers"][name] = {
                "version": srv.version,
                "setup": srv.setup,
                "command": list(srv.command),
                **srv.extra,
            }
            print(f"{name} {srv.version}: {srv.setup}", flush=True)
        idle0 = {n: group_cpu_s(s.proc.pid) for n, s in live.items()}
        time.sleep(2.0)
        doc["idle_cpu_pct_at_rest"] = {
            n: round(100 * (group_cpu_s(s.proc.pid) - idle0[n]) / 2.0, 1) for n, s in live.items()
        }
        if "perf_analyzer" in args.tools and perf_analyzer.command() is None:
            doc["skipped"].append({"what": "perf_analyzer", "why": "not installed (make peers)"})
        elif "perf_analyzer" in args.tools:
            perf_analyzer_phase(doc, live, args)
        if "loadgen" in args.tools and "http" in args.protocols:
            loadgen_phase(doc, live, stack, rows, expected, args)
    doc["host_busy_after"] = busy_processes()
    doc["loadavg_after"] = os.getloadavg()
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    _write(doc)
    print_table(doc["rows"])
    print(f"wrote {RESULTS} ({doc['elapsed_s']:.0f} s)")


def _json_body(row: np.ndarray) -> bytes:
    tensor = {"name": INPUT, "datatype": "FP32", "shape": [1, WIDTH], "data": row.tolist()}
    return orjson.dumps({"inputs": [tensor]})


@contextmanager
def _client(
    host: str, port: int, reqs: list[bytes], expected: np.ndarray, args: argparse.Namespace
) -> Iterator[Client]:
    client = Client(host, port, reqs, list(expected), args.loadgen_processes)
    try:
        yield client
    finally:
        client.close()


def _write(doc: dict[str, Any]) -> None:
    doc["rows"] = summarize(doc["runs"])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
