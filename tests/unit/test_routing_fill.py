"""Who takes a request: one replica's batch fills at a time, as one sealer's would.

``ReplicaSet.pick`` takes, per request while some replica has a free batch buffer, the one
whose rows would run soonest (``Queue.placement()``: fewest batches in flight, then the batch
being filled), so R replicas never split a few callers into R half-full batches; once all are
saturated, the replica it picked keeps taking requests until their rows fill its
open batch (the room ``Queue.open_room()`` gave when it was picked, counted down by each
request's rows), then it picks the least loaded again. A replica leaving service, or a run past
its deadline, ends that at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from test_queue_support import make_queue, metadata, request, rows, running, settle

from actors.clock import FakeClock
from actors.session.runs import RunTimes
from actors.session.state import ReplicaState, ReplicaStatus
from model_runtime.replicas import ReplicaSet


@dataclass
class _Queue:
    """What pick() reads of a queue, set by hand."""

    pending_samples: int = 0
    busy: bool = False  # saturated()
    room: int = 32  # open_room()
    batches: int = 0  # sealed and not completed
    waiting: int = 0  # rows waiting to be packed
    flush_due: bool = False  # collecting(): idle, a flush due this loop turn

    def placement(self) -> int:  # as Queue.placement (2 buffers)
        if self.busy:
            return (2 << 32) + self.waiting
        return (self.batches << 32) - self.waiting - self.flush_due

    def saturated(self) -> bool:
        return self.busy

    def open_room(self) -> int:
        return self.room

    def collecting(self) -> bool:
        return self.flush_due


def _replicas(n: int, clock: FakeClock) -> tuple[ReplicaSet, list[_Queue]]:
    rs = ReplicaSet.__new__(ReplicaSet)  # only what pick() reads: no tree, no devices
    rs.states = [ReplicaState(replica=r, status=ReplicaStatus.READY) for r in range(n)]
    queues = [_Queue() for _ in range(n)]
    rs.queues = queues  # type: ignore[assignment]
    rs._clock = clock
    rs._next = 0
    rs._filling = -1
    rs._room = 0
    rs._collecting = -1
    return rs, queues


def test_while_a_replica_has_room_the_batch_being_filled_takes_the_requests() -> None:
    # Issue 46: least loaded per request split 16 callers over two replicas into batches of
    # 4-8, each paying a batch's fixed cost on the loop: two devices served half of one.
    rs, queues = _replicas(2, FakeClock())
    picks = []
    for _ in range(4):  # both idle: the first one's batch fills
        r = rs.pick(None)
        picks.append(r)
        queues[r].waiting += 1
    assert picks == [0, 0, 0, 0]
    queues[0].batches, queues[0].waiting = 1, 0  # sealed and running: the idle one fills next
    assert [rs.pick(None) for _ in range(2)] == [1, 1]
    queues[1].batches = 2  # both busy, replica 1 more so: replica 0's next batch
    assert rs.pick(None) == 0


def test_all_busy_the_picked_replica_fills_its_batch_then_least_loaded_again() -> None:
    rs, queues = _replicas(2, FakeClock())
    for q in queues:
        q.busy = True
    queues[0].waiting = 14
    queues[1].waiting = 10
    queues[1].room = 6  # its open batch needs 6 more rows
    assert rs.pick(None) == 1  # the fewest rows waiting
    queues[1].waiting = 16
    assert [rs.pick(None) for _ in range(5)] == [1] * 5  # the 6 rows: no scan, no call
    assert rs.pick(None) == 0  # that batch is full: the fewest rows waiting again


def test_the_open_batch_is_counted_in_rows_a_request_that_does_not_fit_goes_elsewhere() -> None:
    rs, queues = _replicas(2, FakeClock())
    for q in queues:
        q.busy = True
    queues[0].waiting = 10
    queues[1].room = 7
    assert rs.pick(None, samples=2) == 1  # 5 rows of room left
    assert rs.pick(None, samples=4) == 1  # 1 left
    queues[1].waiting = 16
    assert rs.pick(None, samples=2) == 0  # does not fit: the fewest rows waiting again


def test_a_filling_replica_that_leaves_service_or_hangs_takes_nothing_more() -> None:
    clock = FakeClock()
    rs, queues = _replicas(2, clock)
    for q in queues:
        q.busy = True
    queues[1].waiting = 1
    assert rs.pick(None) == 0
    assert rs.pick(None) == 0
    rs.states[0].hung_after = clock.monotonic()  # its run is past its deadline
    assert rs.pick(None) == 1
    rs.states[0].hung_after = math.inf
    rs.states[1].set_status(ReplicaStatus.RESETTING)
    assert rs.pick(None) == 0
    rs.states[0].set_status(ReplicaStatus.FAILED)
    assert rs.pick(None) == 1  # RESETTING still queues when nobody is ready


def test_a_device_of_short_batches_takes_a_lone_request_behind_its_run_until_saturated() -> None:
    # Issue 46, 64 callers on two devices of a light model: a caller answered alone found the
    # other device idle and ran alone there, every time (a third of the runs one-row, each
    # costing the loop a batch). Replica 0 runs a batch of a few hops: the request waits for
    # its next batch instead; a heavy model's idle device still takes it at once.
    def running_and_idle(hops: float) -> tuple[ReplicaSet, list[_Queue]]:
        rs, queues = _replicas(2, FakeClock())
        queues[0].batches = 1  # running, nothing waiting; replica 1 idle, nothing waiting
        queues[0].room = 3  # its open batch
        rs.states[0].batch_hops = hops
        return rs, queues

    rs, queues = running_and_idle(3.0)
    assert rs.pick(None) == 0
    rs.states[0].batch_hops = 50.0  # (a scan would now say replica 1) ...
    assert [rs.pick(None) for _ in range(2)] == [0, 0]  # ... the rest of its batch: no scan
    assert rs.pick(None) == 1  # a run worth many hand-offs: the idle device pays
    rs, queues = running_and_idle(0.0)  # not measured yet: as before
    assert rs.pick(None) == 1
    rs, queues = running_and_idle(3.0)
    queues[0].busy = True  # every buffer of replica 0 in use: the idle one
    assert rs.pick(None) == 1
    rs, queues = running_and_idle(3.0)
    queues[1].flush_due = True  # replica 1 collects callers its last batch answered: it
    assert rs.pick(None) == 1  # takes them (they ride in one batch, sealed this loop turn)


def test_the_callers_of_an_idle_replicas_last_batch_go_back_to_it_without_a_scan() -> None:
    # A batch answered on idle replica 0: its callers queue again before its flush (due this
    # loop turn), each to replica 0 at the cost of a call and two comparisons.
    clock = FakeClock()
    rs, queues = _replicas(2, clock)
    queues[0].flush_due = True
    queues[0].waiting = 1
    assert rs.pick(None) == 0  # the scan's answer: the batch being filled ...
    queues[0].waiting = 0  # ... kept while it collects, even where a scan would say else
    queues[1].waiting = 5
    assert [rs.pick(None) for _ in range(3)] == [0, 0, 0]
    rs.states[0].set_status(ReplicaStatus.RESETTING)  # out of service: a scan again
    assert rs.pick(None) == 1
    rs.states[0].set_status(ReplicaStatus.READY)
    queues[0].flush_due = False  # flushed: the scan decides
    assert rs.pick(None) == 1


def test_a_moved_request_avoids_the_replicas_that_failed_it_even_while_filling() -> None:
    rs, queues = _replicas(2, FakeClock())
    for q in queues:
        q.busy = True
    assert rs.pick(None) == 0
    assert rs.pick(None, avoid=1) == 1


async def test_queue_reports_saturated_and_the_room_its_open_batch_has() -> None:
    clock = FakeClock()
    queue = make_queue(metadata(4), clock, batching_dim=0, ring_buffer_size_multiplier=2)
    async with running(queue, hold=True) as (_, fake):
        for _ in range(8):  # two full batches: both buffers in use
            queue.enqueue_nowait(request(rows(1), 1, clock=clock))
        await settle()
        assert queue.saturated() and queue.open_room() == 4  # no batch open: a whole one
        for i in range(4):
            queue.enqueue_nowait(request(rows(1), 1, clock=clock))
            assert queue.open_room() == (3 - i or 4)  # the 4th row completes the batch
        fake.release()
        await settle()
        assert len(fake.seen) == 3


def test_run_times_keep_the_slowest_of_the_recent_runs() -> None:
    times = RunTimes()
    rng = np.random.default_rng(0)
    for seconds in rng.exponential(1.0, 500):
        times.add(float(seconds))
        assert times.slowest == max(times.samples)
    assert times.deadline(0.0, 99.0) == 20.0 * max(times.samples)


async def test_a_queue_places_the_batch_it_fills_before_an_idle_one_and_a_full_one_last() -> None:
    # The order pick() follows (Queue.placement): an idle queue, then one with a batch being
    # filled beside a batch in flight, then one with a batch in flight and nothing waiting;
    # with every buffer in use, last, and the more rows wait there the later.
    clock = FakeClock()
    meta = metadata(4)
    idle, filling, busy, full = (
        make_queue(meta, clock, batching_dim=0, ring_buffer_size_multiplier=2, timeout=10.0)
        for _ in range(4)
    )
    async with (
        running(idle, hold=True),
        running(filling, hold=True),
        running(busy, hold=True),
        running(full, hold=True),
    ):
        for queue, n in ((filling, 5), (busy, 4), (full, 9)):
            for _ in range(n):
                queue.enqueue_nowait(request(rows(1), 1, clock=clock))
        await settle()
        assert full.saturated() and not busy.saturated()
        order = [idle.placement(), filling.placement(), busy.placement(), full.placement()]
        assert order[1] < order[2] < order[3] and order[0] < order[2]
        before = full.placement()
        full.enqueue_nowait(request(rows(1), 1, clock=clock))
        assert full.placement() > before  # a saturated queue: rows wait behind its rows
        before = filling.placement()
        filling.enqueue_nowait(request(rows(1), 1, clock=clock))
        assert filling.placement() < before  # its open batch fills: it comes first
