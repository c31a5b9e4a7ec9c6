"""The Queue actor: flush timeouts, flush callback, cancellation, pool, failures, drain, stats."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
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

from actors.actor import Stop
from actors.clock import FakeClock
from actors.queues.messages import Complete, Drain, Fail, FailAll, Flush, GetStats
from actors.queues.request import Request
from actors.queues.stats import QueueStats, TimeTrace
from model_runtime.errors import ApplicationRuntimeError, RunnerStoppedError

B = 4


def check(result: dict[str, np.ndarray], x: np.ndarray) -> None:
    np.testing.assert_array_equal(result["y"], expected(x)["y"])


# -- flush by time ----------------------------------------------------------------------------


async def test_partial_batch_flushes_after_idle_timeout_with_zero_padding() -> None:
    clock = FakeClock()
    queue = make_queue(metadata(B, 2), clock, batching_dim=0, timeout=5.0)
    async with running(queue) as (ref, session):
        first = submit(ref, request(rows(2), 2))
        await settle()
        clock.advance(3.0)
        second = submit(ref, request(rows(3), 3))  # idle time restarts at the last arrival
        await settle()
        clock.advance(4.9)
        await settle()
        assert session.seen == []
        clock.advance(0.1)
        await settle()
        (batch,) = session.seen
        assert batch.padded and batch.valid_rows == 5
        np.testing.assert_array_equal(batch.inputs[0]["x"][:2], first.inputs["x"])
        np.testing.assert_array_equal(batch.inputs[0]["x"][2:], second.inputs["x"][:2])
        np.testing.assert_array_equal(batch.inputs[1]["x"][0], second.inputs["x"][2])
        assert not batch.inputs[1]["x"][1:].any()  # zero padding
        r1, r2 = await first.future, await second.future
        assert r1["y"].shape == (2, 3) and r2["y"].shape == (3, 3)  # padding reached nobody
        check(r1, first.inputs["x"])
        check(r2, second.inputs["x"])


# -- batch-size buckets ------------------------------------------------------------------------


async def test_with_buckets_a_lone_request_runs_at_once_at_its_own_size() -> None:
    clock = FakeClock()
    queue = make_queue(metadata(B, buckets=(1, 2, 4)), clock, batching_dim=0, timeout=5.0)
    async with running(queue) as (ref, session):
        req = submit(ref, request(rows(1), 1))
        await settle()  # the clock never moves: no timeout is waited for
        (batch,) = session.seen
        assert batch.inputs[0]["x"].shape == (1, 3) and not batch.padded
        check(await req.future, req.inputs["x"])
        three = submit(ref, request(rows(3), 3))  # idle again: at once, bucket 4, padded
        await settle()
        assert session.seen[1].inputs[0]["x"].shape == (4, 3) and session.seen[1].padded
        assert (await three.future)["y"].shape == (3, 3)


async def test_with_buckets_timeout_bounds_the_wait_of_the_first_request() -> None:
    clock = FakeClock()
    queue = make_queue(metadata(B, buckets=(1, 2, 4)), clock, batching_dim=0, timeout=5.0)
    async with running(queue, hold=True) as (ref, session):
        busy = submit(ref, request(rows(1), 1))  # the device takes it at once, and keeps it
        await settle()
        first = submit(ref, request(rows(1), 1))
        await settle()
        clock.advance(3.0)
        second = submit(ref, request(rows(1), 1))  # does not restart the first one's wait
        await settle()
        clock.advance(1.9)
        await settle()
        assert len(session.seen) == 1
        clock.advance(0.1)  # 5 s after the first request, not after the last
        await settle()
        assert len(session.seen) == 2 and session.seen[1].inputs[0]["x"].shape == (2, 3)
        session.release()
        await settle()
        session.release()
        check(await busy.future, busy.inputs["x"])
        check(await first.future, first.inputs["x"])
        check(await second.future, second.inputs["x"])


async def test_with_buckets_callers_answered_together_queue_again_together() -> None:
    queue = make_queue(metadata(B, buckets=(1, 2, 4)), batching_dim=0, timeout=5.0)
    async with running(queue, hold=True) as (ref, session):
        busy = submit(ref, request(rows(1), 1))
        await settle()
        callers = [submit(ref, request(rows(1), 1)) for _ in range(3)]
        await settle()
        session.release()  # busy ends; the three waiting rows go as one batch
        await settle()
        again: list[Request] = []

        def queue_again(_: object) -> None:  # a woken caller's next request
            again.append(request(rows(1), 1))
            queue.enqueue_nowait(again[-1])

        for req in callers:
            req.future.add_done_callback(queue_again)
        session.release()
        await settle()
        assert [b.valid_rows for b in session.seen] == [1, 3, 3]  # not 1, 3, 1, 2
        session.release()
        for req in (busy, *callers, *again):
            check(await req.future, req.inputs["x"])


async def test_with_buckets_the_next_request_of_a_lone_caller_is_dispatched_at_once() -> None:
    queue = make_queue(metadata(B, buckets=(1, 2, 4)), batching_dim=0, timeout=5.0)
    async with running(queue) as (ref, _session):
        first = submit(ref, request(rows(1), 1))
        waiting: list[int] = []

        def queue_again(_: object) -> None:  # its caller wakes and sends the next one
            queue.enqueue_nowait(second)
            waiting.append(queue.waiting_requests)

        second = request(rows(1), 1)
        first.future.add_done_callback(queue_again)
        check(await first.future, first.inputs["x"])
        await settle()
        assert waiting == [0]  # sealed as it came: nobody else was answered with it
        check(await second.future, second.inputs["x"])


async def test_timeout_zero_never_flushes_by_time() -> None:
    clock = FakeClock()
    queue = make_queue(metadata(B), clock, batching_dim=0, timeout=0)
    async with running(queue) as (ref, session):
        req = submit(ref, request(rows(1), 1))
        await settle()
        clock.advance(1e9)
        await settle()
        assert session.seen == [] and not req.future.done()
        ref.tell(Flush())
        check(await req.future, req.inputs["x"])


async def test_flush_callback_supplies_the_padding_data() -> None:
    calls: list[tuple[str, dict[str, tuple[int, ...]]]] = []
    got: dict[str, np.ndarray] = {}

    def on_flush(
        tensor_id: str, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
    ) -> None:
        calls.append((tensor_id, {k: v.shape for k, v in inputs.items()}))
        inputs["x"][...] = 7.0
        outputs["y"] = got["y"] = np.zeros((3, 3), np.float32)

    clock = FakeClock()
    queue = make_queue(metadata(B), clock, batching_dim=0, timeout=1.0, flush_callback=on_flush)
    async with running(queue) as (ref, session):
        req = submit(ref, request(rows(1), 1))
        await settle()
        clock.advance(1.0)
        check(await req.future, req.inputs["x"])
        assert calls == [("x", {"x": (3, 3)})]
        np.testing.assert_array_equal(session.seen[0].inputs[0]["x"][1:], np.full((3, 3), 7.0))
        np.testing.assert_array_equal(got["y"], np.full((3, 3), 15.0))  # 2*7+1


async def test_failing_flush_callback_fails_that_batch_and_the_queue_carries_on() -> None:
    def on_flush(tensor_id: str, inputs: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> None:
        raise RuntimeError("no flush data")

    queue = make_queue(metadata(B), batching_dim=0, flush_callback=on_flush)
    async with running(queue) as (ref, _):
        req = submit(ref, request(rows(1), 1))
        ref.tell(Flush())
        # A typed error naming the callback, the callback's own error as its cause.
        with pytest.raises(ApplicationRuntimeError, match=r"flush_callback .*on_flush") as err:
            await req.future
        assert isinstance(err.value.__cause__, RuntimeError)
        assert "no flush data" in str(err.value)
        full = submit(ref, request(rows(B), B))
        check(await full.future, full.inputs["x"])
        assert queue.pending_samples == 0


async def test_batch_size_timeout_bounds_a_steady_trickle() -> None:
    clock = FakeClock()
    queue = make_queue(
        metadata(8), clock, batching_dim=0, timeout=5.0,
        is_batch_size_timeout_enabled=True, batch_size_timeout=2.5,
    )  # fmt: skip
    async with running(queue) as (ref, session):
        reqs = []
        for _ in range(3):  # one row a second: the idle timeout never fires
            reqs.append(submit(ref, request(rows(1), 1)))
            await settle()
            clock.advance(1.0)
            await settle()
        assert [b.valid_rows for b in session.seen] == [3]  # flushed at t=2.5
        for r in reqs:
            check(await r.future, r.inputs["x"])


async def test_batch_size_timeout_is_ignored_unless_enabled() -> None:
    clock = FakeClock()
    queue = make_queue(metadata(8), clock, batching_dim=0, timeout=5.0, batch_size_timeout=0.5)
    async with running(queue) as (ref, session):
        submit(ref, request(rows(1), 1))
        await settle()
        clock.advance(4.0)
        await settle()
        assert session.seen == []


async def test_data_parallel_timeout_flushes_once_one_iteration_is_full() -> None:
    clock = FakeClock()
    queue = make_queue(
        metadata(2, 3), clock, batching_dim=0, timeout=10.0,
        is_batch_size_timeout_enabled=True, data_parallel_timeout=1.0,
    )  # fmt: skip
    async with running(queue) as (ref, session):
        a = submit(ref, request(rows(1), 1))
        await settle()
        clock.advance(2.0)  # one row: not a full iteration, the data-parallel clock is off
        await settle()
        assert session.seen == []
        b = submit(ref, request(rows(2), 2))  # 3 rows: iteration 0 is full at t=2
        await settle()
        clock.advance(1.0)
        await settle()
        assert [bt.valid_rows for bt in session.seen] == [3]
        check(await a.future, a.inputs["x"])
        check(await b.future, b.inputs["x"])


# -- cancellation -----------------------------------------------------------------------------


async def test_cancelled_before_packing_is_removed_from_the_queue() -> None:
    queue = make_queue(metadata(B), batching_dim=0)
    async with running(queue) as (ref, session):
        a = submit(ref, request(rows(2), 2))
        gone = submit(ref, request(rows(1), 1))
        await settle()
        gone.future.cancel()
        c = submit(ref, request(rows(2), 2))  # 5 rows counted, 4 live: one full batch
        results = [await a.future, await c.future]
        (batch,) = session.seen
        assert not batch.padded
        packed = batch.inputs[0]["x"]
        assert not any((packed == row).all(axis=1).any() for row in gone.inputs["x"])
        for req, res in zip((a, c), results, strict=True):
            check(res, req.inputs["x"])
        assert queue.pending_samples == 0 and queue.inflight_requests == 0


async def test_cancelled_rows_never_stall_the_batcher() -> None:
    clock = FakeClock()
    queue = make_queue(metadata(B), clock, batching_dim=0, timeout=1.0)
    async with running(queue) as (ref, session):
        live = [submit(ref, request(rows(1), 1)) for _ in range(3)]
        gone = submit(ref, request(rows(1), 1))  # rows 4/4 counted, but one caller leaves
        gone.future.cancel()
        await settle()
        clock.advance(1.0)
        for r in live:
            check(await r.future, r.inputs["x"])
        assert [b.valid_rows for b in session.seen] == [3]
        assert queue.pending_samples == 0


async def test_cancelled_after_packing_is_computed_and_dropped() -> None:
    queue = make_queue(metadata(B), batching_dim=0)
    async with running(queue, hold=True) as (ref, session):
        reqs = [submit(ref, request(rows(1), 1)) for _ in range(B)]
        big = submit(ref, request(rows(B + 2), B + 2))  # spans two batches
        await settle()
        assert len(session.held) == 2
        reqs[1].future.cancel()
        big.future.cancel()
        session.release()
        for i in (0, 2, 3):
            check(await reqs[i].future, reqs[i].inputs["x"])
        after = submit(ref, request(rows(B), B))
        await settle()
        session.release()
        check(await after.future, after.inputs["x"])
        assert queue.pending_samples == 0 and queue.inflight_requests == 0
        # The statistics count the answered requests: B - 1 of the first batch, and `after`.
        stats = queue.stats()
        assert len(stats.time_trace()) == stats.total_count().request_duration == B


async def test_a_caller_gone_before_packing_never_reaches_the_device() -> None:
    queue = make_queue(metadata(B), batching_dim=0, ring_buffer_size_multiplier=2)
    async with running(queue, hold=True) as (ref, session):
        full = [submit(ref, request(rows(B), B)) for _ in range(2)]  # both buffers out
        waiting = [submit(ref, request(rows(1), 1)) for _ in range(B + 1)]
        await settle()
        assert len(session.held) == 2
        waiting[1].future.cancel()  # behind a live one: found while packing
        for _ in range(4):  # the two held batches, then one of the B live callers
            session.release()
            await settle()
        assert all(r.future.done() for r in full + waiting)
        packed = [req for batch in session.seen[2:] for req in batch.requests]
        live = [waiting[0], *waiting[2:]]
        assert packed == live  # the B live callers, in order; not the gone one
        for r in live:
            check(r.future.result(), r.inputs["x"])


async def test_a_caller_gone_before_queueing_is_dropped_and_leaves_no_trace() -> None:
    queue = make_queue(metadata(B), batching_dim=0, ring_buffer_size_multiplier=2)
    async with running(queue, hold=True) as (ref, session):
        gone = request(rows(1), 1)
        gone.future.cancel()  # its caller went before the queue took it
        queue.enqueue_nowait(gone)
        live = [submit(ref, request(rows(1), 1)) for _ in range(B)]
        await settle()
        session.release()
        await settle()
        packed = [req for batch in session.seen for req in batch.requests]
        assert packed == live  # one full batch of the live callers; no row for the gone one
        for r in live:
            check(r.future.result(), r.inputs["x"])
        assert queue.pending_samples == 0  # nothing counted as waiting or in flight
        with anyio.fail_after(5):
            await queue.wait_answered()


# -- pool, failures, drain, shutdown ----------------------------------------------------------


async def test_pool_exhaustion_makes_requests_wait_not_fail() -> None:
    queue = make_queue(metadata(B), batching_dim=0, ring_buffer_size_multiplier=2)
    assert queue.config.pool_buffers == 2
    async with running(queue, hold=True) as (ref, session):
        reqs = [submit(ref, request(rows(B), B)) for _ in range(2)]
        reqs += [submit(ref, request(rows(1), 1)) for _ in range(3 * B)]
        await settle()
        assert len(session.held) == 2  # two buffers, both out
        assert not any(r.future.done() for r in reqs)
        assert queue.pending_samples == 5 * B
        while not all(r.future.done() for r in reqs):
            session.release()
            await settle()
        assert len(session.seen) == 5
        for r in reqs:
            check(r.future.result(), r.inputs["x"])


async def test_fail_answers_each_request_exactly_once() -> None:
    queue = make_queue(metadata(B), batching_dim=0)
    async with running(queue, hold=True) as (ref, session):
        one = submit(ref, request(rows(1), 1))
        span = submit(ref, request(rows(2 * B - 1), 2 * B - 1))  # two batches
        await settle()
        first, second = session.held
        error = ApplicationRuntimeError("device failed")
        ref.tell(Fail(first, error))
        with pytest.raises(ApplicationRuntimeError):
            await span.future
        with pytest.raises(ApplicationRuntimeError):
            await one.future
        session.complete(second)  # the spanning request's other rows: no second answer
        ref.tell(Fail(first, error))  # a repeated answer for the batch is ignored too
        await settle()
        assert queue.is_running
        assert queue.pending_samples == 0 and queue.inflight_requests == 0
        later = submit(ref, request(rows(B), B))
        await settle()
        session.release()
        check(await later.future, later.inputs["x"])


async def test_drain_flushes_pending_then_refuses_new_requests() -> None:
    queue = make_queue(metadata(B), batching_dim=0, timeout=0)
    async with running(queue) as (ref, session):
        req = submit(ref, request(rows(3), 3))
        await ref.ask(Drain())
        assert [b.valid_rows for b in session.seen] == [3]
        check(await req.future, req.inputs["x"])
        late = submit(ref, request(rows(1), 1))
        with pytest.raises(RunnerStoppedError):
            await late.future


async def test_drain_waits_for_a_free_buffer() -> None:
    queue = make_queue(metadata(B), batching_dim=0, ring_buffer_size_multiplier=2)
    async with running(queue, hold=True) as (ref, session):
        for _ in range(2):
            submit(ref, request(rows(B), B))
        tail = submit(ref, request(rows(1), 1))
        drained = anyio.Event()

        async def drain() -> None:
            await ref.ask(Drain())
            drained.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            await settle()
            assert not drained.is_set()
            session.release()
            await settle()
            assert drained.is_set()
        session.release()
        check(await tail.future, tail.inputs["x"])


async def test_fail_all_answers_pending_and_packed_requests() -> None:
    queue = make_queue(metadata(B), batching_dim=0, timeout=0)
    async with running(queue, hold=True) as (ref, session):
        packed = submit(ref, request(rows(B), B))
        pending = submit(ref, request(rows(1), 1))
        await settle()
        await ref.ask(FailAll(RunnerStoppedError("shutting down")))
        for r in (packed, pending):
            with pytest.raises(RunnerStoppedError, match="shutting down"):
                await r.future
        session.release()  # completing a batch whose callers were failed answers nobody twice
        await settle()
        assert queue.is_running and queue.pending_samples == 0


async def test_stopping_the_queue_fails_what_it_holds() -> None:
    queue = make_queue(metadata(B), batching_dim=0, timeout=0)
    async with running(queue) as (ref, _):
        req = submit(ref, request(rows(1), 1))
        await ref.ask(Stop())
        with pytest.raises(RunnerStoppedError):
            await req.future


# -- statistics -------------------------------------------------------------------------------


async def test_statistics_time_trace_percentile_mean_count() -> None:
    clock = FakeClock(100.0)
    queue = make_queue(metadata(2), clock, batching_dim=0, timeout=0)
    async with running(queue, hold=True) as (ref, session):
        a = submit(ref, request(rows(1), 1, clock=clock))  # submitted at 100
        await settle()
        clock.advance(1.0)
        b = submit(ref, request(rows(1), 1, clock=clock))  # submitted at 101, packed at 101
        await settle()
        clock.advance(2.0)
        (batch,) = session.held
        clock.advance(4.5)  # the run ends at 107; its outputs are split back at 107.5
        ref.tell(Complete(batch, session.outputs(batch), 103.0, 107.0))
        await a.future, await b.future
        stats: QueueStats = await ref.ask(GetStats())
        first, second = TimeTrace(7.0, 1.0, 2.0, 4.0, 0.5), TimeTrace(6.0, 0.0, 2.0, 4.0, 0.5)
        assert stats.time_trace() == [first, second]
        assert stats.mean() == TimeTrace(6.5, 0.5, 2.0, 4.0, 0.5)
        assert stats.percentile(1.0) == first
        assert stats.percentile(0.0) == second
        assert stats.total_count().request_duration == 2
        assert stats.total_count().output_duration == 2
        with pytest.raises(ValueError):
            stats.percentile(90)


async def test_tracepoint_buffer_is_bounded_and_counts_everything() -> None:
    queue = make_queue(metadata(2), batching_dim=0, request_tracepoints_buffer_size=5)
    async with running(queue) as (ref, _):
        reqs = [submit(ref, request(rows(1), 1)) for _ in range(20)]
        for r in reqs:
            await r.future
        stats = queue.stats()
        assert len(stats.time_trace()) == 5
        assert stats.total_count().computation_duration == 20
        assert stats.as_dict()["request_monitoring_statistics_count"] == 20.0
    empty = make_queue(metadata(2)).stats()
    assert empty.mean() == TimeTrace(0.0, 0.0, 0.0, 0.0, 0.0) and empty.time_trace() == []


# -- flush_on_waiting_outputs, the direct path, malformed outputs -------------------------------


@pytest.mark.parametrize("flush_on_waiting_outputs", [False, True])
async def test_no_batch_runs_for_callers_that_all_went_away(flush_on_waiting_outputs: bool) -> None:
    clock = FakeClock()
    queue = make_queue(
        metadata(B), clock, batching_dim=0, timeout=1.0,
        flush_on_waiting_outputs=flush_on_waiting_outputs,
    )  # fmt: skip
    async with running(queue) as (ref, session):
        gone = [submit(ref, request(rows(1), 1)) for _ in range(2)]
        await settle()
        for r in gone:
            r.future.cancel()
        clock.advance(1.0)
        await settle()
        assert session.seen == [] and queue.pending_samples == 0
        live = submit(ref, request(rows(1), 1))
        await settle()
        clock.advance(1.0)
        check(await live.future, live.inputs["x"])
        assert [b.valid_rows for b in session.seen] == [1]


async def test_enqueue_nowait_is_the_same_as_tell() -> None:
    queue = make_queue(metadata(B), batching_dim=0)
    async with running(queue) as (_, _session):
        reqs = [request(rows(1), 1) for _ in range(B)]
        for r in reqs:
            queue.enqueue_nowait(r)
        for r in reqs:
            check(await r.future, r.inputs["x"])
    late = request(rows(1), 1)
    queue.enqueue_nowait(late)
    with pytest.raises(RunnerStoppedError):
        await late.future


async def test_malformed_outputs_fail_that_batch_only() -> None:
    queue = make_queue(metadata(B), batching_dim=0)
    async with running(queue, hold=True) as (ref, session):
        bad = submit(ref, request(rows(B), B))
        await settle()
        (batch,) = session.held
        session.held.clear()
        ref.tell(Complete(batch, [{"wrong": np.zeros((B, 3), np.float32)}], 0.0, 0.0))
        with pytest.raises(KeyError):
            await bad.future
        good = submit(ref, request(rows(B), B))
        await settle()
        session.release()
        check(await good.future, good.inputs["x"])
        assert queue.pending_samples == 0


async def test_flush_while_the_pool_is_full_covers_every_row_waiting_then() -> None:
    queue = make_queue(metadata(B), batching_dim=0, timeout=0, ring_buffer_size_multiplier=1,
                       max_look_ahead=0)  # fmt: skip
    async with running(queue, hold=True) as (ref, session):
        reqs = [submit(ref, request(rows(B), B)) for _ in range(4)]
        tail = submit(ref, request(rows(1), 1))
        ref.tell(Flush())
        await settle()
        later = submit(ref, request(rows(1), 1))  # rides along in the flushed partial batch
        session.hold = False
        session.release()
        await settle()
        for r in [*reqs, tail, later]:
            check(await r.future, r.inputs["x"])
        assert [b.valid_rows for b in session.seen] == [B, B, B, B, 2]
        after = submit(ref, request(rows(1), 1))  # after the flush was served: its own batch
        await settle()
        assert not after.future.done()


@pytest.mark.parametrize(
    ("multiplier", "look_ahead", "held"),
    [(2, None, 2), (3, None, 3), (3, 0, 1), (3, 1, 2), (2, 5, 2), (1, None, 1)],
)
async def test_ring_size_and_look_ahead_bound_the_batches_prepared(
    multiplier: int, look_ahead: int | None, held: int
) -> None:
    """The seed's sizing: the ring holds ``ring_buffer_size_multiplier`` batches, and at most
    ``1 + max_look_ahead`` are packed before the device completes one (0: none ahead)."""
    queue = make_queue(
        metadata(B),
        batching_dim=0,
        ring_buffer_size_multiplier=multiplier,
        max_look_ahead=look_ahead,
    )
    assert queue.config.pool_buffers == multiplier
    async with running(queue, hold=True) as (ref, session):
        reqs = [submit(ref, request(rows(B - 1), B - 1)) for _ in range(4 * B)]
        await settle()
        assert len(session.held) == held
        while not all(r.future.done() for r in reqs):
            session.release()
            await settle()
            assert len(session.held) <= held
        for r in reqs:
            check(r.future.result(), r.inputs["x"])


async def test_higher_priority_requests_are_packed_first_fifo_within_a_level() -> None:
    queue = make_queue(metadata(B), batching_dim=0, timeout=0, ring_buffer_size_multiplier=1)
    async with running(queue, hold=True) as (ref, session):
        first = submit(ref, request(rows(B), B))  # takes the only buffer
        await settle()
        order = [("low", -1), ("a", 0), ("urgent", 5), ("b", 0), ("high", 2), ("urgent2", 5)]
        reqs = {}
        for name, priority in order:
            req = request(rows(B), B)
            req.priority = priority
            reqs[name] = submit(ref, req)
        await settle()
        packed: list[str] = []
        while len(packed) < len(order):
            session.release()
            await settle()
            done = [n for n, r in reqs.items() if r.future.done() and n not in packed]
            packed.extend(done)
        assert first.future.done()
        assert packed == ["urgent", "urgent2", "high", "a", "b", "low"]
