"""A dynamic-shape point (issue 29): the runtime against raw onnxruntime request by request.

The model: ``tests.models.make_text_classifier()`` (``ids`` INT64 ["batch", "seq"] -> ``logits``
[batch, 4] and ``hidden`` [batch, seq, 16]), compiled with
``compile_executable(model, CompileOptions(batch_size=32))``; its ``seq`` axis stays dynamic.

One request list: ``--requests`` single-sample requests (default 320), request j of sequence
length ``LENGTHS[j % 5]`` (1, 4, 16, 32, 64), random token ids. Measured in the same run,
alternating, ``--pairs`` pairs (default 3; the pair with the median ratio is reported):

* raw: plain onnxruntime on the SOURCE model, one ``InferenceSession`` of 1 intra-op thread
  (the runtime's cpu session options, ``benchmarks/peers/ort_session.py``), running each
  request alone, sequentially over the request list (cycling) for ``--seconds``;
* runtime: ``ModelRunner(exe, ModelRunnerConfig(batching_dim=0))`` (the default config plus
  the batching dimension) on one cpu device of 1 thread, ``--callers`` concurrent asyncio
  callers (default 64) sending requests back to back for ``--seconds``; caller k's i-th request
  is request ``(k + callers * i) mod N``, so each caller's sequence length cycles through the
  five and the queue always holds every shape. A request counts if answered within the window.

* batched (the ceiling of batching here): the same onnxruntime session running the request list
  grouped by sequence length, each run as many rows as the runtime's runs held on average in
  that pair (one shape per run, as the runtime batches), back to back for ``--seconds``: what
  batching at those sizes can give on this host at best, with no batcher's cost at all.

Reported: requests/s of all three, runtime/raw (issue 29: >= 2.0), batched/raw (the most any
batcher could reach of that target here), runtime/batched, and device runs per request (the
replicas' ``runs`` over the window's requests, every request sent in it, counted to its
answer; issue 29: <= 0.6: requests of one shape share batches). A sample of the runtime's
answers (every ``--check-every``-th of each caller) is compared with onnxruntime's on that
request alone; a wrong answer is counted and printed, and exits non-zero. A runtime that
leaves requests unanswered 30 s after a window fails the benchmark (no results written).

    .venv/bin/python benchmarks/dynamic_shapes.py [--seconds 3] [--callers 64] [--pairs 3]
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
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.device.inventory import DeviceSpec
from actors.device.manager import DeviceManager
from benchmarks.peers.ort_session import make_session
from model_runtime.compiler import CompileOptions, compile_executable
from model_runtime.executable import Executable
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.models import make_text_classifier, save

RESULTS = Path(__file__).parent / "results" / "dynamic_shapes.json"
MODEL = "text classifier ids [batch, seq] B=32"
#: The models measured, in order: the issue's classifier (what its targets are read from: the
#: first row), then a text encoder of realistic cost per request (2 transformer blocks of width
#: 64), where onnxruntime's own time per request is not dwarfed by Python's.
MODELS: tuple[tuple[str, dict[str, int]], ...] = (
    (MODEL, {}),
    (
        "text encoder (2 transformer blocks, width 64) B=32",
        {"vocab": 1000, "width": 64, "layers": 2},
    ),
)
LENGTHS = (1, 4, 16, 32, 64)
VOCAB = 100  # make_text_classifier's default

Row = dict[str, np.ndarray]

#: A request unanswered this long after its window ends: the runtime stalled (reported as
#: such, the benchmark fails), rather than ``make bench`` hanging.
STALL_S = 30.0


class Stalled(RuntimeError):
    """The runtime left requests unanswered (see :data:`STALL_S`)."""


def make_requests(count: int, seed: int = 0) -> list[Row]:
    """``count`` single-sample requests, request j of sequence length ``LENGTHS[j % 5]``."""
    rng = np.random.default_rng(seed)
    return [
        {"ids": rng.integers(0, VOCAB, size=(1, LENGTHS[j % len(LENGTHS)]), dtype=np.int64)}
        for j in range(count)
    ]


def ort_answer(session: ort.InferenceSession, request: Row) -> Row:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, request), strict=True))


def raw(session: ort.InferenceSession, requests: list[Row], seconds: float) -> dict[str, float]:
    """Requests/s of one onnxruntime session running each request alone, sequentially over
    ``requests`` (cycling) for ``seconds``."""
    for request in requests:  # warm-up: every shape once at least
        session.run(None, request)
    done = 0
    latencies: list[float] = []
    t0 = time.perf_counter()
    stop = t0 + seconds
    while (t := time.perf_counter()) < stop:
        session.run(None, requests[done % len(requests)])
        latencies.append(time.perf_counter() - t)
        done += 1
    elapsed = time.perf_counter() - t0
    return {
        "req_per_s": done / elapsed,
        "p50_us": statistics.median(latencies) * 1e6,
        "seconds": elapsed,
    }


def batched(
    session: ort.InferenceSession, requests: list[Row], rows: int, seconds: float
) -> dict[str, float]:
    """Requests/s of one onnxruntime session running ``requests`` grouped by sequence length,
    ``rows`` of one length per run (cycling through each length's requests), the lengths in
    turn, back to back for ``seconds``: batching's ceiling, with no batcher's cost."""
    by_length: dict[int, list[np.ndarray]] = {}
    for request in requests:
        by_length.setdefault(request["ids"].shape[1], []).append(request["ids"])
    batches = []
    for group in by_length.values():
        ids = np.concatenate([group[i % len(group)] for i in range(rows)])
        batches.append({"ids": ids})
    for batch in batches:  # warm-up: every shape once
        session.run(None, batch)
    done = 0
    t0 = time.perf_counter()
    stop = t0 + seconds
    while time.perf_counter() < stop:
        session.run(None, batches[done % len(batches)])
        done += 1
    elapsed = time.perf_counter() - t0
    return {"req_per_s": done * rows / elapsed, "rows": rows, "seconds": elapsed}


def total_runs(runner: ModelRunner) -> int:
    return sum(s.runs for s in runner.replica_states())


async def runtime(
    exe: Executable, requests: list[Row], callers: int, seconds: float, check_every: int
) -> tuple[dict[str, float], list[tuple[int, Row]]]:
    """The runtime with the default config (plus ``batching_dim=0``) on one cpu device of one
    thread, ``callers`` concurrent callers; returns its figures and the sampled answers
    (request index, answer)."""
    manager = DeviceManager(inventory=[DeviceSpec(id=0, kind="cpu", threads=1)])
    config = ModelRunnerConfig(batching_dim=0)
    n = len(requests)
    sampled: list[tuple[int, Row]] = []
    latencies: list[float] = []
    sent = 0
    async with ModelRunner(exe, config, device_manager=manager) as runner:
        for request in requests:  # warm-up: every shape, alone
            await runner.execute(request)
        with anyio.move_on_after(STALL_S) as scope:
            async with anyio.create_task_group() as tg:  # and a burst of every shape at once
                for j in range(2 * callers):
                    tg.start_soon(runner.execute, requests[j % n])
        if scope.cancelled_caught:
            raise Stalled(
                f"the runtime stalled: a warm-up burst of {2 * callers} requests "
                f"of {len(LENGTHS)} shapes unanswered after {STALL_S:.0f} s"
            )
        runs0 = total_runs(runner)
        t0 = time.perf_counter()
        stop = t0 + seconds

        async def caller(k: int) -> None:
            nonlocal sent
            i = 0
            while (t := time.perf_counter()) < stop:
                index = (k + callers * i) % n
                sent += 1
                answer = await runner.execute(requests[index])
                if (done := time.perf_counter()) <= stop:
                    latencies.append(done - t)
                if i % check_every == 0:
                    sampled.append((index, answer))
                i += 1

        with anyio.move_on_after(seconds + STALL_S) as scope:
            async with anyio.create_task_group() as tg:
                for k in range(callers):
                    tg.start_soon(caller, k)
        if scope.cancelled_caught:
            raise Stalled(
                f"the runtime stalled: {sent - len(latencies)} of {sent} requests unanswered "
                f"{STALL_S:.0f} s after the {seconds} s window "
                f"({total_runs(runner) - runs0} device runs)"
            )
        runs = total_runs(runner) - runs0
    stats = {
        "req_per_s": len(latencies) / seconds,
        "p50_us": statistics.median(latencies) * 1e6,
        "p99_us": float(np.percentile(latencies, 99)) * 1e6,
        "seconds": seconds,
        "requests_sent": sent,
        "device_runs": runs,
        "runs_per_request": runs / sent,
    }
    return stats, sampled


def check(
    session: ort.InferenceSession, requests: list[Row], sampled: list[tuple[int, Row]]
) -> tuple[int, float]:
    """(wrong answers, largest absolute difference) of the sampled runtime answers against
    onnxruntime on each request alone."""
    wrong, worst = 0, 0.0
    for index, answer in sampled:
        expected = ort_answer(session, requests[index])
        if answer.keys() != expected.keys() or any(
            answer[k].shape != expected[k].shape for k in expected
        ):
            wrong += 1
            print(f"WRONG: request {index}: { ({k: v.shape for k, v in answer.items()}) }")
            continue
        for k, want in expected.items():
            worst = max(worst, float(np.max(np.abs(answer[k] - want), initial=0.0)))
            if not np.allclose(answer[k], want, rtol=1e-4, atol=1e-5):
                wrong += 1
                print(f"WRONG: request {index} (seq {want.shape[1]}): output {k!r} differs")
                break
    return wrong, worst


def measure(
    name: str, model: Any, requests: list[Row], args: argparse.Namespace, cores: int
) -> dict[str, Any]:
    """One model's row: alternating raw/runtime(/batched) pairs, the median pair's figures."""
    exe = compile_executable(model, CompileOptions(batch_size=32))
    print(
        f"{cores} cores; {name}; {args.callers} callers, seq lengths {LENGTHS}; "
        f"{args.seconds} s per point, {args.pairs} alternating raw/runtime pairs"
    )
    print(
        f"{'pair':>4} {'raw req/s':>10} {'runtime req/s':>13} {'rt/raw':>6} {'runs/req':>8} "
        f"{'rt p50us':>9} {'rt p99us':>9} {'raw p50us':>9} {'batched/s':>10} {'bt/raw':>6}",
        flush=True,
    )
    pairs: list[tuple[dict[str, float], dict[str, float]]] = []
    ceilings: list[dict[str, float]] = []
    sampled: list[tuple[int, Row]] = []
    with tempfile.TemporaryDirectory() as tmp:
        session = make_session(str(save(model, Path(tmp) / "text_classifier.onnx")), 1)
        for p in range(args.pairs):  # alternating, so drift of the host hits both
            rw = raw(session, requests, args.seconds)
            try:
                rt, answers = anyio.run(
                    runtime, exe, requests, args.callers, args.seconds, args.check_every
                )
            except Stalled as exc:
                sys.exit(f"FAILED: {exc}; no results written")
            sampled += answers
            pairs.append((rw, rt))
            rows = max(1, round(1 / rt["runs_per_request"]))
            bt = batched(session, requests, rows, args.seconds)
            ceilings.append(bt)
            print(
                f"{p:>4} {rw['req_per_s']:>10.0f} {rt['req_per_s']:>13.0f} "
                f"{rt['req_per_s'] / rw['req_per_s']:>6.2f} {rt['runs_per_request']:>8.3f} "
                f"{rt['p50_us']:>9.0f} {rt['p99_us']:>9.0f} {rw['p50_us']:>9.0f} "
                f"{bt['req_per_s']:>10.0f} {bt['req_per_s'] / rw['req_per_s']:>6.2f}",
                flush=True,
            )
        wrong, worst = check(session, requests, sampled)
    ratios = [rt["req_per_s"] / rw["req_per_s"] for rw, rt in pairs]
    k = sorted(range(len(pairs)), key=ratios.__getitem__)[len(pairs) // 2]
    rw, rt = pairs[k]
    bt = ceilings[k]
    print(
        f"median pair: runtime/raw {ratios[k]:.2f} (target >= 2.0), batched/raw "
        f"{bt['req_per_s'] / rw['req_per_s']:.2f} at {bt['rows']:.0f} rows per run, "
        f"{rt['runs_per_request']:.3f} device runs per request (target <= 0.6); "
        f"{len(sampled)} answers checked against onnxruntime alone, {wrong} wrong "
        f"(max |diff| {worst:.2g})"
    )
    return {
        "model": name,
        "callers": args.callers,
        "seq_lengths": list(LENGTHS),
        "raw_req_per_s": rw["req_per_s"],
        "raw_p50_us": rw["p50_us"],
        "runtime_req_per_s": rt["req_per_s"],
        "runtime_p50_us": rt["p50_us"],
        "runtime_p99_us": rt["p99_us"],
        "runtime_over_raw": ratios[k],
        "pair_ratios": ratios,
        "batched_req_per_s": bt["req_per_s"],
        "batched_rows": bt["rows"],
        "batched_over_raw": bt["req_per_s"] / rw["req_per_s"],
        "runtime_over_batched": rt["req_per_s"] / bt["req_per_s"],
        "pair_batched_over_raw": [
            c["req_per_s"] / r["req_per_s"] for (r, _), c in zip(pairs, ceilings, strict=True)
        ],
        "requests_sent": rt["requests_sent"],
        "device_runs": rt["device_runs"],
        "runs_per_request": rt["runs_per_request"],
        "pair_runs_per_request": [r["runs_per_request"] for _, r in pairs],
        "answers_checked": len(sampled),
        "answers_wrong": wrong,
        "max_abs_diff": worst,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", "3"))
    )
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=3, help="alternating raw/runtime pairs")
    parser.add_argument("--requests", type=int, default=320, help="the request list's length")
    parser.add_argument("--check-every", type=int, default=10, help="answer sample rate")
    args = parser.parse_args()
    os.environ.setdefault("MODEL_RUNTIME_DIR", tempfile.mkdtemp(prefix="mr-bench-"))
    cores = len(os.sched_getaffinity(0))
    requests = make_requests(args.requests)
    rows: list[dict[str, Any]] = []
    wrong_total = 0
    for name, shape in MODELS:
        row = measure(name, make_text_classifier(**shape), requests, args, cores)
        rows.append(row)
        wrong_total += row["answers_wrong"]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": cores,
        "seconds": args.seconds,
        "pairs": args.pairs,
        "requests": args.requests,
        "device": "cpu 1x1 (one device, 1 thread)",
        "runtime_config": "ModelRunnerConfig(batching_dim=0)",
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    if wrong_total:
        sys.exit(1)


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
