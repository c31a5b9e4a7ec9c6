"""Stateful models in process (issue 32): ``SequenceRunner`` over a real ``ModelRunner`` running
a compiled accumulator. Every answer is checked against the accumulator computed here."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from actors.clock import FakeClock
from model_runtime.errors import ExecutionTimeoutError, InputValidationError
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


async def test_a_slot_waiter_runs_on_the_tables_clock(accumulator: Path) -> None:
    """A new sequence waiting for the one slot gets it when the idle sequence holding it is
    released, as the table's (fake) clock passes max_idle: no real seconds waited; and its
    timeout is on that clock too."""
    clock = FakeClock()
    config = SequenceConfig(CONFIG.controls, CONFIG.states, max_idle=5.0, slots=1)
    async with ModelRunner(accumulator, ModelRunnerConfig(batching_dim=0)) as inner:
        runner = SequenceRunner(inner, SequenceTable(config, clock), "acc")
        await runner.execute(value(1), sequence=SequenceStep(1, start=True))
        waiting = asyncio.create_task(
            runner.execute(value(2), sequence=SequenceStep(2, start=True, end=True))
        )
        for _ in range(1000):  # until it waits for the slot, on the clock (bounded)
            if runner.table.waiting and clock.sleepers:
                break
            await asyncio.sleep(0)
        assert runner.table.waiting == 1 and clock.sleepers, "not waiting on the table's clock"
        clock.advance(5.1)  # sequence 1 idles past max_idle: released, its slot freed
        out = await asyncio.wait_for(waiting, 2)  # real seconds: far below the 5 s limit
        assert int(out["OUTPUT"][0, 0]) == 2 + 2  # its END adds its CORRID
        assert runner.table.counts.released_idle == 1
        await runner.execute(value(1), sequence=SequenceStep(3, start=True))
        late = asyncio.create_task(
            runner.execute(value(1), sequence=SequenceStep(4, start=True), timeout=1.0)
        )
        for _ in range(1000):
            if runner.table.waiting and clock.sleepers:
                break
            await asyncio.sleep(0)
        clock.advance(1.0)  # the waiter's timeout passes on the clock (sequence 3 not idle yet)
        with pytest.raises(ExecutionTimeoutError, match="sequence slots stayed in use"):
            await asyncio.wait_for(late, 2)


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
        with pytest.raises(ExecutionTimeoutError, match="sequence slots stayed in use"):
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
        # Live sequences went on past the faults from their host-kept states, and were counted.
        assert 0 < runner.table.counts.restored <= runner.table.counts.steps


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


class Gated:
    """The real runner behind a gate: a step whose INPUT is ``held`` waits for ``gate``."""

    def __init__(self, runner: ModelRunner, held: int) -> None:
        self.runner, self.held = runner, held
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def execute(self, inputs: dict[str, np.ndarray], *args: object) -> dict[str, np.ndarray]:
        if int(inputs["INPUT"][0, 0]) == self.held:
            self.waiting.set()
            await self.gate.wait()
        return await self.runner.execute(inputs, *args)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(self.runner, name)


async def test_a_step_cancelled_while_waiting_keeps_the_order(accumulator: Path) -> None:
    """Step 2 is cancelled while step 1 runs: step 3 still waits for step 1, and sees it."""
    async with ModelRunner(accumulator, ModelRunnerConfig(batching_dim=0)) as inner:
        gated = Gated(inner, held=100)
        runner = SequenceRunner(gated, SequenceTable(CONFIG), "acc")
        first = asyncio.create_task(
            runner.execute(value(100), sequence=SequenceStep(1, start=True))
        )
        await gated.waiting.wait()
        second = asyncio.create_task(runner.execute(value(5), sequence=SequenceStep(1)))
        third = asyncio.create_task(runner.execute(value(1), sequence=SequenceStep(1)))
        await asyncio.sleep(0)  # both are queued behind the first
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        assert not third.done(), "the third step ran beside the first"
        gated.gate.set()
        assert int((await first)["OUTPUT"][0, 0]) == 100
        assert int((await third)["OUTPUT"][0, 0]) == 101  # the cancelled step was not applied


async def test_slots_free_up_for_waiters_and_steps_queue_behind_a_waiting_start(
    accumulator: Path,
) -> None:
    """One slot. A's step is in flight when B starts: B waits, and the step sent right after
    B's START queues behind it (not refused). When A goes idle, B gets the slot."""
    config = SequenceConfig(CONFIG.controls, CONFIG.states, max_idle=0.2, slots=1)
    async with ModelRunner(accumulator, ModelRunnerConfig(batching_dim=0)) as inner:
        gated = Gated(inner, held=100)
        runner = SequenceRunner(gated, SequenceTable(config), "acc")
        await runner.execute(value(1), sequence=SequenceStep(1, start=True))
        busy = asyncio.create_task(runner.execute(value(100), sequence=SequenceStep(1)))
        await gated.waiting.wait()
        b_start = asyncio.create_task(
            runner.execute(value(3), sequence=SequenceStep(2, start=True), timeout=10)
        )
        b_next = asyncio.create_task(runner.execute(value(4), sequence=SequenceStep(2)))
        await asyncio.sleep(0)
        assert runner.table.waiting == 1
        gated.gate.set()
        assert int((await busy)["OUTPUT"][0, 0]) == 101
        started = asyncio.get_running_loop().time()
        assert int((await asyncio.wait_for(b_start, 5))["OUTPUT"][0, 0]) == 3
        assert asyncio.get_running_loop().time() - started < 2.0, "the waiter slept on"
        assert int((await b_next)["OUTPUT"][0, 0]) == 7
        with pytest.raises(InputValidationError, match=r"released after 0\.2 s"):
            await runner.execute(value(1), sequence=SequenceStep(1))


async def test_a_new_start_runs_after_the_old_sequences_steps(accumulator: Path) -> None:
    async with ModelRunner(accumulator, ModelRunnerConfig(batching_dim=0)) as inner:
        gated = Gated(inner, held=100)
        runner = SequenceRunner(gated, SequenceTable(CONFIG), "acc")
        await runner.execute(value(1), sequence=SequenceStep(9, start=True))
        old = asyncio.create_task(runner.execute(value(100), sequence=SequenceStep(9)))
        await gated.waiting.wait()
        new = asyncio.create_task(runner.execute(value(7), sequence=SequenceStep(9, start=True)))
        await asyncio.sleep(0)
        assert not new.done()
        gated.gate.set()
        assert int((await old)["OUTPUT"][0, 0]) == 101  # on the old state
        assert int((await new)["OUTPUT"][0, 0]) == 7  # then anew
        out = await runner.execute(value(1), sequence=SequenceStep(9, end=True))
        assert int(out["OUTPUT"][0, 0]) == 8 + 9  # its END adds its CORRID
        assert runner.table.live == 0 and runner.table.counts.restarted == 1


async def test_an_id_the_corrid_cannot_hold_is_refused_before_it_takes_a_slot(
    accumulator: Path,
) -> None:
    async with ModelRunner(accumulator, ModelRunnerConfig(batching_dim=0)) as inner:
        runner = SequenceRunner(inner, SequenceTable(CONFIG), "acc")
        for bad in (2**70, "not-a-number"):
            with pytest.raises(InputValidationError, match="does not fit the model's CORRID"):
                await runner.execute(value(1), sequence=SequenceStep(bad, start=True))
        assert runner.table.live == 0
