"""Where a runner's time goes on its devices: the timeline behind "Replicas and the host's cores".

ModelRunner in process on R cpu devices of one thread, the MLP 784-512-512-10 at B=32, C
callers sending single-sample requests back to back until N are answered. Prints the rate,
the event loop's CPU per sample and per batch, each thread's CPU and context switches per
batch (/proc), the batches each device ran, and per device: the share of time its thread was
in a run, how many runs were handed over after the device's previous run had ended (and how
late, on average), and how long a handed-over run waited to start. ``--host-cores 3`` on a
2-core machine makes both replicas serve, as before the standby (docs/architecture.md).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/replica_timeline.py --callers 256 --replicas 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import actors.device.work as work
import actors.device.worker as worker
from actors.device.inventory import DeviceSpec
from actors.device.manager import DeviceManager
from model_runtime.compiler import CompileOptions, compile_model
from model_runtime.executable import Executable
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.models import make_mlp

#: (thread id, kind, start, end): "sub" a run handed to a device's worker, "run" a run.
EVENTS: list[tuple[int, str, float, float]] = []


def record() -> None:
    """Time every main run on its worker thread, and every hand-over of one."""
    main, submit = work.DeviceWork.main, worker.Worker.submit

    def timed_main(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return main(self, *args, **kwargs)
        finally:
            EVENTS.append((threading.get_ident(), "run", t0, time.perf_counter()))

    def timed_submit(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(fn, "__name__", "") in ("main", "timed_main"):
            EVENTS.append((self._thread.ident or 0, "sub", time.perf_counter(), 0.0))
        return submit(self, fn, *args, **kwargs)

    work.DeviceWork.main = timed_main  # type: ignore[method-assign]
    worker.Worker.submit = timed_submit  # type: ignore[method-assign]


def threads() -> dict[str, tuple[str, int, int, int]]:
    """Each thread of this process: name, CPU ticks, voluntary and involuntary switches."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        stat = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        status = dict(
            line.split(":", 1)
            for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines()
        )
        out[tid] = (
            status["Name"].strip(),
            int(stat[11]) + int(stat[12]),
            int(status["voluntary_ctxt_switches"]),
            int(status["nonvoluntary_ctxt_switches"]),
        )
    return out


def devices_report(batches: int) -> None:
    by: dict[int, list[tuple[str, float, float]]] = defaultdict(list)
    for tid, kind, a, b in EVENTS:
        by[tid].append((kind, a, b))
    for tid, events in by.items():
        subs = [a for kind, a, _ in events if kind == "sub"]
        runs = [(a, b) for kind, a, b in events if kind == "run"]
        if len(runs) < 100 or len(subs) < len(runs):
            continue
        subs = subs[-len(runs) :]
        late = lag = 0.0
        n_late = 0
        for k in range(1, len(runs)):
            ended = runs[k - 1][1]
            lag += runs[k][0] - max(subs[k], ended)
            if subs[k] > ended:
                n_late += 1
                late += subs[k] - ended
        n, span = len(runs), runs[-1][1] - runs[0][0]
        busy = sum(b - a for a, b in runs) / span
        print(
            f"  device thread {tid % 100000}: {n} runs, in a run {busy:.0%} "
            f"of the time; handed over after its previous run ended: {n_late / n:.0%} of runs "
            f"({late / n * 1e6:.0f} us a run on average); start after hand-over "
            f"{lag / n * 1e6:.0f} us a run on average"
        )


async def run(args: argparse.Namespace, path: Path, one: dict[str, np.ndarray]) -> None:
    inventory = [DeviceSpec(id=i, kind="cpu", threads=1) for i in range(args.replicas)]
    config = ModelRunnerConfig(
        replication_factor=args.replicas, batching_dim=0, timeout=1e-5, max_retries=0,
        host_cores=args.host_cores,
    )  # fmt: skip
    async with ModelRunner(
        path, config, device_manager=DeviceManager(inventory=inventory)
    ) as runner:
        for _ in range(200):
            await runner.execute(one)
        states = runner.replica_states()
        before = [sum(s.runs_by_size.values()) for s in states]
        left = [args.requests]

        async def caller() -> None:
            while left[0] > 0:
                left[0] -= 1
                await runner.execute(one)

        EVENTS.clear()
        t0, cpu0, threads0 = time.perf_counter(), time.thread_time(), threads()
        await asyncio.gather(*(caller() for _ in range(args.callers)))
        wall, cpu, threads1 = time.perf_counter() - t0, time.thread_time() - cpu0, threads()
        per_device = [sum(s.runs_by_size.values()) - b for s, b in zip(states, before, strict=True)]
        batches = sum(per_device)
        print(
            f"C={args.callers} R={args.replicas} host_cores={config.cores()}: "
            f"{args.requests / wall:,.0f} samples/s; loop CPU {cpu / args.requests * 1e6:.1f} us "
            f"a sample, {cpu / batches * 1e6:.0f} us a batch; batches per device {per_device} "
            f"(standby {[s.standby for s in states]})"
        )
        tick = os.sysconf("SC_CLK_TCK")
        for tid, (_, ticks, vol, invol) in threads1.items():
            if tid in threads0 and (ticks - threads0[tid][1]) > 1:
                _, ticks0, vol0, invol0 = threads0[tid]
                print(
                    f"  thread {tid}: {(ticks - ticks0) / tick / wall:.2f} of a core; switches a "
                    f"batch: voluntary {(vol - vol0) / batches:.2f}, involuntary "
                    f"{(invol - invol0) / batches:.2f}"
                )
        devices_report(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=256)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--host-cores", type=int, help="ModelRunnerConfig.host_cores")
    args = parser.parse_args()
    os.environ.setdefault("MODEL_RUNTIME_DIR", tempfile.mkdtemp(prefix="mr-timeline-"))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mlp.mrx"
        compile_model(
            make_mlp(sizes=(784, 512, 512, 10)),
            path,
            CompileOptions(batch_size=32, model_name="mlp"),
        )
        meta = Executable.load(path).metadata
        rng = np.random.default_rng(1)
        one = {
            a.name: rng.standard_normal((1, *a.shape[1:])).astype(a.dtype) for a in meta.user_inputs
        }
        record()
        asyncio.run(run(args, path, one))


if __name__ == "__main__":
    main()
