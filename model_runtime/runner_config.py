"""``ModelRunnerConfig``: the seed's ModelRunner configuration, in Python units.

Durations are seconds as ``float`` (the seed uses nanoseconds). ``None`` stands for the seed's
"max()" (never). Fields beyond the seed: ``fault_plan``, ``max_retries``, ``execution_timeout``,
``reset_timeout``, ``max_failed_recoveries``, the probe backoff, ``device_kind``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from model_runtime.errors import ConfigurationError

if TYPE_CHECKING:
    from actors.device.faults import FaultPlan
    from actors.device.wait import DeviceWaitConfig
    from model_runtime.queue_policy import QueuePolicy

__all__ = ["ModelRunnerConfig"]


@dataclass(slots=True)
class ModelRunnerConfig:
    """How a :class:`ModelRunner` runs its executable (seed: ``ModelRunnerConfig``)."""

    #: Number of replicas, each on its own device.
    replication_factor: int = 1
    #: Run the save programs when the runner closes (see ``replica_to_save_programs_outputs``).
    run_save_programs: bool = False
    #: Serialise calls from many threads (the blocking API is always thread-safe here).
    thread_safe: bool = False
    #: Tensors that override the executable's stored data at load (weights, variables).
    frozen_inputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: Filled when the runner closes with ``run_save_programs``: replica -> {variable: array}.
    replica_to_save_programs_outputs: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    #: Pin replicas to device ids (replica -> device id); others are assigned automatically.
    replica_to_device: Mapping[int, int] = field(default_factory=dict)
    #: How to wait for devices (default: fail at once when none is free).
    device_wait_config: DeviceWaitConfig | None = None
    #: Verify the package hash when loading the executable.
    check_package_hash: bool = True
    #: Seconds to wait for more samples before a partial batch is flushed; 0 = wait forever.
    timeout: float = 5.0
    #: Validate inputs/outputs on every execute().
    validate_io_params: bool = True
    #: Dimension holding the dynamic batch size; None disables dynamic batching.
    batching_dim: int | None = None
    #: Reset the device before the next inference after an application or IPU_RESET error.
    auto_reset: bool = False
    #: Batches prepared in advance: "unlimited" or a non-negative integer.
    max_look_ahead: int | str = "unlimited"
    #: Ring buffer size = multiplier x batch size.
    ring_buffer_size_multiplier: int = 2
    #: Flush dummy data only when a caller waits for outputs.
    flush_on_waiting_outputs: bool = False
    #: Seconds before flushing while composing a batch (when enabled); None = never.
    batch_size_timeout: float | None = None
    #: Seconds before flushing while waiting in parallel for data (when enabled); None = never.
    data_parallel_timeout: float | None = None
    #: Apply batch_size_timeout and data_parallel_timeout.
    is_batch_size_timeout_enabled: bool = False
    #: Request tracepoints kept per replica; 0 = unbounded.
    request_tracepoints_buffer_size: int = 1000
    #: Supplies flush data instead of zeros (see actors.queues for the signature).
    flush_callback: Callable[..., Any] | None = None
    # -- beyond the seed ------------------------------------------------------------------------
    #: Deterministic fault injection (a FaultPlan or its string form); None in production.
    fault_plan: FaultPlan | str | None = None
    #: Times a request is retried after a device reset before it gets the error.
    max_retries: int = 2
    #: Seconds a main-program run may take before it is treated as a hang; None = derived.
    execution_timeout: float | None = None
    #: Seconds without a sign of life, while a batch waits for it, before the watchdog restarts a
    #: replica's session; None = derived from the run and reset deadlines (a last resort).
    stall_timeout: float | None = None
    #: Seconds to wait for a device reset (and for requests arriving during one).
    reset_timeout: float = 30.0
    #: A replica leaves service after this many faults in a row, each after a reset (or
    #: restart) that no successful batch followed. Resets followed by progress never count.
    max_failed_recoveries: int = 3
    #: Out of service, a replica is re-probed after this many seconds, doubling each time up
    #: to ``probe_backoff_cap``; it serves again once a probe batch runs.
    probe_backoff_initial: float = 1.0
    probe_backoff_cap: float = 10.0
    #: Requests that may wait to be packed (over every replica) before a new one is refused at
    #: once with QueueFullError; None: no limit.
    max_queue_size: int | None = None
    #: Triton's queue policy per priority level (timeouts, REJECT or DELAY past them, a
    #: bound per level): :mod:`model_runtime.queue_policy`. None: none.
    queue_policy: QueuePolicy | None = None
    #: Admission control: a request is refused at once with QueueFullError when the replicas in
    #: service, at their measured rate, would need more than this many seconds to finish what
    #: is queued with it (a request is always taken when nothing waits). None: off (the
    #: library's default); the daemon sets 1 s, so overload costs fast refusals, not timeouts.
    latency_budget: float | None = None
    #: Seconds ``close()`` waits for in-flight requests before answering the rest with
    #: RunnerStoppedError.
    drain_timeout: float = 30.0
    #: Cores of this host the runner's event loop and its devices that compute on the host
    #: (cpu, ipu-model) share; None: the cores this process may run on. One is the loop's; a
    #: replica whose device's threads do not fit in what is left stands by (while batches are
    #: light, serves only when no other replica is in service): :mod:`model_runtime.placement`.
    host_cores: int | None = None

    def cores(self) -> int:
        """``host_cores``, or the cores this process may run on."""
        if self.host_cores is not None:
            return self.host_cores
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )

    def validate(self) -> None:
        """Check the values make sense together.

        Raises:
            ConfigurationError: naming the first bad field.
        """
        if self.replication_factor < 1:
            raise ConfigurationError(
                f"replication_factor must be >= 1, got {self.replication_factor}"
            )
        if self.host_cores is not None and (
            isinstance(self.host_cores, bool)
            or not isinstance(self.host_cores, int)
            or self.host_cores < 1
        ):
            raise ConfigurationError(f"host_cores must be an int >= 1, got {self.host_cores!r}")
        if self.timeout < 0:
            raise ConfigurationError(f"timeout must be >= 0 seconds, got {self.timeout}")
        if self.batching_dim is not None and self.batching_dim < 0:
            raise ConfigurationError(f"batching_dim must be >= 0, got {self.batching_dim}")
        if self.ring_buffer_size_multiplier < 1:
            raise ConfigurationError("ring_buffer_size_multiplier must be >= 1")
        if self.max_retries < 0:
            raise ConfigurationError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.latency_budget is not None and not self.latency_budget > 0:
            raise ConfigurationError(
                f"latency_budget must be > 0 seconds, got {self.latency_budget}"
            )
        if self.max_queue_size is not None and self.max_queue_size < 1:
            raise ConfigurationError(f"max_queue_size must be >= 1, got {self.max_queue_size}")
        if self.max_failed_recoveries < 1:
            raise ConfigurationError(
                f"max_failed_recoveries must be >= 1, got {self.max_failed_recoveries}"
            )
        if not 0 < self.probe_backoff_initial <= self.probe_backoff_cap:
            raise ConfigurationError(
                "probe_backoff_initial must be > 0 and <= probe_backoff_cap, got "
                f"{self.probe_backoff_initial} and {self.probe_backoff_cap}"
            )
        if self.request_tracepoints_buffer_size < 0:
            raise ConfigurationError("request_tracepoints_buffer_size must be >= 0")
        if isinstance(self.max_look_ahead, str):
            if self.max_look_ahead != "unlimited" and not (
                self.max_look_ahead.isdigit() and int(self.max_look_ahead) >= 0
            ):
                raise ConfigurationError(
                    f"max_look_ahead must be 'unlimited' or an integer >= 0, "
                    f"got {self.max_look_ahead!r}"
                )
        elif self.max_look_ahead < 0:
            raise ConfigurationError(f"max_look_ahead must be >= 0, got {self.max_look_ahead}")
        for name in ("batch_size_timeout", "data_parallel_timeout", "execution_timeout"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigurationError(f"{name} must be >= 0 seconds, got {value}")
        for replica in self.replica_to_device:
            if not 0 <= replica < self.replication_factor:
                raise ConfigurationError(
                    f"replica_to_device names replica {replica}, but replication_factor is "
                    f"{self.replication_factor}"
                )

    @property
    def look_ahead(self) -> int | None:
        """``max_look_ahead`` as an int, or None for "unlimited"."""
        if self.max_look_ahead == "unlimited":
            return None
        return int(self.max_look_ahead)
