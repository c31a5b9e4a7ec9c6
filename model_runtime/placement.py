"""Who takes a request: :meth:`Placement.pick`, the replica a request is queued on.

A base of :class:`~model_runtime.replicas.ReplicaSet` (its ``states``, ``queues`` and clock),
read on the hot path without messaging: the least-loaded ready replica, filling one open batch
at a time while every replica is busy, an idle one only when a second device pays; and what
the queued work would take (:meth:`Placement.backlog_seconds`, admission's price of a request).

Replicas on devices that compute on this host's cores (cpu, ipu-model) share them with the
event loop, which packs, hands over and answers every batch and holds the interpreter lock
while it does. A replica whose device's threads do not fit in the cores the loop and the
replicas before it leave stands by (:func:`host_standby`) while the model's batches are light
(a whole batch's run under :data:`JOIN_HOPS` of its worker's hand-offs, as measured on the
first replica in service; or not measured yet): it is loaded and watched, and takes a request
only while no other replica is in service (a fault, a reset, a hang) or when asked for by
``replica_id``. On a 2-core host a second cpu device running light batches beside the first
and the loop made three threads for two cores: the loop, preempted while holding the
interpreter lock, kept both devices waiting for it. A heavy model's batches leave the loop
idle most of the time, and there every replica serves (docs/architecture.md, "Replicas and
the host's cores").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from actors.clock import Clock
from actors.device.inventory import DeviceSpec
from actors.queues.actor import Queue
from actors.session.state import ReplicaState, ReplicaStatus
from model_runtime.errors import InputValidationError, ModelUnavailableError

__all__ = ["HOST_KINDS", "Placement", "host_standby"]

_READY = ReplicaStatus.READY  # read per request: a module global, not an enum lookup
#: A replica whose whole batch runs in fewer of its worker's hops than this
#: (``ReplicaState.batch_hops``) keeps taking requests while it has a free batch buffer, rather
#: than an idle replica running them alone (see pick()).
JOIN_HOPS = 10.0
#: Device kinds that compute on this host's cores, with ``DeviceSpec.threads`` threads.
HOST_KINDS = frozenset({"cpu", "ipu-model"})


def host_standby(specs: Sequence[DeviceSpec], cores: int) -> int:
    """The replicas (a bitmask of their indices; replica r is ``specs[r]``'s) that stand by
    on a host of ``cores`` cores: one core is the event loop's, and the replicas on
    :data:`HOST_KINDS` devices take the rest in order, each its device's threads; one whose
    threads no longer fit stands by. The first such replica never does (a model is always
    served), nor does a replica on a device that computes elsewhere."""
    left = cores - 1
    first = True
    standby = 0
    for r, spec in enumerate(specs):
        if spec.kind not in HOST_KINDS:
            continue
        if first or spec.threads <= left:
            left -= spec.threads
            first = False
        else:
            standby |= 1 << r
    return standby


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
    #: Replicas standing by while batches are light (a bitmask, :func:`host_standby`); the
    #: first replica in service, whose batches tell light from heavy; and the one replica in
    #: service beside those standing by when there is one (-1: none, or none stands by).
    _standby: int = 0
    _first: int = 0
    _sole: int = -1

    def stand_by(self, standby: int) -> None:
        """Make the replicas in the bitmask ``standby`` stand by (the module docstring; each
        state's ``standby`` says it); at least one replica stays in service."""
        n = len(self.states)
        standby &= (1 << n) - 1
        if standby == (1 << n) - 1:
            standby &= ~1
        self._standby = standby
        for r, state in enumerate(self.states):
            state.standby = bool(standby >> r & 1)
        serving = [r for r in range(n) if not standby >> r & 1]
        self._first = serving[0]
        self._sole = serving[0] if standby and len(serving) == 1 else -1

    def sole(self) -> int:
        """The one replica in service while the others stand by (-1: none stands by, or more
        than one serves)."""
        return self._sole

    def standing_by(self, r: int) -> bool:
        """Replica ``r`` stands by while batches are light (the module docstring)."""
        return bool(self._standby >> r & 1)

    def _standby_now(self) -> int:
        """The replicas standing by now: those of :func:`host_standby` while the model's
        batches are light (or not measured yet), none while they are heavy."""
        if self._standby and self.states[self._first].batch_hops < JOIN_HOPS:
            return self._standby
        return 0

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
            r = self._sole
            if r >= 0:  # one replica in service, the others standing by (batches are light)
                state = states[r]
                if (
                    state.status is _READY
                    and state.batch_hops < JOIN_HOPS
                    and (self._clock.monotonic() if now is None else now) < state.hung_after
                ):
                    return r
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
        # The replicas in service first; those standing by only when none of them is ready.
        standby = self._standby_now()
        for skip in (avoid | standby, avoid) if standby else (avoid,):
            for i in range(n):
                r = start + i
                if r >= n:
                    r -= n
                # A replica whose run is past its deadline is not ready: its hang is being
                # reset.
                state = states[r]
                if state.status is ready and not skip >> r & 1 and now < state.hung_after:
                    queue = queues[r]
                    saturated = queue.saturated()
                    busy = busy and saturated
                    load = queue.placement()
                    if load < best_load:
                        best, best_load = r, load
                    if (
                        0 < load < join_load
                        and not saturated
                        and 0.0 < state.batch_hops < JOIN_HOPS
                    ):
                        join, join_load = r, load
            if best >= 0:
                break
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
        rate = standby_rate = 0.0
        waiting = extra_samples
        standby = self._standby_now()
        for r, (state, queue) in enumerate(zip(self.states, self.queues, strict=True)):
            waiting += queue.pending_samples
            if state.status is ReplicaStatus.READY and state.seconds_per_sample > 0.0:
                if standby >> r & 1:
                    standby_rate += 1.0 / state.seconds_per_sample
                else:
                    rate += 1.0 / state.seconds_per_sample
        rate = rate or standby_rate  # (those standing by serve only when no other does)
        return waiting / rate if rate > 0.0 else 0.0

    def waiting_requests(self) -> int:
        """Requests waiting to be packed, over every replica's queue."""
        return sum(q.waiting_requests for q in self.queues)
