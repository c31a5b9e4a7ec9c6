"""Per-replica state that outlives the actors of the replica (they may be restarted)."""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np

__all__ = ["ReplicaState", "ReplicaStatus"]


class ReplicaStatus(enum.Enum):
    """Where a replica is in its life. Only READY replicas take new requests."""

    STARTING = "starting"
    READY = "ready"
    RESETTING = "resetting"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(slots=True, eq=False)
class ReplicaState:
    """What the runner and the replica's actors share about one replica."""

    replica: int
    device_id: int = -1
    status: ReplicaStatus = ReplicaStatus.STARTING
    #: Batches handed to the device and not yet answered, by batch id; a restarted session
    #: runs them again first.
    inflight: dict[int, Any] = field(default_factory=dict)
    #: Variables from the last save, restored after a reset (None: the executable's initial).
    saved_variables: dict[str, np.ndarray] | None = None
    failure: BaseException | None = None
    runs: int = 0
    resets: int = 0
    retries: int = 0
    restarts: int = 0
    reset_times: deque[float] = field(default_factory=deque)
    #: Failed runs seen (any kind), and when the current unrecovered one happened.
    faults: int = 0
    #: Last sign of life of the replica's session (clock time), read by the watchdog.
    heartbeat: float = 0.0
    stalls: int = 0
    fault_at: float | None = None
    #: Seconds from each fault to the next successful batch on this replica (bounded).
    recovery_times: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    #: Set whenever the status changes, so waiters (requests during a reset) can re-check.
    changed: anyio.Event = field(default_factory=anyio.Event)

    def set_status(self, status: ReplicaStatus) -> None:
        if status is self.status:
            return
        self.status = status
        self.changed.set()
        self.changed = anyio.Event()

    @property
    def is_ready(self) -> bool:
        return self.status is ReplicaStatus.READY
