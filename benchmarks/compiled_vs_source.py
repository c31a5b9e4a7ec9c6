"""Compiled program vs the model it came from: does compiling cost speed? (issue 13)

For one model at one batch: the compiled executable on a cpu device (the real device path,
``CpuBackend.run_main``) against plain onnxruntime on the source model at the same batch
(re-batched as the compiler does), with the same session options (the backend's). Also the
same executable in the older layout, weights fed as graph inputs (what compiling did before
weights stayed initializers). Runs are interleaved, medians compared, over a few rounds; the
ratio reported is the median over rounds of compiled / source. Prints a table and writes
``benchmarks/results/compiled_vs_source.json``.

    .venv/bin/python benchmarks/compiled_vs_source.py [--model squeezenet] [--batch 4]
        [--threads 1] [--runs 21] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxruntime as ort

from model_runtime.compiler import CompileOptions, compile_executable
from model_runtime.compiler.lower import weights_as_inputs
from tests.models import LIGHT_MODELS, light_model
from tests.speed import compare, source_at_batch

RESULTS = Path(__file__).parent / "results" / "compiled_vs_source.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="squeezenet", choices=LIGHT_MODELS)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=21, help="timed runs per side per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-json", action="store_true")
    args = parser.parse_args()

    model = light_model(args.model)
    exe = compile_executable(model, CompileOptions(batch_size=args.batch, model_name=args.model))
    source = source_at_batch(model, args.batch)
    layouts = {
        "weights as constants": exe,
        "weights as graph inputs (before)": weights_as_inputs(exe),
    }
    rows: list[dict[str, Any]] = []
    print(
        f"{args.model} batch {args.batch}, {args.threads} intra-op thread(s), "
        f"{args.rounds} rounds x {args.runs} interleaved runs, onnxruntime {ort.__version__}"
    )
    print(f"{'compiled layout':<34}{'compiled ms':>12}{'source ms':>12}{'compiled/source':>17}")
    for label, executable in layouts.items():
        timings = [
            compare(executable, source, threads=args.threads, runs=args.runs)
            for _ in range(args.rounds)
        ]
        row = {
            "layout": label,
            "compiled_ms": statistics.median(t.compiled_s for t in timings) * 1e3,
            "source_ms": statistics.median(t.source_s for t in timings) * 1e3,
            "ratio": statistics.median(t.ratio for t in timings),
            "ratios": [round(t.ratio, 4) for t in timings],
        }
        rows.append(row)
        print(
            f"{label:<34}{row['compiled_ms']:>12.2f}{row['source_ms']:>12.2f}{row['ratio']:>17.3f}"
        )
    if not args.no_json:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "model": args.model,
            "batch": args.batch,
            "threads": args.threads,
            "runs": args.runs,
            "rounds": args.rounds,
            "cores": len(os.sched_getaffinity(0)),
            "machine": platform.machine(),
            "onnxruntime": ort.__version__,
            "rows": rows,
        }
        RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
