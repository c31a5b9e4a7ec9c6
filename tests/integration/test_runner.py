"""ModelRunner semantics a caller notices: right rows, batching, flushing, replicas, state."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from actors.clock import FakeClock
from actors.device import inline
from actors.device.backends.cpu import CpuBackend
from model_runtime.blocking import BlockingModelRunner
from model_runtime.errors import (
    ExecutionTimeoutError,
    InputValidationError,
    QueueFullError,
    RunnerStoppedError,
)
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.integration.runner_support import Reference, compile_to
from tests.models import make_counter, make_embedding, make_mlp

pytestmark = pytest.mark.timeout(60)

SIZES = (32, 48, 10)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Reference]:
    """One batch size (no buckets): the seed's fixed-batch queue, padding and timeouts."""
    model = make_mlp(sizes=SIZES, seed=3)
    tmp = tmp_path_factory.mktemp("mlp")
    return compile_to(model, tmp, batch_size=4, batch_buckets=False), Reference(model)


@pytest.fixture(scope="module")
def mlp_buckets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Reference]:
    """The same model compiled with its batch-size buckets (the compiler's default)."""
    model = make_mlp(sizes=SIZES, seed=3)
    tmp = tmp_path_factory.mktemp("mlp_buckets")
    return compile_to(model, tmp, batch_size=8), Reference(model)


@pytest.fixture(scope="module")
def mlp_iter3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("mlp3")
    return compile_to(make_mlp(sizes=SIZES, seed=3), tmp, batch_size=2, device_iterations=3)


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, SIZES[0])).astype(np.float32)


async def within(aw: Awaitable[Any], seconds: float = 20.0) -> Any:
    with anyio.fail_after(seconds):
        return await aw


@pytest.mark.parametrize("n", [1, 3, 4, 5, 14])
async def test_any_request_size_gets_exactly_its_rows(mlp: tuple[Path, Reference], n: int) -> None:
    path, ref = mlp
    x = rows(n, seed=n)
    async with ModelRunner(path, ModelRunnerConfig(batching_dim=0, timeout=0.001)) as runner:
        out = await within(runner.execute({"x": x}))
    assert out["logits"].shape == (n, SIZES[-1])
    np.testing.assert_allclose(out["logits"], ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)


async def test_without_batching_dim_requests_are_whole_batches(
    mlp: tuple[Path, Reference],
) -> None:
    path, ref = mlp
    async with ModelRunner(path) as runner:
        x = rows(12, seed=1)
        out = await within(runner.execute({"x": x}))
        np.testing.assert_allclose(out["logits"], ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)
        with pytest.raises(InputValidationError, match="multiple of the model's batch size 4"):
            runner.execute_async({"x": rows(5, seed=2)})
        # The runner keeps serving after a bad request.
        out = await within(runner.execute({"x": x[:4]}))
        assert out["logits"].shape == (4, SIZES[-1])


async def test_a_thousand_concurrent_mixed_callers_get_their_own_rows(
    mlp: tuple[Path, Reference],
) -> None:
    path, ref = mlp
    rng = np.random.default_rng(7)
    sizes = rng.integers(1, 10, size=1000)
    data = [rows(int(n), seed=i) for i, n in enumerate(sizes)]
    results: list[np.ndarray | None] = [None] * len(data)
    config = ModelRunnerConfig(replication_factor=2, batching_dim=0, timeout=0.001)
    async with ModelRunner(path, config) as runner:

        async def call(i: int) -> None:
            results[i] = (await runner.execute({"x": data[i]}))["logits"]

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(len(data)):
                    tg.start_soon(call, i)
        counts = [
            (await runner.get_monitoring_statistics_total_count(r))[
                "request_monitoring_statistics_count"
            ]
            for r in range(2)
        ]
        # Replica 1 stands by where its device has no core of its own (two cores: the loop's
        # and replica 0's); every replica in service serves.
        serving = [c for c, s in zip(counts, runner.replica_states(), strict=True) if not s.standby]
    expected = ref({"x": np.concatenate(data)})["logits"]
    offset = 0
    for i, x in enumerate(data):
        got = results[i]
        assert got is not None and got.shape == (len(x), SIZES[-1])
        np.testing.assert_allclose(got, expected[offset : offset + len(x)], rtol=1e-4, atol=1e-5)
        offset += len(x)
    assert sum(serving) == 1000 and min(serving) > 0, "every replica in service served"


async def test_partial_batch_flushes_after_timeout_with_padding_discarded(
    mlp: tuple[Path, Reference],
) -> None:
    path, ref = mlp
    clock = FakeClock()
    x = rows(1, seed=11)
    config = ModelRunnerConfig(batching_dim=0, timeout=5.0)
    async with ModelRunner(path, config, clock=clock) as runner:
        result: dict[str, np.ndarray] = {}
        answered = anyio.Event()

        async def call() -> None:
            result.update(await runner.execute({"x": x}))
            answered.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await anyio.wait_all_tasks_blocked()
            clock.advance(4.9)
            await anyio.wait_all_tasks_blocked()
            assert not result, "flushed before the timeout"
            clock.advance(0.1)
            await within(answered.wait())
    assert result["logits"].shape == (1, SIZES[-1])
    np.testing.assert_allclose(result["logits"], ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)


async def test_flush_callback_supplies_the_padding(mlp: tuple[Path, Reference]) -> None:
    path, ref = mlp
    calls: list[Any] = []

    def flush_callback(*args: Any) -> None:
        calls.append(args)

    config = ModelRunnerConfig(batching_dim=0, timeout=0.001, flush_callback=flush_callback)
    x = rows(2, seed=5)
    async with ModelRunner(path, config) as runner:
        out = await within(runner.execute({"x": x}))
    assert calls, "the flush callback was not used"
    np.testing.assert_allclose(out["logits"], ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)


async def test_timeout_zero_waits_for_a_full_batch_and_cancelled_rows_leave(
    mlp: tuple[Path, Reference],
) -> None:
    path, ref = mlp
    clock = FakeClock()
    config = ModelRunnerConfig(batching_dim=0, timeout=0.0)
    x = rows(4, seed=2)
    async with ModelRunner(path, config, clock=clock) as runner, anyio.create_task_group() as tg:
        waiter = anyio.CancelScope()

        async def abandoned() -> None:
            with waiter:
                await runner.execute({"x": rows(2, seed=1)})

        tg.start_soon(abandoned)
        await anyio.wait_all_tasks_blocked()
        clock.advance(1e6)  # timeout=0: time alone never flushes
        await anyio.wait_all_tasks_blocked()
        waiter.cancel()
        await anyio.wait_all_tasks_blocked()
        # Had the cancelled rows stayed, these 4 would wait forever for a fifth and sixth.
        out = await within(runner.execute({"x": x}), 20)
    np.testing.assert_allclose(out["logits"], ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)


async def test_request_deadline_answers_with_a_typed_error_and_frees_the_batcher(
    mlp: tuple[Path, Reference],
) -> None:
    path, _ = mlp
    clock = FakeClock()
    async with ModelRunner(path, ModelRunnerConfig(batching_dim=0, timeout=0.0), clock=clock) as r:
        errors: list[BaseException] = []

        async def late() -> None:
            try:
                await r.execute({"x": rows(1, seed=0)}, timeout=2.0)
            except ExecutionTimeoutError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(late)
            await anyio.wait_all_tasks_blocked()
            clock.advance(2.0)
        assert len(errors) == 1
        assert str(errors[0]).startswith("Request timeout expired")  # Triton's words first
        out = await within(r.execute({"x": rows(4, seed=3)}))
        assert out["logits"].shape == (4, SIZES[-1])


async def test_device_iterations_consume_several_batches_per_run(mlp_iter3: Path) -> None:
    model = make_mlp(sizes=SIZES, seed=3)
    ref = Reference(model)
    config = ModelRunnerConfig(batching_dim=0, timeout=0.0)
    async with ModelRunner(mlp_iter3, config) as runner:
        x = rows(6, seed=9)
        outs = await within(_gather([runner.execute({"x": x[i : i + 1]}) for i in range(6)]))
        runs = runner.replica_states()[0].runs
    got = np.concatenate([o["logits"] for o in outs])
    np.testing.assert_allclose(got, ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)
    assert runs == 1, "six samples at B=2, I=3 are one main run"


async def _gather(aws: list[Awaitable[dict[str, np.ndarray]]]) -> list[dict[str, np.ndarray]]:
    out: list[dict[str, np.ndarray]] = [{} for _ in aws]

    async def one(i: int, aw: Awaitable[dict[str, np.ndarray]]) -> None:
        out[i] = await aw

    async with anyio.create_task_group() as tg:
        for i, aw in enumerate(aws):
            tg.start_soon(one, i, aw)
    return out


async def test_replica_pinning_and_explicit_replica(mlp: tuple[Path, Reference]) -> None:
    path, _ = mlp
    config = ModelRunnerConfig(replication_factor=2, replica_to_device={0: 3, 1: 2})
    async with ModelRunner(path, config) as runner:
        assert [s.device_id for s in runner.replica_states()] == [3, 2]
        await within(runner.execute({"x": rows(4, seed=1)}, replica_id=1))
        assert [s.runs for s in runner.replica_states()] == [0, 1]
        with pytest.raises(InputValidationError, match="replica_id 2 is out of range"):
            runner.execute_async({"x": rows(4, seed=1)}, replica_id=2)


async def test_state_persists_and_save_programs_return_it(tmp_path: Path) -> None:
    path = compile_to(
        make_counter(width=4),
        tmp_path,
        batch_size=2,
        variables=("count",),
        variable_updates={"count_next": "count"},
    )
    config = ModelRunnerConfig(run_save_programs=True)
    x = np.zeros((2, 4), np.float32)
    async with ModelRunner(path, config) as runner:
        assert [d.name for d in runner.get_execute_outputs()] == ["y"]
        results = [await within(runner.execute({"x": x})) for _ in range(3)]
        seen = [float(r["y"][0, 0]) for r in results]
        assert all(set(r) == {"y"} for r in results), "variable updates are not outputs"
    assert seen == [0.0, 1.0, 2.0], "the variable lives on the device between runs"
    assert config.replica_to_save_programs_outputs[0]["count"].tolist() == [3.0]


async def test_save_programs_fill_the_callers_buffer_in_place(tmp_path: Path) -> None:
    """Seed: the save programs' outputs go to caller memory: a buffer placed in
    replica_to_save_programs_outputs is written, not replaced."""
    path = compile_to(
        make_counter(width=4),
        tmp_path,
        batch_size=2,
        variables=("count",),
        variable_updates={"count_next": "count"},
    )
    mine = np.full(1, -1.0, np.float32)
    config = ModelRunnerConfig(
        run_save_programs=True, replica_to_save_programs_outputs={0: {"count": mine}}
    )
    async with ModelRunner(path, config) as runner:
        for _ in range(2):
            await within(runner.execute({"x": np.zeros((2, 4), np.float32)}))
    assert config.replica_to_save_programs_outputs[0]["count"] is mine
    assert mine.tolist() == [2.0]


async def test_bad_input_is_typed_and_the_runner_keeps_serving(
    mlp: tuple[Path, Reference],
) -> None:
    path, ref = mlp
    async with ModelRunner(path, ModelRunnerConfig(batching_dim=0, timeout=0.001)) as runner:
        for _ in range(2):  # what follows differs from a good request, seen and cached
            await within(runner.execute({"x": rows(1, 0)}))
        bad: list[tuple[dict[str, Any], str]] = [
            ({"y": rows(1, 0)}, "unknown"),
            ({}, "missing"),
            ({"x": rows(1, 0).astype(np.float64)}, "dtype float64"),
            ({"x": np.zeros((1, 7), np.float32)}, "shape"),
            ({"x": np.zeros((0, SIZES[0]), np.float32)}, "at least one sample"),
        ]
        for inputs, message in bad:
            with pytest.raises(InputValidationError, match=message):
                runner.execute_async(inputs)
        with pytest.raises(InputValidationError, match="output buffer"):
            runner.execute_async(
                {"x": rows(2, 0)}, outputs={"logits": np.zeros((3, 10), np.float32)}
            )
        # Non-contiguous and read-only inputs work and are not modified.
        base = rows(6, seed=4)
        strided = base[::2]
        frozen = rows(3, seed=5)
        frozen.flags.writeable = False
        for x in (strided, frozen):
            before = x.copy()
            out = await within(runner.execute({"x": x}))
            np.testing.assert_array_equal(x, before)
            np.testing.assert_allclose(
                out["logits"], ref({"x": np.ascontiguousarray(x)})["logits"], rtol=1e-4, atol=1e-5
            )
        # Caller-provided output buffers are filled in place.
        buf = {"logits": np.zeros((3, SIZES[-1]), np.float32)}
        x = rows(3, seed=6)
        await within(runner.execute({"x": x}, outputs=buf))
        np.testing.assert_allclose(buf["logits"], ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)
    with pytest.raises(RunnerStoppedError):
        runner.execute_async({"x": rows(1, 0)})


def test_blocking_runner_serves_many_threads(mlp: tuple[Path, Reference]) -> None:
    path, ref = mlp
    config = ModelRunnerConfig(replication_factor=2, batching_dim=0, timeout=0.001)
    failures: list[BaseException] = []
    with BlockingModelRunner(path, config) as runner:

        def worker(seed: int) -> None:
            try:
                for i in range(25):
                    x = rows(1 + (i % 3), seed=seed * 100 + i)
                    got = runner.execute({"x": x})["logits"]
                    np.testing.assert_allclose(got, ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert not failures
    with pytest.raises(RunnerStoppedError):
        runner.execute({"x": rows(1, 0)})


@pytest.mark.parametrize("flush_on_waiting_outputs", [False, True])
async def test_flush_on_waiting_outputs_flushes_only_for_a_caller_that_waits(
    mlp: tuple[Path, Reference], flush_on_waiting_outputs: bool
) -> None:
    """The seed's flag: with True a timed-out partial batch is flushed only once a caller
    waits for its outputs (awaits execute_async's result); with False the timeout flushes."""
    path, ref = mlp
    clock = FakeClock()
    x = rows(1, seed=21)
    config = ModelRunnerConfig(
        batching_dim=0, timeout=1.0, flush_on_waiting_outputs=flush_on_waiting_outputs
    )
    async with ModelRunner(path, config, clock=clock) as runner:
        pending = runner.execute_async({"x": x})
        await anyio.wait_all_tasks_blocked()
        clock.advance(5.0)  # far past the timeout, nobody awaiting yet
        await anyio.wait_all_tasks_blocked()
        state = runner.replica_states()[0]
        if flush_on_waiting_outputs:
            assert state.runs == 0 and not state.inflight, "flushed with nobody waiting"
        else:
            with anyio.fail_after(20):
                while state.runs == 0:  # noqa: ASYNC110 - the device thread runs the flush
                    await anyio.sleep(0.001)
        got = await within(pending)  # now a caller waits: flushed at once
        assert state.runs == 1
    np.testing.assert_allclose(got["logits"], ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [4, 12])
async def test_output_buffers_of_whole_batches_are_written_by_the_device(
    mlp: tuple[Path, Reference], n: int
) -> None:
    """Seed: caller memory is the device's output. A request of whole batches with its own
    output buffer gets that buffer back, written in place by onnxruntime (no extra copy),
    while a request that shares a batch gets its rows copied into its buffer as before."""
    path, ref = mlp
    x = rows(n, seed=n)
    mine = np.full((n, SIZES[-1]), np.nan, np.float32)
    partial_x = rows(3, seed=99)
    partial = np.full((3, SIZES[-1]), np.nan, np.float32)
    seen: list[np.ndarray] = []
    config = ModelRunnerConfig(batching_dim=0, timeout=0.001)
    async with ModelRunner(path, config) as runner:
        original = CpuBackend._run_into

        def spy(self: CpuBackend, feed: Any, dest: Any, options: Any) -> list[np.ndarray]:
            seen.extend(dest.values())
            return original(self, feed, dest, options)

        CpuBackend._run_into = spy  # type: ignore[method-assign]
        try:
            got = await within(runner.execute({"x": x}, outputs={"logits": mine}))
            other = await within(runner.execute({"x": partial_x}, outputs={"logits": partial}))
        finally:
            CpuBackend._run_into = original  # type: ignore[method-assign]
    assert got["logits"] is mine
    np.testing.assert_allclose(mine, ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)
    assert len(seen) == n // 4 and all(np.shares_memory(v, mine) for v in seen)
    assert other["logits"] is partial
    np.testing.assert_allclose(partial, ref({"x": partial_x})["logits"], rtol=1e-4, atol=1e-5)


async def test_max_queue_size_refuses_at_once_and_the_queue_carries_on(
    mlp: tuple[Path, Reference],
) -> None:
    """Beyond max_queue_size waiting requests a new one gets QueueFullError at once (nothing
    queued); the waiting ones are answered and later requests are taken again."""
    path, ref = mlp
    clock = FakeClock()
    config = ModelRunnerConfig(batching_dim=0, timeout=10.0, max_queue_size=2)
    async with ModelRunner(path, config, clock=clock) as runner:
        waiting = [runner.execute_async({"x": rows(1, seed=s)}) for s in range(2)]
        with pytest.raises(QueueFullError, match=r"^Exceeds maximum queue size.*max_queue_size 2"):
            runner.execute_async({"x": rows(1, seed=9)})
        clock.advance(10.0)  # the partial batch flushes
        for s, w in enumerate(waiting):
            got = await within(w)
            want = ref({"x": rows(1, seed=s)})["logits"]
            np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-5)
        x = rows(4, seed=3)
        np.testing.assert_allclose(
            (await within(runner.execute({"x": x})))["logits"],
            ref({"x": x})["logits"],
            rtol=1e-4,
            atol=1e-5,
        )


@pytest.mark.parametrize("timeout", [None, 30.0])
async def test_a_caller_that_goes_away_before_packing_costs_no_device_run(
    mlp: tuple[Path, Reference], timeout: float | None
) -> None:
    """Cancelled while waiting (a client that disconnected), with or without a per-request
    timeout: its rows are dropped before they reach a device."""
    path, _ = mlp
    clock = FakeClock()
    config = ModelRunnerConfig(batching_dim=0, timeout=1.0)
    async with ModelRunner(path, config, clock=clock) as runner:
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(runner.execute, {"x": rows(1, seed=1)}, timeout=timeout))
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        clock.advance(2.0)
        await anyio.wait_all_tasks_blocked()
        state = runner.replica_states()[0]
        assert state.runs == 0 and not state.inflight
        assert runner._replicas is not None and runner._replicas.queues[0].pending_samples == 0


async def test_latency_budget_refuses_what_the_replicas_cannot_serve_in_time(
    mlp: tuple[Path, Reference],
) -> None:
    """Admission control: with a budget, a request is refused at once (QueueFullError) when
    the queue would take the replicas longer than the budget at their measured rate; a
    request is always taken when nothing waits, and one within the budget is served."""
    path, ref = mlp
    clock = FakeClock()
    config = ModelRunnerConfig(batching_dim=0, timeout=10.0, latency_budget=1.0)
    async with ModelRunner(path, config, clock=clock) as runner:
        state = runner.replica_states()[0]
        # The fake clock measures runs as instant; say the device does 10 samples/s.
        state.seconds_per_sample = 0.1
        first = runner.execute_async({"x": rows(3, seed=1)})  # nothing waits: always taken
        second = runner.execute_async({"x": rows(3, seed=2)})  # 6 samples: 0.6 s
        with pytest.raises(QueueFullError, match="latency budget of 1 s"):
            runner.execute_async({"x": rows(5, seed=3)})  # 11 samples: 1.1 s > 1 s
        clock.advance(10.0)
        for seed, pending in ((1, first), (2, second)):
            got = await within(pending)
            want = ref({"x": rows(3, seed=seed)})["logits"]
            np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-5)


def test_the_daemon_leaves_admission_to_its_front_end_by_default() -> None:
    """The daemon's admission is its front end's (which never refuses a closed loop); its
    runners get no latency budget, as the library's default (on Ray the deployment sets one)."""
    from model_runtime.server import build_parser, options_from_args

    opts = options_from_args(build_parser().parse_args([]))
    assert opts.admission_delay == 1.0
    assert opts.runner.latency_budget is None
    assert ModelRunnerConfig().latency_budget is None  # the library's default: off


async def test_with_buckets_lone_requests_are_answered_at_once_by_the_default_config(
    mlp_buckets: tuple[Path, Reference],
) -> None:
    # A fake clock that never moves: the seed's fixed batch would wait for the flush timeout
    # forever; with buckets an idle replica runs each request at once, at its own size.
    path, ref = mlp_buckets
    async with ModelRunner(path, ModelRunnerConfig(batching_dim=0), clock=FakeClock()) as runner:
        for n in (1, 3, 8, 11):
            x = rows(n, seed=40 + n)
            out = await within(runner.execute({"x": x}), 10)
            np.testing.assert_allclose(out["logits"], ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)


def answered_in_place(runner: ModelRunner, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """The outputs of a request that ``execute_async`` answered before it returned (no loop
    turn)."""
    answer = runner.execute_async(inputs)
    assert isinstance(answer, asyncio.Future) and answer.done()
    return answer.result()


@pytest.fixture
async def inline_runner(
    mlp_buckets: tuple[Path, Reference], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ModelRunner, Reference]]:
    """A runner of the bucketed MLP whose one-row runs go inline whatever this machine's run
    time (the run, not its measured speed, is the point), after one request (its runs are
    measured)."""
    monkeypatch.setattr(inline, "INLINE_BELOW", 1.0)
    path, ref = mlp_buckets
    async with ModelRunner(path, ModelRunnerConfig(batching_dim=0)) as runner:
        await within(runner.execute({"x": rows(1, seed=60)}))
        yield runner, ref


async def test_a_lone_request_on_an_idle_replica_is_run_in_the_callers_task(
    inline_runner: tuple[ModelRunner, Reference],
) -> None:
    runner, ref = inline_runner
    for seed in range(61, 66):
        await asyncio.sleep(0)  # a turn of the loop, as for a caller awaiting its answer
        x = rows(1, seed)
        out = answered_in_place(runner, {"x": x})
        np.testing.assert_allclose(out["logits"], ref({"x": x})["logits"], rtol=1e-4, atol=1e-5)
    # A caller answered in place still lets the loop run the others between requests.
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    counter = asyncio.create_task(count_turns())
    await asyncio.sleep(0)
    for timeout in (None, 5.0):  # with a deadline too (the daemon's requests have one)
        start = turns
        for seed in range(30):
            await runner.execute({"x": rows(1, seed)}, timeout=timeout)
        assert turns - start >= 30
    counter.cancel()


async def test_a_lone_bad_request_run_in_place_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The in-place run fails (an id past the table: onnxruntime refuses it); the batch loop
    # takes that outcome and finds the data at fault, like any batch's.
    monkeypatch.setattr(inline, "INLINE_BELOW", 1.0)
    embedding = make_embedding(rows=100)
    path = compile_to(embedding, tmp_path, batch_size=8)
    ref = Reference(embedding)
    async with ModelRunner(path, ModelRunnerConfig(batching_dim=0)) as runner:
        good = np.array([7], np.int64)
        await within(runner.execute({"ids": good}))
        for _ in range(3):
            with pytest.raises(InputValidationError, match="out of data bounds"):
                await within(runner.execute({"ids": np.array([1000], np.int64)}))
            out = answered_in_place(runner, {"ids": good})
            np.testing.assert_array_equal(out["vectors"], ref({"ids": good})["vectors"])
        assert runner.replica_states()[0].resets == 0  # data, not a device fault


async def test_concurrent_callers_are_batched_not_each_run_in_place(
    inline_runner: tuple[ModelRunner, Reference],
) -> None:
    # Runs in place whenever allowed: each caller finding the device idle after the last
    # answer (given in place) must not make every request a run of its own.
    runner, ref = inline_runner
    before = runner.replica_states()[0].runs

    async def caller(k: int) -> None:
        for i in range(10):
            x = rows(1, seed=1000 * k + i)
            out = await runner.execute({"x": x})
            np.testing.assert_allclose(out["logits"], ref({"x": x})["logits"], atol=1e-5)

    async with anyio.create_task_group() as tg:
        for k in range(32):
            tg.start_soon(caller, k)
    runs = runner.replica_states()[0].runs - before
    assert runs <= 320 // 4  # 320 requests, in batches of 4 rows or more on average


async def test_requests_of_one_loop_turn_after_an_in_place_run_ride_one_batch(
    inline_runner: tuple[ModelRunner, Reference],
) -> None:
    # Six requests queued in one turn of the loop on an idle replica (an ensemble's step for
    # the requests one answer released): the first runs in place, the other five together,
    # not one alone and four behind it.
    runner, ref = inline_runner
    await asyncio.sleep(0)
    before = runner.replica_states()[0].runs
    xs = [rows(1, seed=2000 + i) for i in range(6)]
    answers = [runner.execute_async({"x": x}) for x in xs]
    assert answers[0].done() and not any(a.done() for a in answers[1:])
    for x, answer in zip(xs, answers, strict=True):
        out = await within(answer)
        np.testing.assert_allclose(out["logits"], ref({"x": x})["logits"], atol=1e-5)
    assert runner.replica_states()[0].runs - before == 2
