"""The Watchdog actor: heartbeats from every replica's session; stalls are restarted.

Hangs *inside a run* are the session's to detect: its ask to the device carries the execution
deadline, and a run past it is reset like any device failure. What a session cannot see is
itself getting stuck. The watchdog reads each replica's heartbeat (``ReplicaState.heartbeat``,
touched by the session whenever it takes, finishes or waits for a batch) and calls a replica
stalled when, while the replica is READY:

* a sealed batch waits for the session and the session has shown no sign of life for
  ``stall_after`` seconds, or
* the session has held one batch for ``stall_after`` seconds (far past every run and reset
  deadline, so it is not a slow run).

A stalled replica's session is restarted through the supervisor; the new session runs the
batch left in flight first, so no request is lost. Time is read through the injected clock.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from actors.actor import Actor
from actors.clock import Clock
from actors.session.state import ReplicaState, ReplicaStatus

__all__ = ["WatchTarget", "Watchdog"]


@dataclass(frozen=True, slots=True)
class WatchTarget:
    """What the watchdog watches of one replica, and how it restarts its session."""

    state: ReplicaState
    #: Sealed batches waiting for the session (the queue's ready stream backlog).
    waiting_batches: Callable[[], int]
    restart_session: Callable[[], Awaitable[None]]


class Watchdog(Actor[object]):
    """Checks every ``interval`` seconds; see the module docstring."""

    def __init__(
        self,
        targets: Callable[[], Sequence[WatchTarget]],
        *,
        interval: float,
        stall_after: float,
        clock: Clock | None = None,
    ) -> None:
        super().__init__("watchdog", clock=clock)
        self._targets = targets
        self.interval = interval
        self.stall_after = stall_after
        self.stalls = 0
        #: replica -> clock time of the watchdog's last restart of its session. The replica's
        #: state is its session's to write; the watchdog only reads it.
        self._restarted_at: dict[int, float] = {}

    async def background(self) -> None:
        while True:
            await self.clock.sleep(self.interval)
            for target in self._targets():
                if self.is_stalled(target):
                    await self._restart(target)

    def is_stalled(self, target: WatchTarget) -> bool:
        """True when ``target``'s session shows the signs of a stall (module docstring)."""
        state = target.state
        if state.status is not ReplicaStatus.READY:
            return False
        now = self.clock.monotonic()
        # One restart per stall, not one per check: silence counts from the last restart too.
        silent = now - max(state.heartbeat, self._restarted_at.get(state.replica, -math.inf))
        if state.inflight:
            return silent >= self.stall_after
        return target.waiting_batches() > 0 and silent >= self.stall_after

    async def _restart(self, target: WatchTarget) -> None:
        state = target.state
        self.stalls += 1
        self.log.error(
            "replica_stalled",
            replica=state.replica,
            silent_s=round(self.clock.monotonic() - state.heartbeat, 3),
            holding_batch=bool(state.inflight),
        )
        self._restarted_at[state.replica] = self.clock.monotonic()
        await target.restart_session()
