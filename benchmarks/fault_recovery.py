"""Fault recovery figures, default policy: per fault kind, and issue 11's "Done when".

Every run uses ``tests.faults.scenarios.default_config``: two replicas, dynamic batching,
auto_reset on, and every recovery limit (max_retries, execution_timeout,
max_failed_recoveries, probe backoff) at its default. Every answer is checked against
onnxruntime on the original model.

Table 1 ("kinds"): each fault kind at 1 in 100 batches under concurrent load (mixed request
sizes): requests sent, answered OK, answered with an error (and by type), answered wrong,
lost, failed runs, and the median and maximum recovery time (from a fault to the next
successful batch on that replica).

Table 2 ("done"): the self-healing scenarios of issue 11, one row each, with what a user would
check and whether the "Done when" holds:

a. 3,000 mixed requests under ``recoverable:every=20``: all answered OK, the replicas reset.
b. 60 poisoned requests among 1,800 good ones: the good all OK, the poisoned rejected with
   InputValidationError, no device reset, the model ready after.
c. A burst (``recoverable:every=1:from=30:until=45:replica=1``) knocks replica 1 out: it
   serves again, nobody gets an error.
d. A fatal device (``fatal:at=30:replica=1``) is replaced: replica 1 serves again, no error.
e. A crash storm (``crash:every=3``) keeps both replicas serving; a device that dies after
   every restart (``crash:every=1:from=20:replica=1``, 4 s) takes replica 1 out of service
   without spinning the supervisors.

    .venv/bin/python benchmarks/fault_recovery.py [--callers 200] [--per-caller 25]
        [--only done|kinds] [--log-level critical]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model_runtime.errors import ActorStoppedError
from model_runtime.runner import ModelRunner
from tests.faults.harness import WIDTH, drive
from tests.faults.scenarios import (
    TABLE_ROWS,
    Healing,
    default_config,
    poisoned_requests,
    serve_until,
    served_again,
)
from tests.integration.runner_support import Reference, compile_to
from tests.models import make_embedding, make_mlp

RESULTS = Path(__file__).parent / "results" / "fault_recovery.json"
PLANS = {
    "recoverable (IPU_RESET)": "recoverable:every=100",
    "app_error": "app_error:every=100",
    "fatal (replica 1)": "fatal:every=100:replica=1",
    "hang": "hang:every=100",
    "slow (20 ms)": "slow:every=100:seconds=0.02",
    "crash": "crash:every=100",
}
#: How long the dying-device scenario (e, second row) serves before its callers stop.
DYING_SECONDS = 4.0

Compiled = tuple[Path, Reference]


def _types(errors: Counter[str] | dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(errors.items())) or "-"


class Sampler:
    """What serve_until and drive() do not count, sampled from the runner while it serves.

    Device actor restarts inside the replicas' subtrees, summed over the run: a replica
    subtree that gives up is replaced with fresh counters, so the counts are sampled (every
    few ms) and summed per subtree, a lower bound, exact unless a restart and its subtree's
    replacement fall between two samples.
    """

    def __init__(self) -> None:
        self.device_restarts = 0
        #: Device resets (the replicas' states outlive their actors: the last sample is exact
        #: up to the few ms before the runner closed)
        self.resets = 0
        self._last: dict[int, tuple[object, int]] = {}

    def sample(self, runner: ModelRunner) -> None:
        replicas = runner._replicas
        if replicas is None:
            return
        self.resets = sum(state.resets for state in replicas.states)
        for r in range(len(replicas.states)):
            try:
                sup = replicas.replica_supervisor(r)
            except (ActorStoppedError, AssertionError):
                continue  # being replaced
            now = sum(c.restarts for c in sup.children() if c.id == "device")
            seen, before = self._last.get(r, (None, 0))
            self.device_restarts += now - before if seen is sup else now
            self._last[r] = (sup, now)


# -- table 1: per fault kind --------------------------------------------------------------------


def kinds_table(mlp: Compiled, callers: int, per_caller: int) -> list[dict[str, Any]]:
    path, ref = mlp
    rows: list[dict[str, Any]] = []
    print(f"Fault kinds at 1 in 100 batches, {callers} callers x {per_caller}, default policy")
    print(
        f"{'fault':24} {'sent':>6} {'ok':>6} {'error':>6} {'wrong':>5} {'lost':>5} "
        f"{'failed runs':>11} {'recovery p50 ms':>16} {'max ms':>8} {'s':>6}  errors by type"
    )
    for name, plan in PLANS.items():
        t0 = time.perf_counter()
        config = default_config(plan)
        out = anyio.run(partial(drive, path, ref, config, callers=callers, per_caller=per_caller))
        seconds = time.perf_counter() - t0
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
            # Runs that failed: a fault's batch, and with pipelining the batch queued behind
            # it on the same device (aborted by the reset or the crash, retried).
            "failed_runs": out.faults,
            "resets": out.resets,
            "retries": out.retries,
            "recovery_p50_ms": statistics.median(rec) * 1e3 if rec else None,
            "recovery_max_ms": rec[-1] * 1e3 if rec else None,
            "statuses": out.statuses,
            "seconds": round(seconds, 2),
        }
        rows.append(row)
        p50 = f"{row['recovery_p50_ms']:.1f}" if rec else "-"
        mx = f"{row['recovery_max_ms']:.1f}" if rec else "-"
        print(
            f"{name:24} {out.sent:>6} {out.ok:>6} {out.failed:>6} {out.wrong:>5} "
            f"{out.lost:>5} {out.faults:>11} {p50:>16} {mx:>8} {seconds:>6.1f}  "
            f"{_types(out.errors)}",
            flush=True,
        )
    return rows


# -- table 2: issue 11's "Done when" --------------------------------------------------------------


def _counts(out: Any) -> dict[str, Any]:
    """What every scenario reports of an outcome (``Outcome`` or ``Healing``)."""
    return {
        "sent": out.sent,
        "ok": out.ok,
        "wrong": out.wrong,
        "errors": dict(out.errors),
        "lost": out.lost,
        "after": ",".join(out.statuses),
    }


def _row(scenario: str, plan: str | None, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "scenario": scenario,
        "plan": plan,
        "sent": None,
        "ok": None,
        "wrong": None,
        "errors": {},
        "lost": None,
        "rejected": None,
        "resets": None,
        # Replica subtrees replaced by the model's supervisor (serve_until's "restarts"),
        # and device actor restarts inside the subtrees (sampled, see Sampler).
        "restarts": None,
        "device_restarts": None,
        "outages": None,
        "back_after_s": None,
        "after": None,
    }
    row.update(values)
    row["error"] = sum(row["errors"].values())
    return row


def _verdict(row: dict[str, Any], checks: dict[str, bool]) -> dict[str, Any]:
    row["done_when"] = list(checks)
    row["unmet"] = [name for name, held in checks.items() if not held]
    row["met"] = not row["unmet"]
    return row


def _sampling(
    done: Callable[[ModelRunner], bool], sampler: Sampler
) -> Callable[[ModelRunner], bool]:
    """``done``, sampling the device restarts each time serve_until's observer asks (~5 ms)."""

    def check(runner: ModelRunner) -> bool:
        sampler.sample(runner)
        return done(runner)

    return check


def _healing_row(scenario: str, plan: str, out: Healing, sampler: Sampler) -> dict[str, Any]:
    return _row(
        scenario,
        plan,
        **_counts(out),
        resets=sampler.resets,
        restarts=out.restarts,
        device_restarts=sampler.device_restarts,
        outages=out.outages,
        back_after_s=None if out.back_after is None else round(out.back_after, 3),
        seconds=round(out.seconds, 2),
    )


def done_a(mlp: Compiled) -> dict[str, Any]:
    plan = "recoverable:every=20"
    t0 = time.perf_counter()
    out = anyio.run(lambda: drive(*mlp, default_config(plan), callers=300, per_caller=10))
    row = _row(
        "a. 3000 mixed, recoverable/20",
        plan,
        **_counts(out),
        resets=out.resets,
        seconds=round(time.perf_counter() - t0, 2),
    )
    return _verdict(
        row,
        {
            "sent == 3000": out.sent == 3000,
            "ok == 3000 (no error, wrong or lost)": out.ok == 3000,
            "resets > 10": out.resets > 10,
            "both replicas ready after": out.statuses == ["ready", "ready"],
        },
    )


def done_b(embedding: Compiled) -> dict[str, Any]:
    out = anyio.run(lambda: poisoned_requests(*embedding, good=1800, bad=60))
    row = _row(
        "b. 60 poisoned in 1800 good",
        None,
        sent=out.good + out.bad,
        ok=out.good_ok,
        wrong=out.good_wrong,
        errors=dict(out.good_errors),
        lost=out.lost,
        rejected=out.bad_rejected,
        resets=out.resets,
        after="ready" if out.ready_after else "NOT ready",
        seconds=round(out.seconds, 2),
        # What the poisoned requests got other than InputValidationError ("answered": a result).
        poisoned_other=dict(out.bad_other),
        rejection=out.rejection,
        good=out.good,
        poisoned=out.bad,
    )
    return _verdict(
        row,
        {
            "no request lost": out.lost == 0,
            "good: all 1800 ok": out.good_ok == out.good == 1800,
            "poisoned: all 60 InputValidationError": out.bad_rejected == out.bad == 60,
            "rejection names INVALID_ARGUMENT and id 1000": "INVALID_ARGUMENT" in out.rejection
            and "1000" in out.rejection,
            "no device reset": out.resets == 0,
            "model ready after": out.ready_after,
        },
    )


def done_c(mlp: Compiled) -> dict[str, Any]:
    plan = "recoverable:every=1:from=30:until=45:replica=1"
    sampler = Sampler()
    done = _sampling(served_again(), sampler)
    out = anyio.run(lambda: serve_until(*mlp, default_config(plan), done=done))
    row = _healing_row("c. burst knocks replica 1 out", plan, out, sampler)
    return _verdict(
        row,
        {
            "replica 1 left service": out.outages >= 1,
            "serving again within 30 s": out.back_after is not None and out.back_after < 30,
            "no error, wrong or lost": out.failed == 0 and out.wrong == 0 and out.lost == 0,
            "both replicas ready after": out.statuses == ["ready", "ready"],
        },
    )


def done_d(mlp: Compiled) -> dict[str, Any]:
    plan = "fatal:at=30:replica=1"
    sampler = Sampler()
    done = _sampling(served_again(), sampler)
    out = anyio.run(lambda: serve_until(*mlp, default_config(plan), done=done))
    row = _healing_row("d. fatal device replaced", plan, out, sampler)
    return _verdict(
        row,
        {
            "one outage": out.outages == 1,
            "serving again within 10 s": out.back_after is not None and out.back_after < 10,
            "no error, wrong or lost": out.failed == 0 and out.wrong == 0 and out.lost == 0,
        },
    )


def done_e_storm(mlp: Compiled) -> dict[str, Any]:
    plan = "crash:every=3"
    seen: dict[str, int] = {}
    sampler = Sampler()

    async def watch(runner: ModelRunner) -> None:
        # drive() cancels this side task once its callers are done, runner still open.
        try:
            while True:
                sampler.sample(runner)
                await anyio.sleep(0.005)
        finally:
            sampler.sample(runner)
            assert runner._replicas is not None
            seen["restarts"] = sum(c.restarts for c in runner._replicas.supervisor.children())
            seen["outages"] = sum(s.outages for s in runner.replica_states())

    t0 = time.perf_counter()
    out = anyio.run(
        lambda: drive(*mlp, default_config(plan), callers=100, per_caller=6, side_task=watch)
    )
    row = _row(
        "e. crash storm, crash/3",
        plan,
        **_counts(out),
        resets=out.resets,
        restarts=seen.get("restarts"),
        device_restarts=sampler.device_restarts,
        outages=seen.get("outages"),
        seconds=round(time.perf_counter() - t0, 2),
    )
    return _verdict(
        row,
        {
            "all answered ok": out.ok == out.sent,
            "both replicas ready after": out.statuses == ["ready", "ready"],
        },
    )


def done_e_dying(mlp: Compiled) -> dict[str, Any]:
    plan = "crash:every=1:from=20:replica=1"

    # Stop the callers after DYING_SECONDS (they finish the request in hand, so "lost" is
    # real, not a request cut at the bound); the bound is only a safety net.
    start: list[float] = []

    def done(_: ModelRunner) -> bool:
        if not start:
            start.append(time.perf_counter())
        return time.perf_counter() - start[0] >= DYING_SECONDS

    sampler = Sampler()
    stop = _sampling(done, sampler)
    out = anyio.run(
        lambda: serve_until(*mlp, default_config(plan), done=stop, bound=30.0, callers=32)
    )
    row = _healing_row("e. device dies each restart, 4 s", plan, out, sampler)
    return _verdict(
        row,
        {
            "replica 1 left service": out.outages >= 1,
            "no error or wrong": out.failed == 0 and out.wrong == 0,
            "no request lost": out.lost == 0,
            "restarts < 40 in 4 s (no tight loop)": out.restarts < 40,
            "replica 0 ready after": bool(out.statuses) and out.statuses[0] == "ready",
        },
    )


def _cell(value: Any, width: int) -> str:
    return f"{'-' if value is None else value:>{width}}"


def done_table(mlp: Compiled, embedding: Compiled) -> list[dict[str, Any]]:
    print("Self-healing (issue 11, Done when), default policy")
    print(
        f"{'scenario':34} {'sent':>6} {'ok':>6} {'wrong':>5} {'error':>5} {'lost':>4} "
        f"{'rejected':>8} {'resets':>6} {'replica rst':>11} {'device rst':>10} {'outages':>7} "
        f"{'back s':>6} {'after':>11} {'s':>5}  met"
    )
    scenarios: list[tuple[Callable[[Compiled], dict[str, Any]], Compiled]] = [
        (done_a, mlp),
        (done_b, embedding),
        (done_c, mlp),
        (done_d, mlp),
        (done_e_storm, mlp),
        (done_e_dying, mlp),
    ]
    rows = []
    for scenario, model in scenarios:
        row = scenario(model)
        rows.append(row)
        back = None if row["back_after_s"] is None else f"{row['back_after_s']:.2f}"
        print(
            f"{row['scenario']:34} {_cell(row['sent'], 6)} {_cell(row['ok'], 6)} "
            f"{_cell(row['wrong'], 5)} {_cell(row['error'], 5)} {_cell(row['lost'], 4)} "
            f"{_cell(row['rejected'], 8)} {_cell(row['resets'], 6)} "
            f"{_cell(row['restarts'], 11)} {_cell(row['device_restarts'], 10)} "
            f"{_cell(row['outages'], 7)} {_cell(back, 6)} "
            f"{_cell(row['after'], 11)} {row['seconds']:>5.1f}  {'yes' if row['met'] else 'NO'}",
            flush=True,
        )
    print(
        "  b: ok/wrong/error count the 1800 good requests, lost all 1860; rejected:"
        " poisoned ones answered InputValidationError\n"
        "  replica rst: replica subtrees replaced by the model's supervisor; device rst: device"
        " actor restarts (sampled); back s: replica 1 leaving service to serving again"
    )
    for row in rows:
        if row["errors"] or row.get("poisoned_other"):
            extra = f"; poisoned answered otherwise: {_types(row['poisoned_other'])}"
            print(
                f"  {row['scenario']}: errors {_types(row['errors'])}"
                + (extra if row.get("poisoned_other") else "")
            )
        if row["unmet"]:
            print(f"  {row['scenario']}: NOT MET: {'; '.join(row['unmet'])}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=200, help="table 1: concurrent callers")
    parser.add_argument("--per-caller", type=int, default=25, help="table 1: requests each")
    parser.add_argument("--only", choices=("done", "kinds"), help="run only this table")
    parser.add_argument(
        "--log-level",
        default="critical",
        choices=("debug", "info", "warning", "error", "critical"),
        help="runtime logs to stderr at this level and above (default: critical; the injected "
        "faults log thousands of expected warnings and errors)",
    )
    args = parser.parse_args()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[args.log_level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
    os.environ.setdefault("MODEL_RUNTIME_DEVICES", "cpu:2x1")
    os.environ.setdefault("MODEL_RUNTIME_DIR", tempfile.mkdtemp(prefix="mr-faults-"))
    results: dict[str, Any] = {}
    if args.only and RESULTS.exists():  # keep the other table's last figures
        previous = json.loads(RESULTS.read_text())
        if isinstance(previous, dict):
            results.update(previous)
    with tempfile.TemporaryDirectory() as tmp:
        mlp_model = make_mlp(sizes=(WIDTH, 48, 10), seed=5)
        mlp = (compile_to(mlp_model, Path(tmp), "mlp", batch_size=4), Reference(mlp_model))
        if args.only != "done":
            results["kinds"] = kinds_table(mlp, args.callers, args.per_caller)
        if args.only != "kinds":
            if args.only is None:
                print()
            emb_model = make_embedding(rows=TABLE_ROWS)
            embedding = (
                compile_to(emb_model, Path(tmp), "embedding", batch_size=8),
                Reference(emb_model),
            )
            results["done"] = done_table(mlp, embedding)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
