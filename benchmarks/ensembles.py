"""Issue 47: an ensemble of three steps (python pre-processing -> an ONNX classifier -> python
post-processing: NVIDIA's python backend ``preprocessing`` example in small,
``tests/repositories/ensemble``) on the daemon and on NVIDIA's real Triton server, both driven
by perf_analyzer.

The daemon serves the pipeline as the tests do, its classifier an ONNX model; Triton serves the
same ensemble config and the same ``model.py`` files, its classifier step a python model running
the same ONNX through onnxruntime (``peers/triton_model/model.py``: Triton here has no
onnxruntime backend). The images are flat (``INPUT`` UINT8 [48], the classifier's input FP32
[48]) so one config serves both and perf_analyzer needs no shapes. Both servers start one after
the other and stay up; at each point (protocol x concurrency) the runs alternate ours, Triton
(``--pairs`` pairs), as ``benchmarks/python_models.py`` does (its measuring and summary are
reused). Writes ``benchmarks/results/ensembles.json``.

    .venv/bin/python benchmarks/ensembles.py [--seconds 1] [--pairs 2] [--clients 1 16 64]
        [--protocols http grpc]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import python_models
from benchmarks.peers import servers, triton_server
from benchmarks.peers.runs import busy_processes, pa_version, warm
from benchmarks.peers.triton_server import Running
from tests import perf_analyzer
from tests.ensemble_models import CLASSIFIER_WEIGHTS, PIPELINE
from tests.models import OPSET, save

RESULTS = Path(__file__).parent / "results" / "ensembles.json"
PIPELINE_DIR = servers.REPO / "tests" / "repositories" / "ensemble"
CLASSIFIER = "resnet50_trt"


def flat_classifier() -> onnx.ModelProto:
    """``input`` FP32 [batch, 48] -> ``output`` FP32 [batch, 10] (the tests' weights)."""
    w, b = CLASSIFIER_WEIGHTS
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "W", "B"], ["output"])],
        "classifier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 48])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def _flatten(repo: Path) -> None:
    """The pipeline with flat images: the same files, the shapes [48]."""
    pre = repo / "preprocess"
    config = (pre / "config.pbtxt").read_text()
    (pre / "config.pbtxt").write_text(config.replace("dims: [ -1 ]", "dims: [ 48 ]").replace(
        "dims: [ 3, 4, 4 ]", "dims: [ 48 ]"))  # fmt: skip
    code = (pre / "1" / "model.py").read_text()
    flat = "(images / 255.0 - 0.5).reshape(len(images), -1)"
    (pre / "1" / "model.py").write_text(code.replace("images / 255.0 - 0.5", flat))
    ensemble = repo / PIPELINE / "config.pbtxt"
    ensemble.write_text(ensemble.read_text().replace("dims: [ -1 ]", "dims: [ 48 ]"))


def write_repositories(work: Path) -> tuple[Path, Path]:
    """(ours, Triton's): the flat pipeline; the classifier ONNX in ours, a python model over
    the same ONNX in Triton's."""
    onnx_path = save(flat_classifier(), work / "classifier.onnx")
    repos = []
    for name in ("ours", "triton"):
        repo = work / f"repository-{name}"
        shutil.copytree(PIPELINE_DIR, repo)
        _flatten(repo)
        repos.append(repo)
    ours_repo, triton_repo = repos
    (ours_repo / CLASSIFIER / "1").mkdir(parents=True)
    shutil.copy(onnx_path, ours_repo / CLASSIFIER / "1" / "model.onnx")
    (ours_repo / CLASSIFIER / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "input" data_type: TYPE_FP32 dims: [ 48 ] } ]\n'
        'output [ { name: "output" data_type: TYPE_FP32 dims: [ 10 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 0 }\n"
    )
    triton_server.write_repository(
        triton_repo, CLASSIFIER, onnx_path, threads=1, max_batch_size=8, max_queue_delay_us=0,
        io=("input", 48, "output", 10),
    )  # fmt: skip
    return ours_repo, triton_repo


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
    ready = f"http://127.0.0.1:{http}/v2/models/{PIPELINE}/ready"
    with triton_server.serve("ours", cmd, env, ready, workdir / "daemon.log") as proc:
        yield Running(
            proc=proc, http=f"127.0.0.1:{http}", grpc=f"127.0.0.1:{grpc}",
            version=version("model-runtime"), setup="model-runtime serve --model-repository, "
            "defaults", command=tuple(cmd), extra={"env": env},
        )  # fmt: skip


def _write(doc: dict[str, Any]) -> None:
    doc["rows"] = python_models.summarize(doc["runs"])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    out = {k: v for k, v in doc.items() if not k.startswith("_")}
    RESULTS.write_text(json.dumps(out, indent=2, default=str) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="perf_analyzer window (s)")
    parser.add_argument("--pairs", type=int, default=2, help="ours/Triton runs per point")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    parser.add_argument("--stability", type=int, default=30, help="perf_analyzer -s (%%)")
    parser.add_argument("--max-trials", type=int, default=6, help="perf_analyzer -r")
    args = parser.parse_args()
    started = time.monotonic()
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": len(os.sched_getaffinity(0)),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "models": {
            PIPELINE: "python preprocess (48 raw pixels -> 48 floats) -> classifier (48 -> 10: "
            "ours ONNX, Triton a python model running the same ONNX with onnxruntime, 1 "
            "thread) -> python postprocess (top class and label); max_batch_size 8 everywhere"
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
    with tempfile.TemporaryDirectory(prefix="mr-ensembles-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        ours_repo, triton_repo = write_repositories(work)
        live: dict[str, Running] = {}
        launch = {
            "ours": lambda: ours(ours_repo, work / "ours"),
            "triton": lambda: python_models.triton(triton_repo, work / "triton"),
        }
        for name in python_models.SERVERS:
            try:
                srv = stack.enter_context(launch[name]())
            except servers.PeerUnavailable as exc:
                doc["skipped"].append({"what": name, "why": str(exc)})
                print(f"SKIPPED {name}: {exc}", flush=True)
                continue
            live[name] = srv
            doc["servers"][name] = {"version": srv.version, "setup": srv.setup}
            print(f"{name} {srv.version}: {srv.setup}", flush=True)
        if perf_analyzer.command() is None:
            doc["skipped"].append({"what": "perf_analyzer", "why": "not installed (make peers)"})
        else:
            for protocol in args.protocols:
                for srv in live.values():
                    warm(srv, PIPELINE, protocol)
                for c in args.clients:
                    for pair in range(args.pairs):
                        for name in live:
                            point = {"model": PIPELINE, "protocol": protocol, "clients": c}
                            python_models.record(doc, live, name, **point, pair=pair)
                    _write(doc)
    doc["host_busy_after"] = busy_processes()
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    _write(doc)
    for r in doc["rows"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(
            f"{r['protocol']:<4} c={r['clients']:<3} ours {r['ours_per_s']} triton "
            f"{r['triton_per_s']} ours/triton {ratio}"
        )
    print(f"wrote {RESULTS} ({doc['elapsed_s']:.0f} s)")


if __name__ == "__main__":
    main()
