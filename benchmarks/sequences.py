"""Sequence throughput (issue 32): steps per second of 200 sequences through the sequence
batcher, against the same model run stateless with the state passed by the client, same run.

The model is the demo accumulator (``model_runtime.demo.accumulator_model``: ``OUTPUT = (START ?
0 : INPUT_STATE) + INPUT``, the next state is the output), compiled at batch 8, on cpu 1x1 with
the runner's dynamic batching (``batching_dim=0``). ``sequences``: a ``SequenceRunner`` keeps each
sequence's state and fills START and READY; ``stateless``: 200 clients call the ``ModelRunner``
themselves with all four inputs and keep their own state. Each client runs its steps one after
the other (a step needs the previous one's state), all 200 at once; every answer is checked.
Alternating pairs; the median ratio is reported. Writes ``benchmarks/results/sequences.json``.

    .venv/bin/python benchmarks/sequences.py [--sequences 200] [--steps 50] [--pairs 3]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from model_runtime import (
    CompileOptions,
    Control,
    ControlKind,
    ModelRunner,
    ModelRunnerConfig,
    SequenceConfig,
    SequenceRunner,
    SequenceStep,
    StatePair,
    compile_model,
)
from model_runtime.demo import accumulator_model

RESULTS = Path(__file__).parent / "results" / "sequences.json"
I32 = np.dtype(np.int32)


def config(slots: int) -> SequenceConfig:
    return SequenceConfig(
        controls=(
            Control(ControlKind.START, "START", I32),
            Control(ControlKind.READY, "READY", I32),
        ),
        states=(StatePair("INPUT_STATE", "OUTPUT_STATE", I32, (1,)),),
        slots=slots,
    )


def one(v: int) -> np.ndarray:
    return np.array([[v]], np.int32)


async def with_sequences(runner: SequenceRunner, plans: list[list[int]]) -> int:
    """Every sequence through the batcher; the wrong answers."""

    async def client(sid: int, values: list[int]) -> int:
        total, wrong = 0, 0
        for k, v in enumerate(values):
            step = SequenceStep(sid, start=k == 0, end=k == len(values) - 1)
            out = await runner.execute({"INPUT": one(v)}, sequence=step)
            total += v
            wrong += int(out["OUTPUT"][0, 0]) != total
        return wrong

    return sum(await asyncio.gather(*(client(s + 1, v) for s, v in enumerate(plans))))


async def stateless(runner: ModelRunner, plans: list[list[int]]) -> int:
    """Every sequence with the client keeping its state; the wrong answers."""

    async def client(values: list[int]) -> int:
        state, total, wrong = one(0), 0, 0
        for k, v in enumerate(values):
            inputs = {"INPUT": one(v), "START": one(k == 0), "READY": one(1), "INPUT_STATE": state}
            out = await runner.execute(inputs)
            state = out["OUTPUT_STATE"]
            total += v
            wrong += int(out["OUTPUT"][0, 0]) != total
        return wrong

    return sum(await asyncio.gather(*(client(v) for v in plans)))


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    plans = [rng.integers(-9, 9, size=args.steps).tolist() for _ in range(args.sequences)]
    steps = args.sequences * args.steps
    with tempfile.TemporaryDirectory(prefix="mr-seq-bench-") as tmp:
        path = compile_model(accumulator_model(), f"{tmp}/acc.mrx", CompileOptions(batch_size=8))
        rows = []
        async with ModelRunner(path, ModelRunnerConfig(batching_dim=0)) as inner:
            runner = SequenceRunner(inner, config(args.sequences), "acc")
            runner.check()
            await with_sequences(runner, [p[:2] for p in plans])  # warm up both paths
            await stateless(inner, [p[:2] for p in plans])
            for pair in range(args.pairs):
                t0 = time.perf_counter()
                wrong_seq = await with_sequences(runner, plans)
                t1 = time.perf_counter()
                wrong_raw = await stateless(inner, plans)
                t2 = time.perf_counter()
                row = {
                    "pair": pair,
                    "sequences_steps_per_s": steps / (t1 - t0),
                    "stateless_steps_per_s": steps / (t2 - t1),
                    "wrong": wrong_seq + wrong_raw,
                }
                row["ratio"] = row["sequences_steps_per_s"] / row["stateless_steps_per_s"]
                rows.append(row)
                print(
                    f"pair {pair}: sequences {row['sequences_steps_per_s']:.0f} steps/s, "
                    f"stateless {row['stateless_steps_per_s']:.0f} steps/s, ratio "
                    f"{row['ratio']:.2f}, wrong {row['wrong']}",
                    flush=True,
                )
            runs = sum(s.runs for s in inner.replica_states())
    median = statistics.median(r["ratio"] for r in rows)
    best = min(rows, key=lambda r: abs(r["ratio"] - median))
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": len(os.sched_getaffinity(0)),
        "model": "demo accumulator (int32 [1] in, state [1]), batch 8, cpu 1x1",
        "sequences": args.sequences,
        "steps": args.steps,
        "pairs": rows,
        "median_ratio": median,
        "sequences_steps_per_s": best["sequences_steps_per_s"],
        "stateless_steps_per_s": best["stateless_steps_per_s"],
        "runs": runs,
        "wrong": sum(r["wrong"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=200)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("MODEL_RUNTIME_DEVICES", "cpu:1x1")
    doc = asyncio.run(measure(args))
    print(
        f"median: sequences / stateless {doc['median_ratio']:.2f} "
        f"({doc['sequences_steps_per_s']:.0f} vs {doc['stateless_steps_per_s']:.0f} steps/s)"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
