"""Load generator for the fault-injection suite: many callers, mixed sizes, every answer checked.

Each request's expected output is computed up front with plain onnxruntime on the original
model, so every successful answer is compared row for row with the truth. The outcome counts
what a user would count: sent, answered OK, answered with an error (by type), wrong answers,
and lost (never answered within the bound).
"""

from __future__ import annotations

import os
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import numpy as np

from model_runtime.errors import ModelRuntimeError
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.integration.runner_support import Reference

WIDTH = 32


@dataclass
class Outcome:
    sent: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    wrong: int = 0
    cancelled: int = 0
    lost: int = 0
    resets: int = 0
    retries: int = 0
    faults: int = 0
    recovery_times: list[float] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    threads_before: int = 0
    threads_after: int = 0
    rss_before: int = 0
    rss_after: int = 0

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    @property
    def answered(self) -> int:
        return self.ok + self.failed + self.wrong


async def drive(
    path: Path,
    reference: Reference,
    config: ModelRunnerConfig,
    *,
    callers: int = 200,
    per_caller: int = 4,
    seed: int = 0,
    cancel_rate: float = 0.0,
    deadline_rate: float = 0.0,
    bound: float = 90.0,
    side_task: Callable[[ModelRunner], Awaitable[None]] | None = None,
) -> Outcome:
    """Run ``callers`` concurrent callers of ``per_caller`` requests each and count outcomes."""
    rng = random.Random(seed)
    plan = []
    for c in range(callers):
        for k in range(per_caller):
            n = rng.randint(1, 9)
            x = np.random.default_rng(seed * 100_000 + c * 100 + k).standard_normal((n, WIDTH))
            plan.append((c, x.astype(np.float32)))
    expected = reference({"x": np.concatenate([x for _, x in plan])})["logits"]
    offsets = np.cumsum([0] + [len(x) for _, x in plan])
    out = Outcome(sent=len(plan))
    answered = [0] * len(plan)
    by_caller: dict[int, list[int]] = {}
    for i, (c, _) in enumerate(plan):
        by_caller.setdefault(c, []).append(i)

    async with ModelRunner(path, config) as runner:
        # Baseline once serving: every device's worker thread exists by now.
        out.threads_before = threading.active_count()
        out.rss_before = _rss()

        async def caller(indices: list[int]) -> None:
            for i in indices:
                x = plan[i][1]
                timeout = 0.05 if rng.random() < deadline_rate else None
                with anyio.CancelScope() as scope:
                    if rng.random() < cancel_rate:
                        scope.deadline = anyio.current_time() + rng.random() * 0.01
                    try:
                        got = await runner.execute({"x": x}, timeout=timeout)
                    except ModelRuntimeError as exc:
                        answered[i] += 1
                        out.errors[type(exc).__name__] += 1
                        continue
                    answered[i] += 1
                    want = expected[offsets[i] : offsets[i + 1]]
                    if np.allclose(got["logits"], want, rtol=1e-4, atol=1e-5):
                        out.ok += 1
                    else:
                        out.wrong += 1
                if scope.cancelled_caught:
                    out.cancelled += 1
                    answered[i] += 1

        with anyio.move_on_after(bound):
            async with anyio.create_task_group() as outer:
                if side_task is not None:
                    outer.start_soon(side_task, runner)
                async with anyio.create_task_group() as tg:
                    for indices in by_caller.values():
                        tg.start_soon(caller, indices)
                outer.cancel_scope.cancel()
        # After every fault and recovery, still serving: worker threads replaced after a crash
        # or a hang exit right after their last job; give them a bounded moment.
        with anyio.move_on_after(5):
            while threading.active_count() > out.threads_before:  # noqa: ASYNC110 - threads
                await anyio.sleep(0.01)
        out.threads_after = threading.active_count()
        out.rss_after = _rss()
        for state in runner.replica_states():
            out.resets += state.resets
            out.retries += state.retries
            out.faults += state.faults
            out.recovery_times.extend(state.recovery_times)
        out.statuses = [s.value for s in runner.replica_status()]
    out.lost = sum(1 for a in answered if a == 0)
    assert all(a <= 1 for a in answered), "a request was answered twice"
    return out


def _rss() -> int:
    """Resident set size in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
