"""How to wait for a device, and what a device must offer (seed: DeviceWaitConfig etc.).

Durations are seconds as ``float`` (DESIGN.md §2); the defaults are the seed's: ``NO_WAIT``,
``timeout=0``, ``sleep_time=15``.

A strategy only matters when no candidate device can be attached now: every one is held by
another process, or is exclusive (ipu-model, ``exclusive`` cpu) and attached in this process
already. A shareable cpu device that this process holds is attached at once (shared) under
every strategy, without a sleep (:mod:`actors.device.manager`).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from model_runtime.errors import ConfigurationError

__all__ = ["DeviceConstraints", "DeviceWaitConfig", "DeviceWaitStrategy"]


class DeviceWaitStrategy(enum.Enum):
    """What to do when no matching device can be attached right now (held by another
    process, or exclusive and held by this one; never for a shareable device held here)."""

    #: Raise :class:`~model_runtime.errors.DeviceUnavailableError` at once.
    NO_WAIT = "NO_WAIT"
    #: Retry every ``sleep_time`` seconds; give up after ``timeout`` seconds.
    WAIT_WITH_TIMEOUT = "WAIT_WITH_TIMEOUT"
    #: Retry every ``sleep_time`` seconds until attached or cancelled.
    WAIT_FOREVER = "WAIT_FOREVER"


@dataclass(frozen=True, slots=True)
class DeviceWaitConfig:
    """How to wait for a device: the strategy, the overall ``timeout`` and the retry interval.

    Raises:
        ConfigurationError: ``timeout`` or ``sleep_time`` is negative or not finite
            (``timeout`` may be ``inf``).
    """

    strategy: DeviceWaitStrategy = DeviceWaitStrategy.NO_WAIT
    timeout: float = 0.0
    sleep_time: float = 15.0

    def __post_init__(self) -> None:
        if not isinstance(self.strategy, DeviceWaitStrategy):
            raise ConfigurationError(
                f"DeviceWaitConfig: strategy {self.strategy!r} is not a DeviceWaitStrategy"
            )
        if math.isnan(self.timeout) or self.timeout < 0:
            raise ConfigurationError(f"DeviceWaitConfig: timeout {self.timeout} s is negative")
        if math.isnan(self.sleep_time) or self.sleep_time < 0 or math.isinf(self.sleep_time):
            raise ConfigurationError(
                f"DeviceWaitConfig: sleep_time {self.sleep_time} s must be finite and >= 0"
            )

    @classmethod
    def with_timeout(cls, timeout: float, sleep_time: float = 15.0) -> DeviceWaitConfig:
        """``WAIT_WITH_TIMEOUT`` for ``timeout`` seconds (the seed's one-argument constructor).

        Raises:
            ConfigurationError: a negative duration.
        """
        return cls(DeviceWaitStrategy.WAIT_WITH_TIMEOUT, timeout, sleep_time)


@dataclass(frozen=True, slots=True)
class DeviceConstraints:
    """Requirements a device must meet beyond its size."""

    requires_remote_buffers_support: bool = False

    def __bool__(self) -> bool:
        """True when there is any constraint (the seed's ``operator bool``)."""
        return self.requires_remote_buffers_support
