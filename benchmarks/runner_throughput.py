"""Runner throughput and latency against the raw backend and the bare batcher, in one run.

DESIGN §13: for each model and each device configuration, three things on the same compiled
program and the same threads:

* raw: the cpu backend (onnxruntime) running the main program at its batch size B back to back,
  one loop per device of the configuration, concurrently (the host's compute ceiling);
* bare: the bare reference batcher (``benchmarks/bare_batcher.py``: a list, one sealing task,
  2 ms flush) with one worker thread per device of the configuration, each with its own
  backend; a sealed batch goes to the worker with the fewest batches in flight;
* runtime: ``ModelRunner`` with the configuration as its device inventory, one replica per
  device, dynamic batching.

Configurations are written REPLICASxTHREADS: 1x1 always; 1x2 and 2x1 where the machine has two
cores. bare and runtime get the same load: C concurrent callers each sending single-sample
requests back to back for ``--seconds``, or longer: at least 5 rounds of the callers (every
caller answered 5 times at the rate of a warm-up burst; raw: 50 batches per device), at most
30 s; a request counts if it is answered within the window. Each MLP caller count is measured
in ``--pairs`` rounds (default 3); a round runs every configuration's bare/runtime pair in turn,
so drift of a shared host hits the configurations alike. A point is reported by its round with
the median runtime/bare ratio; beside the table, each configuration's per-round ratios, its
runtime over the 1x1 runtime of the same round (how a second device or thread scales), the
event loop thread's CPU per sample, and the batches each device ran (one-row ones apart).
Prints a table (ratios runtime/bare and runtime/raw) and writes JSON.

Then, per model, a lone caller (issue 13's latency target): plain onnxruntime on the SOURCE
model at batch 1 (the backend's session options, 1 thread; the floor), against the runtime with
the DEFAULT ``ModelRunnerConfig`` (only ``batching_dim=0``) on one cpu device of one thread,
one caller sending requests back to back (p50/p99; at least 3 requests, at most ~30 s).

    .venv/bin/python benchmarks/runner_throughput.py [--seconds 3] [--callers 1 16 256]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.device.inventory import DeviceSpec
from actors.device.manager import DeviceManager
from benchmarks.bare_batcher import BareBatcher
from benchmarks.peers.raw import MAX_SECONDS, raw_backend, raw_batch1
from model_runtime.compiler import CompileOptions, compile_model
from model_runtime.executable import Executable
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.models import light_model, make_mlp, save

RESULTS = Path(__file__).parent / "results" / "runner_throughput.json"

Row = dict[str, np.ndarray]
Execute = Callable[[Row], Coroutine[Any, Any, Row]]


#: A point lasts at least this many rounds of its callers (a round: every caller answered
#: once; a raw point: ``peers.raw.RAW_BATCHES`` per device): with a slow model and many callers
#: a fixed 3 s holds a round or two, and the count is mostly the luck of where they end.
ROUNDS = 5


async def drive(
    executes: Sequence[Execute], one: Row, callers: int, seconds: float
) -> tuple[dict[str, Any], Row]:
    """The load generator: ``callers`` concurrent callers, each sending ``one`` (a single
    sample) back to back for ``seconds`` (longer when that is under :data:`ROUNDS` rounds at
    the rate of a warm-up burst); caller k sends through ``executes[k % len]``. Returns
    samples/s (requests answered within the window, over the window), latency (of those),
    the window, the event loop thread's CPU per answered sample (``loop_us``), and one
    answer."""
    answer = await executes[0](one)
    for execute in executes:
        for _ in range(20):
            await execute(one)
    burst = time.perf_counter()
    async with anyio.create_task_group() as tg:  # a burst, so full batches are warm too
        for k in range(64):
            tg.start_soon(executes[k % len(executes)], one)
    rate = 64 / (time.perf_counter() - burst)
    seconds = min(max(seconds, ROUNDS * callers / rate), MAX_SECONDS)
    latencies: list[float] = []
    t0 = time.perf_counter()
    stop = t0 + seconds
    cpu0 = time.thread_time()  # the event loop's thread: callers, batching, answers

    async def caller(execute: Execute) -> None:
        while (t := time.perf_counter()) < stop:
            await execute(one)
            if (done := time.perf_counter()) <= stop:
                latencies.append(done - t)

    async with anyio.create_task_group() as tg:
        for k in range(callers):
            tg.start_soon(caller, executes[k % len(executes)])
    loop_cpu = time.thread_time() - cpu0
    stats: dict[str, Any] = {
        "loop_us": loop_cpu / max(1, len(latencies)) * 1e6,
        "samples_per_s": len(latencies) / seconds,
        "p50_us": statistics.median(latencies) * 1e6,
        "p99_us": float(np.percentile(latencies, 99)) * 1e6,
        "seconds": seconds,
    }
    return stats, answer


async def runtime(
    path: Path, one: Row, callers: int, seconds: float, replicas: int, threads: int, timeout: float
) -> tuple[dict[str, Any], Row]:
    """The runtime on ``replicas`` devices of ``threads`` threads, one replica each."""
    manager = DeviceManager(
        inventory=[DeviceSpec(id=i, kind="cpu", threads=threads) for i in range(replicas)]
    )
    config = ModelRunnerConfig(
        replication_factor=replicas, batching_dim=0, timeout=timeout, max_retries=0
    )
    async with ModelRunner(path, config, device_manager=manager) as runner:
        states = runner.replica_states()
        before = [dict(s.runs_by_size) for s in states]
        stats, answer = await drive([runner.execute], one, callers, seconds)
        # Batches each device ran, and of them one-row batches (warm-up and tail included):
        # how the callers were spread, and how many runs carried a lone request.
        runs = [
            {size: n - b.get(size, 0) for size, n in s.runs_by_size.items()}
            for s, b in zip(states, before, strict=True)
        ]
        stats["batches"] = [sum(r.values()) for r in runs]
        stats["one_row_batches"] = [r.get(1, 0) for r in runs]
        return stats, answer


async def bare(
    exe: Executable,
    one: Row,
    callers: int,
    seconds: float,
    replicas: int,
    threads: int,
    flush: float,
) -> tuple[dict[str, Any], Row]:
    """One bare batcher sealing for ``replicas`` devices of ``threads`` threads each."""
    async with BareBatcher(exe, threads, replicas, flush_s=flush) as batcher:
        return await drive([batcher.infer], one, callers, seconds)


#: Alternating bare/runtime pairs per point of the MLP: its points last 3 s, and on a shared
#: host one 3 s window of either side can be 20 % off (single pairs of the same build ranged
#: 0.69-0.95 at 1x1, and 0.38-1.29 at 2x1 on a host running at half speed); the ratio reported
#: is the median of the pairs' ratios, which five pairs keep from any one outlier. Squeezenet's
#: points last at least 5 rounds of their callers (up to 30 s): one pair each.
MLP_PAIRS = 5


def compile_models(cache: Path) -> list[tuple[str, Path, Path]]:
    """(name, compiled executable, source ONNX file) of each benchmark model."""
    sources: list[tuple[str, onnx.ModelProto, int, str]] = [
        ("mlp 784-512-512-10 B=32", make_mlp(sizes=(784, 512, 512, 10)), 32, "mlp-784-512-512-10"),
        ("squeezenet (light) B=8", light_model("squeezenet"), 8, "squeezenet"),
    ]
    out = []
    for name, model, batch, short in sources:
        source = save(model, cache / f"{short}.onnx")
        exe = compile_model(
            model, cache / f"{short}.mrx", CompileOptions(batch_size=batch, model_name=short)
        )
        out.append((name, exe, source))
    return out


async def lone_caller(path: Path, one: Row, seconds: float, cap: float = 30.0) -> dict[str, float]:
    """One caller, requests back to back, the runtime with the default config on cpu 1x1."""
    manager = DeviceManager(inventory=[DeviceSpec(id=0, kind="cpu", threads=1)])
    config = ModelRunnerConfig(batching_dim=0)
    latencies: list[float] = []
    async with ModelRunner(path, config, device_manager=manager) as runner:
        t0 = time.perf_counter()
        await runner.execute(one)
        while time.perf_counter() - t0 < min(seconds, 1.0):  # warm-up
            await runner.execute(one)
        t0 = time.perf_counter()
        while (time.perf_counter() - t0 < seconds or len(latencies) < 3) and (
            time.perf_counter() - t0 < cap
        ):
            t = time.perf_counter()
            await runner.execute(one)
            latencies.append(time.perf_counter() - t)
    return {
        "p50_us": statistics.median(latencies) * 1e6,
        "p99_us": float(np.percentile(latencies, 99)) * 1e6,
        "requests": len(latencies),
        "default_timeout_ms": config.timeout * 1e3,
    }


def parse_config(text: str) -> tuple[int, int]:
    replicas, _, threads = text.partition("x")
    return int(replicas), int(threads or 1)


def same(a: Row, b: Row) -> bool:
    return a.keys() == b.keys() and all(np.allclose(a[k], b[k], rtol=1e-4, atol=1e-5) for k in a)


def fmt(values: Sequence[float]) -> str:
    return "[" + " ".join(f"{v:.2f}" for v in values) + "]"


def point_row(
    name: str,
    replicas: int,
    threads: int,
    callers: int,
    raw: dict[str, float],
    bares: list[dict[str, Any]],
    rts: list[dict[str, Any]],
    lone_rts: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """One table row: the round whose runtime/bare ratio is the median stands for the point
    (its rates and latencies); ``lone_rts``: the 1x1 runtime's rounds, for runtime/1x1."""
    ratios = [r["samples_per_s"] / b["samples_per_s"] for b, r in zip(bares, rts, strict=True)]
    k = sorted(range(len(ratios)), key=ratios.__getitem__)[len(ratios) // 2]
    bw, rt = bares[k], rts[k]
    row: dict[str, Any] = {
        "model": name,
        "config": f"{replicas}x{threads}",
        "replicas": replicas,
        "threads": threads,
        "callers": callers,
        "raw_samples_per_s": raw["samples_per_s"],
        "raw_batch_p50_us": raw["p50_us"],
        "bare_samples_per_s": bw["samples_per_s"],
        "bare_p50_us": bw["p50_us"],
        "bare_p99_us": bw["p99_us"],
        "runtime_samples_per_s": rt["samples_per_s"],
        "runtime_p50_us": rt["p50_us"],
        "runtime_p99_us": rt["p99_us"],
        "bare_seconds": bw["seconds"],
        "runtime_seconds": rt["seconds"],
        "runtime_over_bare": ratios[k],
        "pair_ratios": ratios,
        "runtime_over_raw": rt["samples_per_s"] / raw["samples_per_s"],
        "bare_over_raw": bw["samples_per_s"] / raw["samples_per_s"],
        "runtime_loop_us": statistics.median(r["loop_us"] for r in rts),
        "bare_loop_us": statistics.median(b["loop_us"] for b in bares),
        "runtime_batches": rt["batches"],
        "runtime_one_row_batches": rt["one_row_batches"],
    }
    if lone_rts is not None and replicas * threads > 1:
        scaling = [
            r["samples_per_s"] / one["samples_per_s"] for one, r in zip(lone_rts, rts, strict=True)
        ]
        row["runtime_over_1x1_pairs"] = scaling
        row["runtime_over_1x1"] = statistics.median(scaling)
    return row


HEADER = (
    f"{'model':26} {'cfg':>4} {'C':>4} {'raw/s':>9} {'bare/s':>9} {'runtime/s':>9} "
    f"{'rt/bare':>7} {'rt/raw':>6} {'rt p50us':>9} {'rt p99us':>9} {'bare p50us':>10} "
    f"{'bare p99us':>10}"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--callers", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument(
        "--configs", nargs="+", help="REPLICASxTHREADS (default: 1x1, plus 1x2 2x1 on 2+ cores)"
    )
    parser.add_argument("--flush-ms", type=float, default=2.0, help="the bare batcher's flush")
    parser.add_argument(
        "--timeout-ms", type=float, default=0.01, help="the runtime's flush timeout"
    )
    parser.add_argument("--uvloop", action="store_true", help="run the event loop on uvloop")
    parser.add_argument(
        "--models", nargs="+", help="only the models whose name starts with one of these"
    )
    parser.add_argument("--no-lone", action="store_true", help="skip the lone-caller points")
    parser.add_argument(
        "--pairs",
        type=int,
        default=MLP_PAIRS,
        help="alternating bare/runtime pairs per MLP point (the median ratio is reported)",
    )
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    configs = [
        parse_config(c) for c in args.configs or (["1x1", "1x2", "2x1"] if cores >= 2 else ["1x1"])
    ]
    os.environ.setdefault("MODEL_RUNTIME_DIR", tempfile.mkdtemp(prefix="mr-bench-"))
    loop = "uvloop" if args.uvloop else "asyncio"
    options = {"use_uvloop": args.uvloop}
    rows: list[dict[str, Any]] = []
    print(
        f"{cores} cores, {loop}; bare flush {args.flush_ms} ms, runtime timeout "
        f"{args.timeout_ms} ms; {args.seconds} s per point"
    )
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        models = [
            m
            for m in compile_models(Path(tmp))
            if not args.models or any(m[0].startswith(p) for p in args.models)
        ]
        for name, path, _ in models:
            exe = Executable.load(path)
            rng = np.random.default_rng(1)
            one = {
                a.name: rng.standard_normal((1, *a.shape[1:])).astype(a.dtype)
                for a in exe.metadata.user_inputs
            }
            raws = {cfg: raw_backend(exe, args.seconds, *cfg) for cfg in configs}
            pairs = args.pairs if name.startswith("mlp") else 1
            for c in args.callers:
                # Every configuration once per round, bare then runtime: drift of the shared
                # host hits each configuration's pair alike, and the configurations alike; odd
                # rounds run them in reverse order, so none always runs first in its round.
                bares: dict[tuple[int, int], list[dict[str, Any]]] = {k: [] for k in configs}
                rts: dict[tuple[int, int], list[dict[str, Any]]] = {k: [] for k in configs}
                for k in range(pairs):
                    for replicas, threads in configs[:: -1 if k % 2 else 1]:
                        bw, bare_answer = anyio.run(
                            bare,
                            exe,
                            one,
                            c,
                            args.seconds,
                            replicas,
                            threads,
                            args.flush_ms / 1e3,
                            backend_options=options,
                        )
                        rt, rt_answer = anyio.run(
                            runtime,
                            path,
                            one,
                            c,
                            args.seconds,
                            replicas,
                            threads,
                            args.timeout_ms / 1e3,
                            backend_options=options,
                        )
                        if not same(bare_answer, rt_answer):
                            print(
                                f"WARNING: {name} {replicas}x{threads}: bare and runtime "
                                "answers differ"
                            )
                        bares[replicas, threads].append(bw)
                        rts[replicas, threads].append(rt)
                for (replicas, threads), raw in raws.items():
                    r = point_row(
                        name,
                        replicas,
                        threads,
                        c,
                        raw,
                        bares[replicas, threads],
                        rts[replicas, threads],
                        rts.get((1, 1)),
                    )
                    rows.append(r)
                    print(
                        f"{name:26} {r['config']:>4} {c:>4} {r['raw_samples_per_s']:>9.0f} "
                        f"{r['bare_samples_per_s']:>9.0f} {r['runtime_samples_per_s']:>9.0f} "
                        f"{r['runtime_over_bare']:>7.2f} {r['runtime_over_raw']:>6.2f} "
                        f"{r['runtime_p50_us']:>9.0f} {r['runtime_p99_us']:>9.0f} "
                        f"{r['bare_p50_us']:>10.0f} {r['bare_p99_us']:>10.0f}",
                        flush=True,
                    )
                for r in rows[-len(raws) :]:
                    print(
                        f"  {r['config']} C={c}: runtime/bare per round "
                        f"{fmt(r['pair_ratios'])}, runtime/1x1 runtime per round "
                        f"{fmt(r.get('runtime_over_1x1_pairs', []))}; loop CPU per sample "
                        f"runtime {r['runtime_loop_us']:.1f} us, bare {r['bare_loop_us']:.1f} us; "
                        f"runtime batches per device {r['runtime_batches']} (one-row "
                        f"{r['runtime_one_row_batches']})",
                        flush=True,
                    )
        lone: list[dict[str, Any]] = []
        print(
            f"\nlone caller: {'model':26} {'raw b1 p50us':>12} {'rt p50us':>9} {'rt p99us':>9} "
            f"{'rt - raw us':>11}"
        )
        for name, path, source in [] if args.no_lone else models:
            exe = Executable.load(path)
            rng = np.random.default_rng(1)
            one = {
                a.name: rng.standard_normal((1, *a.shape[1:])).astype(a.dtype)
                for a in exe.metadata.user_inputs
            }
            floor = raw_batch1(source, one, args.seconds)
            rt = anyio.run(lone_caller, path, one, args.seconds, backend_options=options)
            lone.append(
                {
                    "model": name,
                    "raw_batch1_p50_us": floor["p50_us"],
                    "runtime_default_p50_us": rt["p50_us"],
                    "runtime_default_p99_us": rt["p99_us"],
                    "runtime_default_requests": rt["requests"],
                    "runtime_default_timeout_ms": rt["default_timeout_ms"],
                }
            )
            print(
                f"lone caller: {name:26} {floor['p50_us']:>12.0f} {rt['p50_us']:>9.0f} "
                f"{rt['p99_us']:>9.0f} {rt['p50_us'] - floor['p50_us']:>11.0f}",
                flush=True,
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": cores,
        "loop": loop,
        "seconds": args.seconds,
        "bare_flush_ms": args.flush_ms,
        "runtime_timeout_ms": args.timeout_ms,
        "mlp_pairs": args.pairs,
        "rows": rows,
        "lone": lone,
    }
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
