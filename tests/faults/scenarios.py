"""Self-healing scenarios (issue 11's "Done when"), shared by the fault suite and
``benchmarks/fault_recovery.py``: each runs the runtime with its **default** policy under
concurrent load, checks every answer against the reference, and returns what a user would
count.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import numpy as np

from model_runtime.errors import InputValidationError, ModelRuntimeError
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.faults.harness import WIDTH
from tests.integration.runner_support import Reference

#: Rows of the poisoned scenario's embedding table; id 1000 is out of range.
TABLE_ROWS = 100
BAD_ID = 1000


def default_config(plan: str | None = None, **overrides: object) -> ModelRunnerConfig:
    """Two replicas, dynamic batching, auto_reset: every recovery limit at its default."""
    base: dict[str, object] = {
        "replication_factor": 2,
        "batching_dim": 0,
        "timeout": 0.0005,
        "auto_reset": True,
        "fault_plan": plan,
    }
    base.update(overrides)
    return ModelRunnerConfig(**base)  # type: ignore[arg-type]


@dataclass
class Poisoned:
    good: int = 0
    good_ok: int = 0
    good_wrong: int = 0
    good_errors: Counter[str] = field(default_factory=Counter)
    bad: int = 0
    bad_rejected: int = 0
    bad_other: Counter[str] = field(default_factory=Counter)
    rejection: str = ""
    lost: int = 0
    resets: int = 0
    ready_after: bool = False
    seconds: float = 0.0


async def poisoned_requests(
    path: Path, reference: Reference, *, good: int = 1800, bad: int = 60, seed: int = 0
) -> Poisoned:
    """``bad`` requests that make onnxruntime fail (an id past the table) mixed at random into
    ``good`` ones, all concurrent, on an embedding model with the default policy."""
    rng = np.random.default_rng(seed)
    total = good + bad
    poisoned = set(rng.choice(total, bad, replace=False).tolist())
    ids = []
    for i in range(total):
        x = rng.integers(0, TABLE_ROWS, size=int(rng.integers(1, 6)), dtype=np.int64)
        if i in poisoned:
            x[int(rng.integers(0, len(x)))] = BAD_ID
        ids.append(x)
    expected = [
        None if i in poisoned else reference({"ids": x})["vectors"] for i, x in enumerate(ids)
    ]
    out = Poisoned(good=good, bad=bad)
    answered = [False] * total
    t0 = time.perf_counter()
    async with ModelRunner(path, default_config()) as runner:

        async def caller(indices: list[int]) -> None:
            for i in indices:
                try:
                    got = await runner.execute({"ids": ids[i]})
                except InputValidationError as exc:
                    if i in poisoned:
                        out.bad_rejected += 1
                        out.rejection = str(exc)
                    else:
                        out.good_errors["InputValidationError"] += 1
                except ModelRuntimeError as exc:
                    (out.bad_other if i in poisoned else out.good_errors)[type(exc).__name__] += 1
                else:
                    want = expected[i]
                    if want is None:
                        out.bad_other["answered"] += 1
                    elif np.allclose(got["vectors"], want):
                        out.good_ok += 1
                    else:
                        out.good_wrong += 1
                answered[i] = True

        order = list(range(total))
        random.Random(seed).shuffle(order)
        with anyio.move_on_after(60):
            async with anyio.create_task_group() as tg:
                for c in range(200):
                    tg.start_soon(caller, order[c::200])
        out.ready_after = runner.is_ready
        out.resets = sum(s.resets for s in runner.replica_states())
    out.lost = answered.count(False)
    out.seconds = time.perf_counter() - t0
    return out


@dataclass
class Healing:
    sent: int = 0
    ok: int = 0
    wrong: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    outages: int = 0
    #: seconds from the replica leaving service to its first batch served again
    back_after: float | None = None
    #: the watched replica's supervisor restarts, and the model's
    restarts: int = 0
    statuses: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> int:
        return sum(self.errors.values())


async def serve_until(
    path: Path,
    reference: Reference,
    config: ModelRunnerConfig,
    *,
    done: Callable[[ModelRunner], bool],
    watch: int = 1,
    callers: int = 64,
    bound: float = 60.0,
    seed: int = 0,
) -> Healing:
    """Closed-loop callers (1-9 rows each, every answer checked) until ``done(runner)`` holds
    or ``bound`` seconds pass; tracks replica ``watch`` leaving service and coming back."""
    out = Healing()
    rng = random.Random(seed)
    pool = np.random.default_rng(seed).standard_normal((4096, WIDTH)).astype(np.float32)
    truth = reference({"x": pool})["logits"]
    t0 = time.perf_counter()
    async with ModelRunner(path, config) as runner:
        state = runner.replica_states()[watch]
        left_at: float | None = None
        served_at_return = 0
        stop = anyio.Event()

        async def observer() -> None:
            nonlocal left_at, served_at_return
            while not stop.is_set():
                if left_at is None and state.outages:
                    left_at = time.perf_counter()
                    served_at_return = state.runs
                if (
                    left_at is not None
                    and out.back_after is None
                    and state.status.value == "ready"
                    and state.runs > served_at_return
                ):
                    out.back_after = time.perf_counter() - left_at
                if done(runner):
                    stop.set()
                await anyio.sleep(0.005)

        async def caller() -> None:
            while not stop.is_set():
                n = rng.randint(1, 9)
                at = rng.randrange(0, len(pool) - n)
                out.sent += 1
                try:
                    got = await runner.execute({"x": pool[at : at + n]})
                except ModelRuntimeError as exc:
                    out.errors[type(exc).__name__] += 1
                    continue
                if np.allclose(got["logits"], truth[at : at + n], rtol=1e-4, atol=1e-5):
                    out.ok += 1
                else:
                    out.wrong += 1

        with anyio.move_on_after(bound):
            async with anyio.create_task_group() as tg:
                tg.start_soon(observer)
                for _ in range(callers):
                    tg.start_soon(caller)
        stop.set()
        out.outages = state.outages
        out.statuses = [s.value for s in runner.replica_status()]
        assert runner._replicas is not None
        out.restarts = sum(c.restarts for c in runner._replicas.supervisor.children())
    out.lost = out.sent - out.ok - out.wrong - out.failed
    out.seconds = time.perf_counter() - t0
    return out


def served_again(watch: int = 1, runs: int = 50) -> Callable[[ModelRunner], bool]:
    """Done once replica ``watch`` has left service, come back, and served ``runs`` batches
    more than it had when it came back."""
    mark: list[int] = []

    def done(runner: ModelRunner) -> bool:
        state = runner.replica_states()[watch]
        if not state.outages or not state.is_ready:
            return False
        if not mark:
            mark.append(state.runs)
        return state.runs >= mark[0] + runs

    return done
