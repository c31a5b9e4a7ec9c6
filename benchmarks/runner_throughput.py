"""Runner throughput and latency against the raw backend, in one run.

For each model: the raw backend (the cpu backend, onnxruntime, the executable's main program at
its batch size B, back to back, with all the machine's cores as intra-op threads), then the
runtime (ModelRunner, one 1-thread replica per core, dynamic batching) with C concurrent callers
each sending single-sample requests; at C=1 the runtime uses one device with all the cores, as
the raw run does, so the latencies compare. Prints a table and writes JSON.

    .venv/bin/python benchmarks/runner_throughput.py [--seconds 3] [--callers 1 64 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.device.backends import make_backend
from actors.device.inventory import DeviceSpec
from actors.device.manager import DeviceManager
from model_runtime.compiler import CompileOptions, compile_model
from model_runtime.executable import Executable
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.models import light_model, make_mlp

RESULTS = Path(__file__).parent / "results" / "runner_throughput.json"


def raw_backend(exe: Executable, seconds: float, threads: int) -> dict[str, float]:
    """Samples/s and per-batch latency of the backend running full batches back to back."""
    backend = make_backend(DeviceSpec(id=0, kind="cpu", threads=threads))
    backend.load(exe, None)
    backend.run_load()
    meta = exe.metadata
    rng = np.random.default_rng(0)
    batch = {a.name: rng.standard_normal(a.shape).astype(a.dtype) for a in meta.user_inputs}
    batches = (batch,) * meta.device_iterations
    for _ in range(5):
        backend.run_main(batches)
    latencies = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        backend.run_main(batches)
        latencies.append(time.perf_counter() - t)
    backend.unload()
    samples = len(latencies) * meta.batch_size * meta.device_iterations
    return {
        "samples_per_s": samples / sum(latencies),
        "p50_us": statistics.median(latencies) * 1e6,
    }


async def runtime(path: Path, callers: int, seconds: float, replicas: int) -> dict[str, float]:
    """Samples/s and request latency with ``callers`` concurrent single-sample callers."""
    manager = None
    if callers == 1:
        # Latency is compared on equal terms: one device with all the cores as intra-op
        # threads, like the raw run (throughput uses one 1-thread replica per core).
        manager = DeviceManager(inventory=[DeviceSpec(id=0, kind="cpu", threads=replicas)])
        replicas = 1
    config = ModelRunnerConfig(
        replication_factor=replicas, batching_dim=0, timeout=0.00001, max_retries=0
    )
    async with ModelRunner(path, config, device_manager=manager) as runner:
        desc = runner.get_execute_inputs()
        rng = np.random.default_rng(1)
        one = {d.name: rng.standard_normal((1, *d.shape[1:])).astype(d.dtype) for d in desc}
        for _ in range(20):
            await runner.execute(one)
        latencies: list[float] = []
        stop = time.perf_counter() + seconds

        async def caller() -> None:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                await runner.execute(one)
                latencies.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(callers):
                tg.start_soon(caller)
        elapsed = time.perf_counter() - t0
    return {
        "samples_per_s": len(latencies) / elapsed,
        "p50_us": statistics.median(latencies) * 1e6,
        "p99_us": float(np.percentile(latencies, 99)) * 1e6,
    }


def compile_models(cache: Path) -> list[tuple[str, Path]]:
    mlp = compile_model(
        make_mlp(sizes=(784, 512, 512, 10)),
        cache / "mlp.mrx",
        CompileOptions(batch_size=32, model_name="mlp-784-512-512-10"),
    )
    conv = compile_model(
        light_model("squeezenet"),
        cache / "squeezenet.mrx",
        CompileOptions(batch_size=8, model_name="squeezenet"),
    )
    return [("mlp 784-512-512-10 B=32", mlp), ("squeezenet (light) B=8", conv)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--callers", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--uvloop", action="store_true", help="run the runtime on uvloop")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    os.environ.setdefault("MODEL_RUNTIME_DEVICES", f"cpu:{cores}x1")
    os.environ.setdefault("MODEL_RUNTIME_DIR", tempfile.mkdtemp(prefix="mr-bench-"))
    backend_name = "uvloop" if args.uvloop else "asyncio"
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in compile_models(Path(tmp)):
            exe = Executable.load(path)
            raw = raw_backend(exe, args.seconds, threads=cores)
            for c in args.callers:
                rt = anyio.run(
                    runtime,
                    path,
                    c,
                    args.seconds,
                    cores,
                    backend_options={"use_uvloop": args.uvloop},
                )
                rows.append(
                    {
                        "model": name,
                        "callers": c,
                        "raw_samples_per_s": raw["samples_per_s"],
                        "raw_batch_p50_us": raw["p50_us"],
                        "runtime_samples_per_s": rt["samples_per_s"],
                        "runtime_p50_us": rt["p50_us"],
                        "runtime_p99_us": rt["p99_us"],
                        "ratio": rt["samples_per_s"] / raw["samples_per_s"],
                    }
                )
                r = rows[-1]
                print(
                    f"{name:28} C={c:<4} raw {r['raw_samples_per_s']:>9.0f}/s "
                    f"(batch p50 {r['raw_batch_p50_us']:>7.0f} us)  runtime "
                    f"{r['runtime_samples_per_s']:>9.0f}/s  ratio {r['ratio']:>5.2f}  "
                    f"p50 {r['runtime_p50_us']:>7.0f} us  p99 {r['runtime_p99_us']:>7.0f} us",
                    flush=True,
                )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"cores": cores, "loop": backend_name, "rows": rows}, indent=2) + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
