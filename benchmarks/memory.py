"""What a model and a replica cost in memory: the daemon's resident set (issue 34).

The daemon (``MODEL_RUNTIME_DEVICES=cpu:2x1``, ``--batch-size 8``) serves ONNX MLPs
(``tests.models.make_mlp``), each model with weights of its own (seeds 0, 1, ...: equal copies
would share one session, which is not what a repository of different models costs):

* the issue's setup, MLP 784-512-512-10 (W = 2.55 MB): 1, 5 and 20 models of one replica, and
  one model with 1, 2 and 4 replicas;
* a large one, MLP 1024-4096-4096-10 (W = 80 MB), where the fixed costs of a model (its
  actors, an onnxruntime session's own structures: about 2.5 MB, measured) stop hiding what
  its weights cost: 1 and 3 models, and one model with 1 and 4 replicas.

Each point is ``--repeat`` fresh daemons (median reported: one daemon's resident set varies by
a few MB from run to run, more than the small W); once every model is ready and has answered
one request (checked against onnxruntime), the daemon's ``VmRSS`` is read, and the memory it
accounts for itself in ``/metrics`` (``model_runtime_model_memory_bytes``,
``model_runtime_replica_memory_bytes``). Reported in units of W: each model past the first,
``(RSS(most models) - RSS(1)) / (models - 1) / W`` (issue 34's target: <= 1.3), and each
replica past the first, ``(RSS(most replicas) - RSS(1)) / (replicas - 1) / W`` (<= 0.2).
Writes ``benchmarks/results/memory.json``.

    .venv/bin/python benchmarks/memory.py [--repeat 3] [--only small|large]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.peers import servers
from tests.models import make_mlp, save

RESULTS = Path(__file__).parent / "results" / "memory.json"
DEVICES = "cpu:2x1"
BATCH = 8


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's initializers (its weights)."""
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


def rss_bytes(pid: int) -> int:
    """The resident set of process ``pid`` in bytes."""
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no VmRSS for process {pid}")
    return int(match.group(1)) * 1024


def infer(base: str, name: str, x: np.ndarray) -> np.ndarray:
    """One JSON request to ``name``; its ``logits``."""
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}  # fmt: skip
    req = urllib.request.Request(
        f"{base}/v2/models/{name}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        doc = json.loads(resp.read())
    (out,) = doc["outputs"]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def metric_sums(base: str) -> dict[str, float]:
    """``/metrics``' memory gauges, summed by name and ``kind`` label."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    sums: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(
            r'^(model_runtime_(?:model|replica)_memory_bytes)\{.*kind="(\w+)".*\} (\S+)$', line
        )
        if m:
            key = f"{m.group(1)}:{m.group(2)}"
            sums[key] = sums.get(key, 0.0) + float(m.group(3))
    return sums


def point(paths: list[Path], models: int, replicas: int, workdir: Path) -> dict[str, Any]:
    """One fresh daemon with the first ``models`` models, ``replicas`` each: its RSS."""
    names = [f"mlp{i}" for i in range(models)]
    copies = [f"{name}={path}" for name, path in zip(names, paths, strict=False)]
    port = servers.free_port()
    run = workdir / f"daemon-{models}x{replicas}"
    run.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "model_runtime.server", "--port", str(port), "--grpc-port", "0",
        "--metrics-port", "0", "--no-access-log", "--log-format", "json",
        "--replicas", str(replicas),
        "--batch-size", str(BATCH), "--executable-cache", str(workdir / "cache"), *copies,
    ]  # fmt: skip
    env = {"MODEL_RUNTIME_DEVICES": DEVICES, "MODEL_RUNTIME_DIR": str(run / "locks")}
    base = f"http://127.0.0.1:{port}"
    sessions = [ort.InferenceSession(str(p)) for p in paths[:models]]
    width = sessions[0].get_inputs()[0].shape[1]
    x = np.random.default_rng(0).standard_normal((1, width)).astype(np.float32)
    wants = [s.run(None, {"x": x})[0] for s in sessions]
    del sessions
    with servers.serve("daemon", cmd, env, f"{base}/v2/health/ready", run / "daemon.log") as p:
        for name, want in zip(names, wants, strict=True):
            np.testing.assert_allclose(infer(base, name, x), want, rtol=1e-4, atol=1e-5)
        rss = rss_bytes(p.pid)
        accounted = metric_sums(base)
    return {"models": models, "replicas": replicas, "rss": rss, "metrics": accounted}


def _w(v: float | None) -> str:
    return "not measured" if v is None else f"{v:.2f} W"


#: name -> (layer sizes, model counts, replica counts)
SETUPS: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {
    "small": ((784, 512, 512, 10), (1, 5, 20), (1, 2, 4)),
    "large": ((1024, 4096, 4096, 10), (1, 3), (1, 4)),
}


def measure(name: str, repeat: int, workdir: Path) -> dict[str, Any]:
    """Every point of one setup (see :data:`SETUPS`) and the costs per model and replica."""
    sizes, model_counts, replica_counts = SETUPS[name]
    w = weight_bytes(make_mlp(sizes=sizes))
    folder = workdir / name
    (folder / "models").mkdir(parents=True)
    paths = [
        save(make_mlp(sizes=sizes, seed=i), folder / "models" / f"mlp{i}.onnx")
        for i in range(max(model_counts))
    ]
    rows: list[dict[str, Any]] = []
    points = [(m, 1) for m in model_counts] + [(1, r) for r in replica_counts if r != 1]
    for models, replicas in points:
        runs = [point(paths, models, replicas, folder) for _ in range(repeat)]
        runs.sort(key=lambda r: r["rss"])
        row = {**runs[len(runs) // 2], "rss_runs": [r["rss"] for r in runs]}
        rows.append(row)
        print(
            f"{name}: models {models:>3} replicas {replicas}: RSS {row['rss'] / 2**20:7.1f} MB "
            f"({row['rss'] / w:6.1f} W)",
            flush=True,
        )
    by = {(r["models"], r["replicas"]): r["rss"] for r in rows}
    m_hi, r_hi = max(model_counts), max(replica_counts)
    per_model = (by[(m_hi, 1)] - by[(1, 1)]) / (m_hi - 1) / w if m_hi > 1 else None
    per_replica = (by[(1, r_hi)] - by[(1, 1)]) / (r_hi - 1) / w if r_hi > 1 else None
    print(f"{name}: W = {w / 2**20:.2f} MB; past the first, each model {_w(per_model)}, each "
          f"replica {_w(per_replica)}", flush=True)  # fmt: skip
    return {
        "model": f"mlp {'-'.join(map(str, sizes))} (tests/models.make_mlp), ONNX, "
        "weights of its own per model",
        "weights_bytes": w,
        "rows": rows,
        "per_model_w": per_model,
        "per_replica_w": per_replica,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="daemons per point (median)")
    parser.add_argument("--only", choices=sorted(SETUPS), help="one setup only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mr-memory-bench-") as tmp:
        setups = {
            name: measure(name, args.repeat, Path(tmp))
            for name in SETUPS
            if args.only in (None, name)
        }
    doc = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": len(os.sched_getaffinity(0)),
        "devices": DEVICES,
        "batch": BATCH,
        "repeat": args.repeat,
        "setups": setups,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
