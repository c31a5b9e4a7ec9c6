"""Issue 43: the same python models (``model.py`` + ``config.pbtxt``) on the daemon and on
NVIDIA's real Triton server, both driven by perf_analyzer.

One model repository, written once in a temporary directory, is served by both servers:

* ``add_sub``: NVIDIA's python backend example as its README lays it out (``tests/repositories/
  python/add_sub``: FP32 [4] in, sum and difference out, ``max_batch_size`` 0, one KIND_CPU
  instance);
* ``ort_batch``: ``peers/triton_model/model.py`` (with ``peers/ort_session.py`` beside it), a
  python model that runs ONE onnxruntime session run (the MLP 784-512-512-10 of
  ``tests/models.py``, 1 intra-op thread) over the requests it is handed: ``max_batch_size``
  32, dynamic batching (``max_queue_delay_microseconds`` 0), one KIND_CPU instance.

ours: ``python -m model_runtime.server --model-repository REPO`` (its defaults); triton: the
``tritonserver`` of the nvidia-pytriton wheel (``make triton-peer``), its defaults, metrics off.
Both are started one after the other on free loopback ports and stay up; at each point (model x
protocol x concurrency) the runs alternate ours, Triton (``--pairs`` pairs). perf_analyzer:
``--measurement-interval`` ``--seconds`` x 1000 ms, ``-s`` ``--stability`` %, at most
``--max-trials`` windows, batch 1, random data. Writes ``benchmarks/results/python_models.json``
(every run with both servers' CPU, medians and ours/Triton per point, the commands).

    .venv/bin/python benchmarks/python_models.py [--seconds 1] [--pairs 2] [--clients 1 16 64]
        [--protocols http grpc] [--models add_sub ort_batch]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peers import servers, triton_server
from benchmarks.peers.runs import (
    busy_processes,
    group_cpu_s,
    host_busy_s,
    pa_version,
    perf_analyzer_run,
    process_cpu_s,
    warm,
)
from benchmarks.peers.triton_server import Running
from tests import perf_analyzer
from tests.models import make_mlp, save

RESULTS = Path(__file__).parent / "results" / "python_models.json"
ADD_SUB = servers.REPO / "tests" / "repositories" / "python" / "add_sub"
MODELS = ("add_sub", "ort_batch")
SERVERS = ("ours", "triton")


def write_repository(root: Path, work: Path) -> Path:
    """The repository both servers serve: ``add_sub`` and ``ort_batch`` (over an MLP written
    into ``work``)."""
    shutil.copytree(ADD_SUB, root / "add_sub")
    onnx = save(make_mlp(), work / "mlp.onnx")
    triton_server.write_repository(
        root, "ort_batch", onnx, threads=1, max_batch_size=32, max_queue_delay_us=0,
        io=("x", 784, "logits", 10),
    )  # fmt: skip
    return root


@contextmanager
def ours(repo: Path, workdir: Path) -> Iterator[Running]:
    """This checkout's daemon on ``repo``, its defaults.

    Raises:
        servers.PeerUnavailable: it did not start (its log's tail).
    """
    http, grpc = servers.free_port(), servers.free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "model_runtime.server", "--host", "127.0.0.1",
        "--port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(servers.free_port()),
        "--no-access-log", "--log-format", "json",
        "--executable-cache", str(workdir / "cache"), "--model-repository", str(repo),
    ]  # fmt: skip
    env = {"MODEL_RUNTIME_DIR": str(workdir / "run"), "PYTHONUNBUFFERED": "1"}
    ready = f"http://127.0.0.1:{http}/v2/models/ort_batch/ready"
    with triton_server.serve("ours", cmd, env, ready, workdir / "daemon.log") as proc:
        yield Running(
            proc=proc, http=f"127.0.0.1:{http}", grpc=f"127.0.0.1:{grpc}",
            version=version("model-runtime"), setup="model-runtime serve --model-repository, "
            "defaults", command=tuple(cmd), extra={"env": env},
        )  # fmt: skip


@contextmanager
def triton(repo: Path, workdir: Path) -> Iterator[Running]:
    """Triton on ``repo``, its defaults, metrics off.

    Raises:
        servers.PeerUnavailable: the peer is not made, or Triton did not start.
    """
    lay = triton_server.layout()
    workdir.mkdir(parents=True, exist_ok=True)
    http, grpc = servers.free_port(), servers.free_port()
    cmd = [
        lay["tritonserver"], "--model-repository", str(repo),
        "--backend-directory", lay["backend_directory"],
        "--cache-directory", lay["cache_directory"],
        "--http-address", "127.0.0.1", "--http-port", str(http),
        "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc),
        "--allow-metrics", "false", "--allow-gpu-metrics", "false", "--allow-cpu-metrics", "false",
        "--strict-readiness", "true", "--exit-on-error", "true",
    ]  # fmt: skip
    env = {
        "PATH": os.pathsep.join([*lay["path"], os.environ.get("PATH", "")]),
        "LD_LIBRARY_PATH": os.pathsep.join(
            [*lay["ld_library_path"], *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        ),
    }
    base = f"http://127.0.0.1:{http}"
    with triton_server.serve("triton", cmd, env, f"{base}/v2/health/ready", workdir / "t.log") as p:
        yield Running(
            proc=p, http=f"127.0.0.1:{http}", grpc=f"127.0.0.1:{grpc}",
            version=triton_server.server_version(base),
            setup=f"tritonserver (nvidia-pytriton {lay['versions']['nvidia-pytriton']}), python "
            "backend, its defaults, metrics off", command=tuple(cmd), extra={"env": env},
        )  # fmt: skip


def record(doc: dict[str, Any], live: dict[str, Running], name: str, **point: Any) -> None:
    """Measure ``name`` at ``point``, with the CPU seconds of both servers around it."""
    pid = live[name].proc.pid
    before, lead0 = group_cpu_s(pid), process_cpu_s(pid)
    host0, t0 = host_busy_s(), time.monotonic()
    result = perf_analyzer_run(
        live[name], point["model"], point["protocol"], point["clients"], doc["_args"]
    )
    wall = time.monotonic() - t0
    run = {"server": name, **point, **result, "wall_s": round(wall, 2)}
    run["server_cpu_s"] = round(group_cpu_s(pid) - before, 2)
    # the server process itself (front ends, batching); the rest is its instance processes
    run["front_cpu_s"] = round(process_cpu_s(pid) - lead0, 2)
    run["host_busy_s"] = round(host_busy_s() - host0, 2)
    doc["runs"].append(run)
    figure = "FAILED" if run.get("per_s") is None else f"{run['per_s']:8.0f}/s"
    print(
        f"  {point['model']:<9} {point['protocol']:<4} c={point['clients']:<3} pair "
        f"{point['pair']} {name:<6} {figure} (server cpu {run['server_cpu_s']} s, host busy "
        f"{run['host_busy_s']} s, wall {run['wall_s']} s)",
        flush=True,
    )


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, protocol, clients): each server's median, ours/Triton, the pairs' ratios."""
    rows = []
    keys = list(dict.fromkeys((r["model"], r["protocol"], r["clients"]) for r in runs))
    for model, protocol, c in keys:
        at = [r for r in runs if (r["model"], r["protocol"], r["clients"]) == (model, protocol, c)]
        row: dict[str, Any] = {"model": model, "protocol": protocol, "clients": c}
        for name in SERVERS:
            mine = [r for r in at if r["server"] == name and r.get("per_s")]
            row[f"{name}_per_s"] = statistics.median(r["per_s"] for r in mine) if mine else None
            p50 = [r["p50_us"] for r in mine]
            row[f"{name}_p50_us"] = statistics.median(p50) if p50 else None
            # CPU microseconds per inference: all the server's processes, the server process
            # itself (front ends, batching), the instance processes
            for key, of in (("cpu_us", "server_cpu_s"), ("front_cpu_us", "front_cpu_s")):
                per = [1e6 * r[of] / (r["per_s"] * r["wall_s"]) for r in mine if r.get("wall_s")]
                row[f"{name}_{key}"] = round(statistics.median(per)) if per else None
            total, front = row[f"{name}_cpu_us"], row[f"{name}_front_cpu_us"]
            row[f"{name}_instance_cpu_us"] = None if total is None else total - front
        o, t = row["ours_per_s"], row["triton_per_s"]
        row["ratio"] = o / t if o and t else None
        pairs: dict[int, dict[str, float]] = {}
        for r in at:
            if r.get("per_s"):
                pairs.setdefault(r["pair"], {})[r["server"]] = r["per_s"]
        row["pair_ratios"] = [
            p["ours"] / p["triton"] for _, p in sorted(pairs.items()) if len(p) == 2
        ]
        row["errors"] = [r["error"] for r in at if r.get("error")]
        rows.append(row)
    return rows


def _write(doc: dict[str, Any]) -> None:
    doc["rows"] = summarize(doc["runs"])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    out = {k: v for k, v in doc.items() if not k.startswith("_")}
    RESULTS.write_text(json.dumps(out, indent=2, default=str) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="perf_analyzer window (s)")
    parser.add_argument("--pairs", type=int, default=2, help="ours/Triton runs per point")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    # -s 20 (issue 31's) missed stability in 6 windows on this shared 2-core host, both servers
    parser.add_argument("--stability", type=int, default=30, help="perf_analyzer -s (%%)")
    parser.add_argument("--max-trials", type=int, default=6, help="perf_analyzer -r")
    args = parser.parse_args()
    started = time.monotonic()
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": len(os.sched_getaffinity(0)),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "models": {
            "add_sub": "NVIDIA's add_sub example (tests/repositories/python/add_sub): FP32 [4] "
            "in, sum and difference out, max_batch_size 0, 1 KIND_CPU instance",
            "ort_batch": "peers/triton_model/model.py: one onnxruntime run (MLP 784-512-512-10, "
            "1 intra-op thread) over the requests of each execute; max_batch_size 32, dynamic "
            "batching, max_queue_delay 0, 1 KIND_CPU instance",
        },
        "seconds": args.seconds,
        "pairs": args.pairs,
        "perf_analyzer": {
            "flags": f"-b 1, --measurement-interval {int(args.seconds * 1000)}, "
            f"-s {args.stability}, -r {args.max_trials}, random input data",
            "version": pa_version(),
        },
        "host_busy_before": busy_processes(),
        "servers": {},
        "skipped": [],
        "runs": [],
        "_args": args,
    }
    print(f"{doc['cores']} cores; other busy processes: {doc['host_busy_before'] or 'none'}")
    with tempfile.TemporaryDirectory(prefix="mr-python-models-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        repo = write_repository(work / "repository", work)
        live: dict[str, Running] = {}
        launch = {
            "ours": lambda: ours(repo, work / "ours"),
            "triton": lambda: triton(repo, work / "triton"),
        }
        for name in SERVERS:
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
            }
            print(f"{name} {srv.version}: {srv.setup}", flush=True)
        if perf_analyzer.command() is None:
            doc["skipped"].append({"what": "perf_analyzer", "why": "not installed (make peers)"})
        else:
            for model in args.models:
                for protocol in args.protocols:
                    for srv in live.values():
                        warm(srv, model, protocol)
                    for c in args.clients:
                        for pair in range(args.pairs):
                            for name in live:
                                record(
                                    doc,
                                    live,
                                    name,
                                    model=model,
                                    protocol=protocol,
                                    clients=c,
                                    pair=pair,
                                )
                        _write(doc)
    doc["host_busy_after"] = busy_processes()
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    _write(doc)
    for r in doc["rows"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(
            f"{r['model']:<9} {r['protocol']:<4} c={r['clients']:<3} ours {r['ours_per_s']} "
            f"triton {r['triton_per_s']} ours/triton {ratio}; CPU us/inf (server+instances) "
            f"ours {r['ours_front_cpu_us']}+{r['ours_instance_cpu_us']}, triton "
            f"{r['triton_front_cpu_us']}+{r['triton_instance_cpu_us']}"
        )
    print(f"wrote {RESULTS} ({doc['elapsed_s']:.0f} s)")


if __name__ == "__main__":
    main()
