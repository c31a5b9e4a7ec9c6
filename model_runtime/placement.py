"""Who takes a request: :meth:`Placement.pick`, the replica a request is queued on.

A base of :class:`~model_runtime.replicas.ReplicaSet` (its ``states``, ``queues`` and clock),
read on the hot path without messaging: the least-loaded ready replica, filling one open batch
at a time while every replica is busy, an idle one only when a second device pays; and what
the queued work would take (:meth:`Placement.backlog_seconds`, admission's price of a request).
"""

from __future__ import annotations

import math

from actors.clock import Clock
from actors.queues.actor import Queue
from actors.session.state import ReplicaState, ReplicaStatus
from model_runtime.errors import InputValidationError, ModelUnavailableError

__all__ = ["Placement"]

_READY = ReplicaStatus.READY  # read per request: a module global, not an enum lookup
#: A replica whose whole batch runs in fewer of its worker's hops than this
#: (``ReplicaState.batch_hops``) keeps taking requests while it has a free batch buffer, rather
#: than an idle replica running them alone (see pick()).
JOIN_HOPS = 10.0


class Placement:
    """The placement half of a replica set (see the module docstring)."""

    states: list[ReplicaState]
    queues: list[Queue]
    _clock: Clock
    #: Where the next least-loaded scan starts (round-robin among ties).
    _next: int = 0
    #: The replica filling its open batch while every replica in service was busy (-1:
    #: none), and the rows that batch has room for after the requests given to it: it
    #: takes requests until they fill it (see pick()).
    _filling: int = -1
    _room: int = 0
    #: The replica picked last whose idle device has a flush due this loop turn
    #: (``Queue.collecting``; -1: none): it takes requests while that lasts (see pick()).
    _collecting: int = -1

    def pick(
        self, replica_id: int | None, avoid: int = 0, now: float | None = None, samples: int = 1
    ) -> int:
        """The replica for a request of ``samples`` rows: ``replica_id``, or the least-loaded
        READY one not in the bitmask ``avoid`` (replicas that failed the request already);
        ``now``: the clock's time, if the caller has just read it.

        When every replica in service is busy (all its batch buffers in use, so nothing it is
        given now runs before one of its batches ends), the one picked keeps taking requests
        until they fill its open batch (the room it had, :meth:`Queue.open_room`, counted
        down here: no call into the queue): batches fill one at a time instead of all at once
        at 1/R the rate, and a request costs a few comparisons instead of a scan of the
        replicas. Likewise, while the replica picked last is collecting (its device idle, a
        flush due this loop turn that takes every row queued before it: the callers its last
        batch answered queueing again), it takes the request without a scan. An idle replica
        with nothing waiting, which would run the request alone, yields it to a replica whose
        device is running a batch and has a free buffer, when that device's whole batch runs
        in under :data:`JOIN_HOPS` of its hand-offs (``ReplicaState.batch_hops``): the request
        rides in that replica's next batch (a second device only when it pays).

        Raises:
            InputValidationError: ``replica_id`` is out of range.
            ModelUnavailableError: no replica is in service (``__cause__``: the last failure).
        """
        states = self.states
        if replica_id is None and not avoid:
            r = self._filling
            if r >= 0:  # (the common case under load: a few comparisons per request)
                room = self._room - samples
                state = states[r]
                if (
                    room >= 0
                    and state.status is _READY
                    and (self._clock.monotonic() if now is None else now) < state.hung_after
                ):
                    self._room = room
                    return r
                self._filling = -1
            r = self._collecting
            if r >= 0:  # (callers woken by one batch's answers: a call and two comparisons)
                state = states[r]
                if (
                    self.queues[r].collecting()
                    and state.status is _READY
                    and (self._clock.monotonic() if now is None else now) < state.hung_after
                ):
                    return r
                self._collecting = -1
            if len(states) == 1 and states[0].status is _READY:
                return 0
        n = len(states)
        if replica_id is not None:
            if not 0 <= replica_id < n:
                raise InputValidationError(f"replica_id {replica_id} is out of range [0, {n})")
            return replica_id
        ready = _READY
        # Least loaded ready replica; ties go round-robin from after the last one picked.
        best = -1
        best_load = math.inf
        queues = self.queues
        start = self._next
        if now is None:
            now = self._clock.monotonic()
        busy = True
        join, join_load = -1, math.inf  # a running replica of short batches with room
        for i in range(n):
            r = start + i
            if r >= n:
                r -= n
            # A replica whose run is past its deadline is not ready: its hang is being reset.
            state = states[r]
            if state.status is ready and not avoid >> r & 1 and now < state.hung_after:
                queue = queues[r]
                saturated = queue.saturated()
                busy = busy and saturated
                load = queue.placement()
                if load < best_load:
                    best, best_load = r, load
                if 0 < load < join_load and not saturated and 0.0 < state.batch_hops < JOIN_HOPS:
                    join, join_load = r, load
        if best_load == 0 and join >= 0:
            # The least loaded is idle with nothing waiting: it would run this request alone.
            # A device whose whole batch runs in under JOIN_HOPS hops takes it behind its run
            # instead (in its next batch) until its buffers are all in use: a one-row batch
            # costs the loop about what that wait saves, and a caller answered alone would be
            # sealed alone again, every time, on the idle device. Like a batch filled while
            # every replica is busy, the next requests go there without a scan until it is full.
            best = join
            room = queues[best].open_room() - samples
            if room > 0 and not avoid:
                self._filling, self._room = best, room
        if best < 0:
            # Nobody is ready: a replica that is resetting or starting queues the request
            # until it is (bounded by the reset timeout); FAILED ones never take work.
            for r in range(n):
                if not avoid >> r & 1 and states[r].status in (
                    ReplicaStatus.RESETTING,
                    ReplicaStatus.STARTING,
                ):
                    return r
            failure = next((s.failure for s in states if s.failure is not None), None)
            raise ModelUnavailableError(
                f"no replica is in service ({n} out of service, each re-probed)"
                + (f"; last failure: {failure}" if failure else "")
            ) from failure
        self._next = best + 1 if best + 1 < n else 0
        if not avoid and queues[best].collecting():
            self._collecting = best
        if busy and not avoid:
            room = queues[best].open_room() - samples
            if room > 0:  # (this request leaves room in its open batch for the next ones)
                self._filling, self._room = best, room
        return best

    def backlog_seconds(self, extra_samples: int) -> float:
        """Seconds the replicas in service would take to finish what is queued now plus
        ``extra_samples``, at their measured rates (0 when nothing is measured yet)."""
        rate = 0.0
        waiting = extra_samples
        for state, queue in zip(self.states, self.queues, strict=True):
            waiting += queue.pending_samples
            if state.status is ReplicaStatus.READY and state.seconds_per_sample > 0.0:
                rate += 1.0 / state.seconds_per_sample
        return waiting / rate if rate > 0.0 else 0.0

    def waiting_requests(self) -> int:
        """Requests waiting to be packed, over every replica's queue."""
        return sum(q.waiting_requests for q in self.queues)
