"""Packing and splitting: every caller gets exactly its rows, in order, whatever the sizes."""

from __future__ import annotations

import random

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from test_queue_support import (
    expected,
    make_queue,
    metadata,
    request,
    rows,
    running,
    settle,
    submit,
)

from actors.clock import FakeClock
from actors.queues.config import QueueConfig
from actors.queues.messages import Flush
from actors.queues.pool import Layout
from model_runtime.errors import ConfigurationError

B = 4


def check(result: dict[str, np.ndarray], x: np.ndarray, axis: int = 0) -> None:
    want = expected(x, axis)
    for name, value in result.items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)


@pytest.mark.parametrize("iterations", [1, 3])
@pytest.mark.parametrize(
    ("batching_dim", "sizes"),
    [
        (None, [B, 2 * B, 3 * B]),
        (0, [1, B - 1, B, B + 1, 3 * B + 2]),
    ],
)
async def test_each_caller_gets_exactly_its_rows(
    iterations: int, batching_dim: int | None, sizes: list[int]
) -> None:
    queue = make_queue(metadata(B, iterations, two_outputs=True), batching_dim=batching_dim)
    async with running(queue) as (ref, session):
        reqs = [submit(ref, request(rows(n), n)) for n in sizes for _ in range(2)]
        await settle()
        ref.tell(Flush())
        for req in reqs:
            result = await req.future
            assert set(result) == {"y", "s", "step"}
            assert result["y"].shape == (req.samples, 3)
            check(result, req.inputs["x"])
        assert sum(b.valid_rows for b in session.seen) == sum(sizes) * 2
        assert all(len(b.inputs) == iterations for b in session.seen)
        assert queue.pending_samples == 0 and queue.inflight_requests == 0


async def test_batching_dim_other_than_zero() -> None:
    queue = make_queue(metadata(B, 2, axis=1), batching_dim=1)
    async with running(queue, axis=1) as (ref, session):
        sizes = [1, B - 1, B, B + 1, 3 * B + 2]
        reqs = [submit(ref, request(rows(n, axis=1), n)) for n in sizes]
        await settle()
        ref.tell(Flush())
        for req in reqs:
            result = await req.future
            assert result["y"].shape == (3, req.samples)
            check(result, req.inputs["x"], axis=1)
        for batch in session.seen:
            assert batch.inputs[0]["x"].shape == (3, B)
            assert batch.inputs[0]["x"].flags.c_contiguous


async def test_a_thousand_concurrent_mixed_size_callers() -> None:
    rng = random.Random(7)
    queue = make_queue(metadata(8, 3, two_outputs=True), batching_dim=0, timeout=0.01)
    async with running(queue) as (ref, _):
        sizes = [rng.choice([1, 1, 1, 2, 3, 7, 8, 9, 25, 24]) for _ in range(1000)]

        async def caller(n: int) -> None:
            await anyio.lowlevel.checkpoint()
            req = submit(ref, request(rows(n), n))
            check(await req.future, req.inputs["x"])
            done.append(n)

        done: list[int] = []
        async with anyio.create_task_group() as tg:
            for n in sizes:
                tg.start_soon(caller, n)
            await settle()
            ref.tell(Flush())
        assert sorted(done) == sorted(sizes)
        assert queue.pending_samples == 0


async def test_request_that_exactly_fills_a_batch_is_not_copied() -> None:
    queue = make_queue(metadata(B, 3), batching_dim=0)
    async with running(queue) as (ref, session):
        x = rows(3 * B)
        req = submit(ref, request(x, 3 * B))
        check(await req.future, x)
        (batch,) = session.seen
        assert batch._buffer is None
        for k in range(3):
            assert np.shares_memory(batch.inputs[k]["x"], x)
            np.testing.assert_array_equal(batch.inputs[k]["x"], x[k * B : (k + 1) * B])
        # spanning 3 iterations, its outputs are gathered into one array
        assert not np.shares_memory((await req.future)["y"], session.produced[0][0]["y"])


async def test_outputs_within_one_iteration_are_views_of_the_run_outputs() -> None:
    queue = make_queue(metadata(B, 2), batching_dim=0)
    async with running(queue) as (ref, session):
        reqs = [submit(ref, request(rows(n), n)) for n in (1, B - 1, B)]
        results = [await r.future for r in reqs]
        (outputs,) = session.produced
        assert np.shares_memory(results[0]["y"], outputs[0]["y"])
        assert np.shares_memory(results[1]["y"], outputs[0]["y"])
        assert np.shares_memory(results[2]["y"], outputs[1]["y"])
        for r, res in zip(reqs, results, strict=True):
            check(res, r.inputs["x"])


async def test_non_contiguous_request_is_copied_correctly() -> None:
    queue = make_queue(metadata(B), batching_dim=0)
    async with running(queue) as (ref, session):
        x = rows(2 * B)[::2]  # B rows, not contiguous
        req = submit(ref, request(x, B))
        check(await req.future, x)
        assert not np.shares_memory(session.seen[0].inputs[0]["x"], x)


async def test_caller_provided_output_buffers_are_filled() -> None:
    queue = make_queue(metadata(B, two_outputs=True), batching_dim=0)
    async with running(queue) as (ref, _):
        x = rows(B + 1)
        y = np.full((B + 1, 3), -1.0, dtype=np.float32)
        step = np.zeros(1, dtype=np.float32)
        req = submit(ref, request(x, B + 1, outputs={"y": y, "step": step}))
        await settle()
        ref.tell(Flush())
        result = await req.future
        assert result["y"] is y and result["step"] is step
        check(result, x)
        single = submit(ref, request(rows(1), 1, outputs={"y": np.empty((1, 3), np.float32)}))
        ref.tell(Flush())
        check(await single.future, single.inputs["x"])


async def test_split_does_not_alias_between_callers() -> None:
    """Each 1-row caller's array is its own row (views into the run's output, not shared)."""
    queue = make_queue(metadata(B), batching_dim=0)
    async with running(queue) as (ref, _):
        reqs = [submit(ref, request(rows(1), 1)) for _ in range(B)]
        results = [await r.future for r in reqs]
        for r, res in zip(reqs, results, strict=True):
            assert res["y"].shape == (1, 3)
            check(res, r.inputs["x"])


def test_layout_rejects_anchors_without_the_batch_size_on_the_row_axis() -> None:
    with pytest.raises(ConfigurationError, match="batch size"):
        Layout(metadata(B), QueueConfig(batching_dim=1))
    with pytest.raises(ConfigurationError):
        QueueConfig(timeout=-1)


async def test_device_iterations_consume_i_batches_per_run() -> None:
    queue = make_queue(metadata(2, 3), batching_dim=0, clock=FakeClock())
    async with running(queue) as (ref, session):
        reqs = [submit(ref, request(rows(1), 1)) for _ in range(6)]
        for r in reqs:
            check(await r.future, r.inputs["x"])
        (batch,) = session.seen
        assert batch.valid_rows == 6 and not batch.padded
        assert [seg[2:4] for seg in batch.segments] == [
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
            (2, 0),
            (2, 1),
        ]


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 5),
    iterations=st.integers(1, 3),
    sizes=st.lists(st.tuples(st.integers(1, 17), st.booleans()), min_size=1, max_size=30),
)
def test_any_sizes_and_cancellations_route_exactly(
    batch: int, iterations: int, sizes: list[tuple[int, bool]]
) -> None:
    async def scenario() -> None:
        queue = make_queue(
            metadata(batch, iterations), batching_dim=0, timeout=0, ring_buffer_size_multiplier=32
        )
        async with running(queue, hold=True) as (ref, session):
            reqs = [(submit(ref, request(rows(n), n)), cancel) for n, cancel in sizes]
            await settle()
            for r, cancel in reqs:
                if cancel:
                    r.future.cancel()
            ref.tell(Flush())  # everything waiting now, full batches and the partial tail
            session.hold = False
            session.release()
            await settle()
            for r, cancel in reqs:
                if not cancel:
                    check(r.future.result(), r.inputs["x"])
            assert queue.pending_samples == 0 and queue.inflight_requests == 0
            packed = sum(b.valid_rows for b in session.seen)
            assert packed <= sum(n for n, _ in sizes)

    anyio.run(scenario)
