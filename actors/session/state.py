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
    """Where a replica is in its life. Only READY replicas take new requests.

    FAILED is "out of service": the replica stopped making progress (or its device failed for
    good); its requests moved to the others and it is re-probed until it serves again.
    """

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
    #: The replica stands by: while the model's batches are light it takes requests only
    #: when no other replica is in service (its device would compute on host cores the others
    #: and the event loop use; ``model_runtime.placement``).
    standby: bool = False
    status: ReplicaStatus = ReplicaStatus.STARTING
    #: Batches handed to the device and not yet answered, by batch id; a restarted session
    #: runs them again first.
    inflight: dict[int, Any] = field(default_factory=dict)
    #: Variables from the last save, restored after a reset (None: the executable's initial).
    saved_variables: dict[str, np.ndarray] | None = None
    failure: BaseException | None = None
    runs: int = 0
    #: Completed runs by the batch size they executed (a bucket, or the full batch): what
    #: Triton's ``batch_stats`` reports.
    runs_by_size: dict[int, int] = field(default_factory=dict)
    resets: int = 0
    retries: int = 0
    restarts: int = 0
    #: Faults since the last successful batch that a reset or restart did not cure; the
    #: replica leaves service when it reaches the policy's ``max_failed_recoveries``.
    failed_recoveries: int = 0
    #: A reset or restart happened and no batch has succeeded since.
    recovering: bool = False
    #: Times the replica left service, probes run while out of service, and the next wait.
    outages: int = 0
    probes: int = 0
    probe_delay: float = 0.0
    #: Requests answered with InputValidationError after a bisection found them poisoned.
    poisoned: int = 0
    #: Clock time past which the run on the device counts as hung (inf: nothing running).
    hung_after: float = float("inf")
    #: Measured seconds of device time per sample (a moving average over recent batches; 0:
    #: not measured yet), what admission control prices a waiting sample at.
    seconds_per_sample: float = 0.0
    #: One run of a whole batch on the device, in its worker's hops (``Device.run_hops``,
    #: from runs at least half full, scaled to the whole batch; 0: not measured yet): whether
    #: another device pays for a request (:mod:`model_runtime.placement`).
    batch_hops: float = 0.0
    #: Failed runs seen (any kind), and when the current unrecovered one happened.
    faults: int = 0
    #: Last sign of life of the replica's session (clock time), read by the watchdog.
    heartbeat: float = 0.0
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
        """READY; callers with a clock also check :meth:`is_ready_at` (no hung run)."""
        return self.status is ReplicaStatus.READY

    def is_ready_at(self, now: float) -> bool:
        """READY and no run on the device past its execution deadline at clock time ``now``."""
        return self.status is ReplicaStatus.READY and now < self.hung_after
