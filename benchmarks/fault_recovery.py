"""Fault recovery figures: each fault kind at 1 in 100 batches, under concurrent load.

For every kind: requests sent, answered OK, answered with an error, lost, duplicated, and the
median and maximum recovery time (from a fault to the next successful batch on that replica).
Two replicas, 200 concurrent callers, mixed request sizes, auto_reset on.

    .venv/bin/python benchmarks/fault_recovery.py [--callers 200] [--per-caller 25]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model_runtime.runner import ModelRunnerConfig
from tests.faults.harness import WIDTH, drive
from tests.integration.runner_support import Reference, compile_to
from tests.models import make_mlp

RESULTS = Path(__file__).parent / "results" / "fault_recovery.json"
PLANS = {
    "recoverable (IPU_RESET)": "recoverable:every=100",
    "app_error": "app_error:every=100",
    "fatal (replica 1)": "fatal:every=100:replica=1",
    "hang": "hang:every=100",
    "slow (20 ms)": "slow:every=100:seconds=0.02",
    "crash": "crash:every=100",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=200)
    parser.add_argument("--per-caller", type=int, default=25)
    args = parser.parse_args()
    os.environ.setdefault("MODEL_RUNTIME_DEVICES", "cpu:2x1")
    os.environ.setdefault("MODEL_RUNTIME_DIR", tempfile.mkdtemp(prefix="mr-faults-"))
    model = make_mlp(sizes=(WIDTH, 48, 10), seed=5)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = compile_to(model, Path(tmp), batch_size=4)
        ref = Reference(model)
        print(
            f"{'fault':24} {'sent':>6} {'ok':>6} {'error':>6} {'lost':>5} {'dup':>4} "
            f"{'failed runs':>11} {'recovery p50 ms':>16} {'max ms':>8}"
        )
        for name, plan in PLANS.items():
            config = ModelRunnerConfig(
                replication_factor=2,
                batching_dim=0,
                timeout=0.0005,
                auto_reset=True,
                fault_plan=plan,
                max_retries=3,
                execution_timeout=0.5,
                reset_intensity=10_000,
            )
            out = anyio.run(
                lambda config=config: drive(
                    path, ref, config, callers=args.callers, per_caller=args.per_caller
                )
            )
            rec = sorted(out.recovery_times)
            row = {
                "fault": name,
                "plan": plan,
                "sent": out.sent,
                "ok": out.ok,
                "error": out.failed,
                "errors": dict(out.errors),
                "wrong": out.wrong,
                "lost": out.lost,
                "duplicated": 0,  # drive() asserts no request is answered twice
                # Runs that failed: a fault's batch, and with pipelining the batch queued
                # behind it on the same device (aborted by the reset or the crash, retried).
                "failed_runs": out.faults,
                "recovery_p50_ms": statistics.median(rec) * 1e3 if rec else None,
                "recovery_max_ms": rec[-1] * 1e3 if rec else None,
            }
            rows.append(row)
            p50 = f"{row['recovery_p50_ms']:.1f}" if rec else "-"
            mx = f"{row['recovery_max_ms']:.1f}" if rec else "-"
            print(
                f"{name:24} {out.sent:>6} {out.ok:>6} {out.failed:>6} {out.lost:>5} "
                f"{0:>4} {out.faults:>11} {p50:>16} {mx:>8}",
                flush=True,
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
