"""CPU per request of a python model without a front end: the daemon's side (the runner, its
batcher and the wire) and the instance process's, measured apart.

The models of ``benchmarks/python_models.py`` (``add_sub``: NVIDIA's example, one request an
``execute``; ``ort_batch``: one onnxruntime run over the requests of an ``execute``,
``max_batch_size`` 32, dynamic batching) served by a :class:`PythonModelRunner` in this process
(uvloop, its defaults); C callers each call ``submit`` back to back for ``--seconds``. Per
point: requests/s, this process's CPU microseconds per request (the daemon's side, callers
included) and the instance process's. No front end, no perf_analyzer: what changes between
the front end and the model shows here even on a busy host, where the full benchmark's ratio
moves with the other processes. Compare two checkouts by running each, alternated:

    PYTHONPATH=$PWD .venv/bin/python benchmarks/python_runner.py [--models add_sub ort_batch]
        [--clients 16 64] [--seconds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import python_models
from model_runtime.python_backend.runner import PythonModelRunner
from tests.models import make_mlp, save

_TICK = os.sysconf("SC_CLK_TCK")


def _process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _add_sub(work: Path) -> tuple[PythonModelRunner, Callable[[], dict[str, np.ndarray]]]:
    shutil.copytree(python_models.ADD_SUB, work / "add_sub")
    fp = {"data_type": "TYPE_FP32", "dims": [4]}
    config = {
        "name": "add_sub", "backend": "python", "max_batch_size": 0,
        "input": [{"name": "INPUT0", **fp}, {"name": "INPUT1", **fp}],
        "output": [{"name": "OUTPUT0", **fp}, {"name": "OUTPUT1", **fp}],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
    }  # fmt: skip
    rng = np.random.default_rng(0)
    return PythonModelRunner(config, work / "add_sub", 1), lambda: {
        "INPUT0": rng.random(4, np.float32), "INPUT1": rng.random(4, np.float32)
    }  # fmt: skip


def _ort_batch(work: Path) -> tuple[PythonModelRunner, Callable[[], dict[str, np.ndarray]]]:
    from benchmarks.peers import triton_server

    onnx = save(make_mlp(), work / "mlp.onnx")
    triton_server.write_repository(
        work, "ort_batch", onnx, threads=1, max_batch_size=32, max_queue_delay_us=0,
        io=("x", 784, "logits", 10),
    )  # fmt: skip
    config = {
        "name": "ort_batch", "backend": "python", "max_batch_size": 32,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [784]}],
        "output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [10]}],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "dynamic_batching": {"max_queue_delay_microseconds": 0},
        "parameters": {
            "onnx_path": {"string_value": str(onnx)}, "intra_op_threads": {"string_value": "1"}
        },
    }  # fmt: skip
    rng = np.random.default_rng(0)
    return PythonModelRunner(config, work / "ort_batch", 1), lambda: {
        "x": rng.random((1, 784), np.float32)
    }


async def _drive(
    runner: PythonModelRunner, make: Callable[[], dict[str, np.ndarray]], c: int, seconds: float
) -> dict[str, Any]:
    answered = 0
    stop = time.monotonic() + seconds

    async def caller() -> None:
        nonlocal answered
        inputs = make()
        while time.monotonic() < stop:
            await runner.submit(inputs)
            answered += 1

    pids = [s.instance.pid for s in runner.pool.slots if s.instance and s.instance.pid]
    inst0, own0, t0 = sum(map(_process_cpu_s, pids)), _own_cpu_s(), time.monotonic()
    await asyncio.gather(*(caller() for _ in range(c)))
    wall = time.monotonic() - t0
    n = max(answered, 1)
    return {
        "per_s": round(answered / wall),
        "daemon_us": round(1e6 * (_own_cpu_s() - own0) / n),
        "instance_us": round(1e6 * (sum(map(_process_cpu_s, pids)) - inst0) / n),
    }


async def _main(args: argparse.Namespace) -> None:
    makers = {"add_sub": _add_sub, "ort_batch": _ort_batch}
    for model in args.models:
        with tempfile.TemporaryDirectory(prefix="mr-python-runner-") as tmp:
            runner, make = makers[model](Path(tmp))
            await runner.start()
            try:
                await _drive(runner, make, 4, 0.5)  # warm
                for c in args.clients:
                    got = await _drive(runner, make, c, args.seconds)
                    print(
                        f"{model:<9} c={c:<3} {got['per_s']:6}/s  daemon {got['daemon_us']} "
                        f"us/req  instance {got['instance_us']} us/req",
                        flush=True,
                    )
            finally:
                await runner.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["add_sub", "ort_batch"])
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--seconds", type=float, default=2.0)
    uvloop.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
