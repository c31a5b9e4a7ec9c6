"""HTTP throughput of the daemon vs in-process execute() (1-sample requests, demo model)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.test_daemon_support import MODEL, running, samples

DURATION = 3.0


def binary_body(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "pixels",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))}


async def load(url: str, conc: int, mode: str, x: np.ndarray) -> tuple[float, float, float]:
    lat: list[float] = []
    if mode == "json":
        body = json.dumps(
            {
                "inputs": [
                    {
                        "name": "pixels",
                        "datatype": "FP32",
                        "shape": [1, 64],
                        "data": x.ravel().tolist(),
                    }
                ]
            }
        ).encode()
        headers = {"Content-Type": "application/json"}
    else:
        body, headers = binary_body(x)
    stop = time.perf_counter() + DURATION
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as s:

        async def worker() -> None:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                async with s.post(url, data=body, headers=headers) as r:
                    await r.read()
                    assert r.status == 200
                lat.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        el = time.perf_counter() - t0
    a = np.array(lat) * 1e3
    return len(lat) / el, float(np.percentile(a, 50)), float(np.percentile(a, 99))


async def inproc(conc: int, x: np.ndarray, mrx: Path) -> tuple[float, float, float]:
    from model_runtime.runner import ModelRunner
    from model_runtime.runner_config import ModelRunnerConfig

    lat: list[float] = []
    async with ModelRunner(mrx, ModelRunnerConfig(batching_dim=0, timeout=0.002)) as r:
        stop = time.perf_counter() + DURATION

        async def worker() -> None:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                await r.execute({"pixels": x})
                lat.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        el = time.perf_counter() - t0
    a = np.array(lat) * 1e3
    return len(lat) / el, float(np.percentile(a, 50)), float(np.percentile(a, 99))


def main() -> None:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    px, _ = samples()
    x = np.ascontiguousarray(px[:1])
    tmp = Path("/tmp/mrbench/w")
    tmp.mkdir(parents=True, exist_ok=True)
    rows = []
    with running(tmp) as d:
        url = d.url(f"/v2/models/{MODEL}/infer")
        for mode in ("json", "binary"):
            for conc in (1, 16, 64):
                rows.append((f"http {mode}", conc, *asyncio.run(load(url, conc, mode, x))))
    from model_runtime.compiler import CompileOptions, compile_model
    from model_runtime.demo import DEMO_ONNX_PATH

    mrx = compile_model(
        DEMO_ONNX_PATH,
        options=CompileOptions(
            batch_size=8,
            executable_cache_path=str(tmp.parent / "xdg-cache/model-runtime/executables"),
        ),
    )
    import uvloop

    for conc in (1, 16, 64):
        rows.append(("in-process execute", conc, *uvloop.run(inproc(conc, x, mrx))))
    print(f"{'path':<20} {'clients':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for name, c, rps, p50, p99 in rows:
        print(f"{name:<20} {c:>7} {rps:>9.0f} {p50:>8.2f} {p99:>8.2f}")


main()
