"""The raw backend, the reference below the runtime: the cpu backend running full batches back
to back on one thread per device (the host's compute ceiling), and plain onnxruntime running the
source model on one sample (the lone caller's floor). See ``benchmarks/runner_throughput.py``."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from actors.device.backends import make_backend
from actors.device.inventory import DeviceSpec
from benchmarks.peers.ort_session import make_session
from model_runtime.executable import Executable

__all__ = ["raw_backend", "raw_batch1"]

Row = dict[str, np.ndarray]
#: a raw point runs at least this many batches per device, and at most this many seconds
RAW_BATCHES = 50
MAX_SECONDS = 30.0


def raw_backend(exe: Executable, seconds: float, replicas: int, threads: int) -> dict[str, float]:
    """Samples/s and per-batch latency: ``replicas`` backends of ``threads`` threads each, each
    running full batches back to back on its own thread, all at once."""
    meta = exe.metadata
    rng = np.random.default_rng(0)
    batch = {a.name: rng.standard_normal(a.shape).astype(a.dtype) for a in meta.user_inputs}
    batches = (batch,) * meta.device_iterations
    backends = []
    for i in range(replicas):
        backend = make_backend(DeviceSpec(id=i, kind="cpu", threads=threads))
        backend.load(exe, None)
        warm = time.perf_counter()
        for _ in range(5):
            backend.run_main(batches)
        backends.append(backend)
    seconds = min(max(seconds, RAW_BATCHES * (time.perf_counter() - warm) / 5), MAX_SECONDS)
    latencies: list[list[float]] = [[] for _ in backends]
    start = threading.Barrier(replicas + 1)
    end = 0.0

    def loop(backend: Any, out: list[float]) -> None:
        start.wait()
        while time.perf_counter() < end:
            t = time.perf_counter()
            backend.run_main(batches)
            out.append(time.perf_counter() - t)

    threads_ = [
        threading.Thread(target=loop, args=(b, lat))
        for b, lat in zip(backends, latencies, strict=True)
    ]
    for t in threads_:
        t.start()
    t0 = time.perf_counter()
    end = t0 + seconds
    start.wait()
    for t in threads_:
        t.join()
    elapsed = time.perf_counter() - t0
    for backend in backends:
        backend.unload()
    runs = [x for lat in latencies for x in lat]
    return {
        "samples_per_s": len(runs) * meta.batch_size * meta.device_iterations / elapsed,
        "p50_us": statistics.median(runs) * 1e6,
    }


def raw_batch1(source: Path, one: Row, seconds: float, threads: int = 1) -> dict[str, float]:
    """Latency of plain onnxruntime running the source model on one sample, back to back (the
    backend's session options; ``seconds``, at most 1 s)."""
    session = make_session(str(source), threads)
    names = [i.name for i in session.get_inputs()]
    feed = dict(zip(names, one.values(), strict=True))  # the executable keeps the input order
    for _ in range(20):
        session.run(None, feed)
    runs: list[float] = []
    stop = time.perf_counter() + min(seconds, 1.0)
    while time.perf_counter() < stop or len(runs) < 100:
        t = time.perf_counter()
        session.run(None, feed)
        runs.append(time.perf_counter() - t)
    return {"p50_us": statistics.median(runs) * 1e6, "runs": len(runs)}
