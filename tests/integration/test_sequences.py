"""Stateful models in process (issue 32): ``SequenceRunner`` over a real ``ModelRunner`` running
a compiled accumulator. Every answer is checked against the accumulator computed here."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from actors.clock import FakeClock
from model_runtime.errors import InputValidationError
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from model_runtime.sequences import (
    Control,
    ControlKind,
    SequenceConfig,
    SequenceRunner,
    SequenceStep,
    SequenceTable,
    StatePair,
)
from tests.faults.scenarios import default_config
from tests.integration.runner_support import compile_to
from tests.models import make_accumulator

pytestmark = pytest.mark.timeout(120)

I32 = np.dtype(np.int32)
CONFIG = SequenceConfig(
    controls=(
        Control(ControlKind.START, "START", I32),
        Control(ControlKind.READY, "READY", I32),
        Control(ControlKind.END, "END", I32),
        Control(ControlKind.CORRID, "CORRID", np.dtype(np.int64)),
    ),
    states=(StatePair("INPUT_STATE", "OUTPUT_STATE", I32, (1,)),),
    max_idle=5.0,
    slots=64,
)


@pytest.fixture(scope="module")
def accumulator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_to(make_accumulator(corrid=True), tmp_path_factory.mktemp("acc"), batch_size=8)


def value(v: int) -> dict[str, np.ndarray]:
    return {"INPUT": np.array([[v]], np.int32)}


async def steps(
    runner: SequenceRunner, sid: int | str, values: Sequence[int], corrid: int = 0
) -> list[int]:
    """One sequence, step after step; checks each answer against the accumulator."""
    total, got = 0, []
    for k, v in enumerate(values):
        end = k == len(values) - 1
        step = SequenceStep(sid, start=k == 0, end=end)
        out = await runner.execute(value(v), sequence=step)
        assert set(out) == {"OUTPUT"}, "the next state is the batcher's, not the client's"
        total += v
        want = total + (corrid if end else 0)
        assert int(out["OUTPUT"][0, 0]) == want, (sid, k, int(out["OUTPUT"][0, 0]), want)
        got.append(int(out["OUTPUT"][0, 0]))
    return got


async def test_sequences_share_batches_and_keep_their_own_state(accumulator: Path) -> None:
    config = ModelRunnerConfig(batching_dim=0, timeout=0.002)
    async with ModelRunner(accumulator, config) as inner:
        runner = SequenceRunner(inner, SequenceTable(CONFIG), "acc")
        runner.check()
        assert [d.name for d in runner.get_execute_inputs()] == ["INPUT"]
        assert [d.name for d in runner.get_execute_outputs()] == ["OUTPUT"]
        rng = np.random.default_rng(0)
        plans = {1000 + s: rng.integers(-50, 50, size=12).tolist() for s in range(16)}
        await asyncio.gather(*(steps(runner, s, v, corrid=s) for s, v in plans.items()))
        runs = sum(s.runs for s in inner.replica_states())
        assert runs < 16 * 12, f"{runs} runs for {16 * 12} steps: sequences never shared a batch"
        assert runner.table.live == 0  # every sequence ended
        counts = runner.table.counts
        assert (counts.started, counts.ended, counts.steps) == (16, 16, 16 * 12)


async def test_steps_of_one_sequence_run_in_order(accumulator: Path) -> None:
    async with ModelRunner(accumulator, ModelRunnerConfig(batching_dim=0)) as inner:
        runner = SequenceRunner(inner, SequenceTable(CONFIG), "acc")
        first = await runner.execute(value(1), sequence=SequenceStep(7, start=True))
        assert int(first["OUTPUT"][0, 0]) == 1
        # All sent at once: each must see the state its predecessor left.
        outs = await asyncio.gather(
            *(runner.execute(value(k), sequence=SequenceStep(7)) for k in range(2, 22))
        )
        totals = [int(o["OUTPUT"][0, 0]) for o in outs]
        assert totals == np.cumsum(range(1, 22)).tolist()[1:]


async def test_triton_rules_with_clear_errors(accumulator: Path) -> None:
    clock = FakeClock()
    async with ModelRunner(accumulator, ModelRunnerConfig(batching_dim=0)) as inner:
        runner = SequenceRunner(inner, SequenceTable(CONFIG, clock), "acc")
        with pytest.raises(InputValidationError, match="must specify a non-zero or non-empty"):
            await runner.execute(value(1))
        with pytest.raises(InputValidationError, match="must specify the START flag"):
            await runner.execute(value(1), sequence=SequenceStep(5))
        with pytest.raises(InputValidationError, match="must specify batch-size 1"):
            await runner.execute(
                {"INPUT": np.ones((2, 1), np.int32)}, sequence=SequenceStep(5, start=True)
            )
        await runner.execute(value(3), sequence=SequenceStep(5, start=True))
        # A failed step (a bad input) changes nothing: the next step sees the same state.
        with pytest.raises(InputValidationError):
            await runner.execute({"INPUT": np.ones((1, 1), np.float32)}, sequence=SequenceStep(5))
        out = await runner.execute(value(4), sequence=SequenceStep(5))
        assert int(out["OUTPUT"][0, 0]) == 7
        # A second START ends the live sequence and begins anew (Triton's rule).
        out = await runner.execute(value(10), sequence=SequenceStep(5, start=True))
        assert int(out["OUTPUT"][0, 0]) == 10 and runner.table.counts.restarted == 1
        # Idle past max_idle: released, and its next request says so.
        clock.advance(CONFIG.max_idle + 0.1)
        with pytest.raises(InputValidationError, match="released after 5 s without a request"):
            await runner.execute(value(1), sequence=SequenceStep(5))
        assert runner.table.counts.released_idle == 1
        # An ended sequence says it ended.
        await runner.execute(value(1), sequence=SequenceStep(6, start=True, end=True))
        with pytest.raises(InputValidationError, match="ended"):
            await runner.execute(value(1), sequence=SequenceStep(6))


async def test_a_new_sequence_waits_for_a_slot_then_times_out(accumulator: Path) -> None:
    config = SequenceConfig(CONFIG.controls, CONFIG.states, max_idle=60.0, slots=1)
    async with ModelRunner(accumulator, ModelRunnerConfig(batching_dim=0)) as inner:
        runner = SequenceRunner(inner, SequenceTable(config), "acc")
        await runner.execute(value(1), sequence=SequenceStep(1, start=True))
        waiting = asyncio.create_task(
            runner.execute(value(2), sequence=SequenceStep(2, start=True, end=True))
        )
        for _ in range(1000):  # until the second START waits for the slot (bounded)
            if runner.table.waiting:
                break
            await asyncio.sleep(0)
        assert not waiting.done() and runner.table.live == 1, "two sequences in one slot"
        await runner.execute(value(1), sequence=SequenceStep(1, end=True))  # frees the slot
        out = await asyncio.wait_for(waiting, 5)
        assert int(out["OUTPUT"][0, 0]) == 2 + 2  # its END adds its CORRID
        await runner.execute(value(1), sequence=SequenceStep(3, start=True))
        with pytest.raises(TimeoutError, match="sequence slots stayed in use"):
            await runner.execute(value(1), sequence=SequenceStep(4, start=True), timeout=0.05)


async def test_state_survives_faults_on_two_replicas(accumulator: Path) -> None:
    """The fault suite's default policy and plan (recoverable faults on both replicas, one
    replica's device crashing for good mid-run): no step lost or applied twice."""
    plan = "recoverable:every=20;crash:every=1:from=60:replica=1"
    async with ModelRunner(accumulator, default_config(plan)) as inner:
        runner = SequenceRunner(inner, SequenceTable(CONFIG), "acc")
        rng = np.random.default_rng(1)
        plans = {s: rng.integers(-9, 9, size=50).tolist() for s in range(1, 201)}
        await asyncio.gather(*(steps(runner, s, v, corrid=s) for s, v in plans.items()))
        states = inner.replica_states()
        assert sum(s.resets for s in states) >= 2, "the recoverable faults did not happen"
        assert states[1].restarts >= 1, "replica 1's device never crashed"
        assert runner.table.counts.failed_steps == 0  # every fault was retried away


def test_the_embedded_runtime_runs_sequences(accumulator: Path) -> None:
    from model_runtime.embedded import (
        embedded_runtime_call_sync,
        embedded_runtime_start_sync,
        embedded_runtime_stop,
    )

    ctx = embedded_runtime_start_sync(accumulator, [], "sequences-test", sequences=CONFIG)
    try:
        assert ctx.stateful and [d.name for d in ctx.signature] == ["INPUT"]
        assert [d.name for d in ctx.output_types] == ["OUTPUT"]
        totals = {7: 0, 8: 0}
        for k in range(5):
            for sid in totals:
                step = SequenceStep(sid, start=k == 0, end=k == 4)
                (out,) = embedded_runtime_call_sync(value(sid * k), ctx, sequence=step)
                totals[sid] += sid * k
                assert int(out[0, 0]) == totals[sid] + (sid if k == 4 else 0)
        with pytest.raises(InputValidationError, match="must specify the START flag"):
            embedded_runtime_call_sync(value(1), ctx, sequence=SequenceStep(7))  # it ended
    finally:
        embedded_runtime_stop("sequences-test")
