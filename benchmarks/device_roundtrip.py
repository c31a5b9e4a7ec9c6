"""Cost of the device path, in the same run: one ask round trip to a trivial actor, one RunMain
of a tiny program through the Device actor (one worker-thread hop), and a bare onnxruntime
``session.run`` of the same program. Prints a table; writes
``benchmarks/results/device_roundtrip.json``.

Usage: ``python benchmarks/device_roundtrip.py [--n 2000] [--uvloop]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnxruntime as ort
import structlog

from actors.actor import Actor, ActorRef, Stop
from actors.device import AttachedDevice, Device, DeviceSpec, LoadExecutable, RunMain
from model_runtime.executable.testing import tiny_executable

RESULTS = Path(__file__).parent / "results" / "device_roundtrip.json"


class Echo(Actor[object]):
    async def handle(self, message: object) -> object:
        return message


def _stats(samples_ns: list[int]) -> dict[str, float]:
    us = sorted(s / 1000 for s in samples_ns)
    return {
        "median_us": statistics.median(us),
        "p10_us": us[len(us) // 10],
        "p90_us": us[len(us) * 9 // 10],
        "mean_us": statistics.fmean(us),
    }


async def measure(n: int, warmup: int) -> dict[str, dict[str, float]]:
    exe = tiny_executable(batch_size=2)
    batch = {"x": np.ones((2, 4), np.float32)}
    msg_main = RunMain((batch,))
    results: dict[str, dict[str, float]] = {}
    async with anyio.create_task_group() as tg:
        echo: ActorRef[object] = await tg.start(Echo().run)
        ping = object()
        samples = []
        for i in range(warmup + n):
            t = time.perf_counter_ns()
            await echo.ask(ping)
            if i >= warmup:
                samples.append(time.perf_counter_ns() - t)
        results["ask_round_trip"] = _stats(samples)
        await echo.ask(Stop())

        device = Device(AttachedDevice(DeviceSpec(0, "cpu", 1)))
        ref: ActorRef[Any] = await tg.start(device.run)
        await ref.ask(LoadExecutable(exe))
        samples = []
        for i in range(warmup + n):
            t = time.perf_counter_ns()
            await ref.ask(msg_main)
            if i >= warmup:
                samples.append(time.perf_counter_ns() - t)
        results["device_run_main"] = _stats(samples)
        await ref.ask(Stop())

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(exe.program_payload(1), opts, providers=["CPUExecutionProvider"])
    feed = {n: np.array(exe.tensor(n)) for n in ("W", "b", "counter")} | batch
    samples = []
    for i in range(warmup + n):
        t = time.perf_counter_ns()
        sess.run(None, feed)
        if i >= warmup:
            samples.append(time.perf_counter_ns() - t)
    results["bare_onnxruntime_run"] = _stats(samples)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--uvloop", action="store_true")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    backend_options = {"use_uvloop": True} if args.uvloop else {}
    results = anyio.run(measure, args.n, args.warmup, backend_options=backend_options)
    bare = results["bare_onnxruntime_run"]["median_us"]
    print(f"{'measure':<24}{'median µs':>11}{'p10':>9}{'p90':>9}{'x bare':>9}")
    for name, r in results.items():
        print(
            f"{name:<24}{r['median_us']:>11.1f}{r['p10_us']:>9.1f}{r['p90_us']:>9.1f}"
            f"{r['median_us'] / bare:>9.1f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "device_roundtrip",
        "n": args.n,
        "loop": "uvloop" if args.uvloop else "asyncio",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "onnxruntime": ort.__version__,
        "results": results,
    }
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
