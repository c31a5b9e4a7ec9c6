"""Configuration of one replica's Queue actor (the queue part of the seed's ModelRunnerConfig).

Durations are seconds (floats). The semantics, as the Queue implements them:

``timeout``
    The idle timeout. While a batch is partly filled, it is flushed (padded and made ready)
    when no request has arrived for ``timeout`` seconds, measured from the *last arrival*
    (the Queue actor's clock when it handled the latest ``Enqueue``). ``0`` waits forever.
``flush_callback``
    ``flush_callback(tensor_id, inputs, outputs) -> None`` (see :data:`FlushCallback`), called
    once per flush of a partial batch instead of zero padding.
``flush_on_waiting_outputs``
    The seed's: flush a timed-out partial batch only when a caller waits for outputs. A caller
    of ``execute()`` waits from the start; one of ``execute_async()`` only once it awaits the
    result. Until then a partial batch holding only such rows waits for more data (no timeout
    flush); the first caller to await flushes it at once if its timeout has passed. With
    ``False`` the timeout flushes regardless. Rows whose caller went away before packing are
    dropped either way, so no pure-padding batch ever runs.
``ring_buffer_size_multiplier``
    The seed's ring size, ``ring_buffer_size_multiplier * batch size``: the ring memory pool
    holds that many batch buffers (each ``device_iterations * batch_size`` rows of every user
    input). It bounds how many batches are packed but not yet completed; past it, requests
    wait (unpacked).
``max_look_ahead``
    Batches prepared in advance of the one on the device: at most ``1 + max_look_ahead``
    batches are packed and not completed (and never more than the pool holds). ``0``: a batch
    is packed only once the previous one completed, so rows arriving meanwhile ride in it.
    ``None`` ("unlimited" in the seed: the runtime decides) means as many as the pool holds.
``batch_size_timeout`` / ``data_parallel_timeout`` (only with ``is_batch_size_timeout_enabled``)
    ``batch_size_timeout``: a partial batch is flushed at the latest this long after it got its
    first row, however steadily data trickles in (the idle ``timeout`` alone never fires under a
    steady trickle). ``data_parallel_timeout``: with ``device_iterations`` I > 1, once the
    first of the I batches of one run is complete, the others get at most this long to fill
    before the run is flushed. ``None`` disables either.
``request_tracepoints_buffer_size``
    How many per-request time traces are kept for statistics (``0``: unbounded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from model_runtime.errors import ConfigurationError

__all__ = ["FlushCallback", "QueueConfig"]

#: ``flush_callback(tensor_id, inputs, outputs)``, modelled on the seed's. ``tensor_id`` names
#: the user input the queue was waiting for (the first user input anchor). ``inputs`` maps every
#: batched user input to a zero-filled array holding exactly the missing (padding) rows along
#: the row axis: write the flush data into it in place, or replace an entry with an array of the
#: same shape and dtype. ``outputs`` starts empty: put an array with the same number of rows
#: under an output name to receive the padding rows' outputs of that output (else discarded).
#: It runs on the event loop, inside the Queue actor: keep it short. An exception it raises
#: fails the requests of the batch being flushed.
FlushCallback = Callable[[str, dict[str, np.ndarray], dict[str, np.ndarray]], None]


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """How a replica's Queue packs requests into batches (see the module docstring)."""

    batching_dim: int | None = None
    timeout: float = 5.0
    flush_callback: FlushCallback | None = None
    flush_on_waiting_outputs: bool = False
    ring_buffer_size_multiplier: int = 2
    max_look_ahead: int | None = None
    batch_size_timeout: float | None = None
    data_parallel_timeout: float | None = None
    is_batch_size_timeout_enabled: bool = False
    request_tracepoints_buffer_size: int = 1000

    def __post_init__(self) -> None:
        """Check the values.

        Raises:
            ConfigurationError: a value is out of range.
        """
        if self.batching_dim is not None and self.batching_dim < 0:
            raise ConfigurationError(f"batching_dim must be >= 0, got {self.batching_dim}")
        if not self.timeout >= 0:
            raise ConfigurationError(f"timeout must be >= 0 seconds, got {self.timeout}")
        if self.ring_buffer_size_multiplier < 1:
            raise ConfigurationError(
                f"ring_buffer_size_multiplier must be >= 1, got {self.ring_buffer_size_multiplier}"
            )
        if self.max_look_ahead is not None and self.max_look_ahead < 0:
            raise ConfigurationError(f"max_look_ahead must be >= 0, got {self.max_look_ahead}")
        for name in ("batch_size_timeout", "data_parallel_timeout"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ConfigurationError(f"{name} must be >= 0 seconds, got {value}")
        if self.request_tracepoints_buffer_size < 0:
            raise ConfigurationError(
                "request_tracepoints_buffer_size must be >= 0, "
                f"got {self.request_tracepoints_buffer_size}"
            )

    @property
    def pool_buffers(self) -> int:
        """Batch buffers in the ring memory pool: ``ring_buffer_size_multiplier``."""
        return self.ring_buffer_size_multiplier

    @property
    def look_ahead(self) -> int:
        """Batches packed and not completed at most (and capacity of ``Queue.ready``): the one
        on the device and ``max_look_ahead`` more, within the pool."""
        if self.max_look_ahead is None:
            return self.pool_buffers
        return min(self.pool_buffers, 1 + self.max_look_ahead)
