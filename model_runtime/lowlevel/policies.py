"""Policies and value types of the low-level API (seed: SessionUtils / SessionConfig).

Callbacks (seed ``CallbackHandle``, ``void(void*)``) are plain callables taking one numpy array:

* for an anchor the device *reads* (inputs; weights and variables at load) the array is a
  writable buffer of the anchor's shape and dtype whose previous contents are unspecified: fill
  it in place, or return an array of that shape and dtype to be used instead;
* for an anchor the device *writes* (outputs; variables at save) the array is read-only and
  valid only for the duration of the call: copy what you keep.

A variable anchor is both: its callback is called with a writable buffer at load and a
read-only array at save (``array.flags.writeable`` tells which).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from actors.device.wait import DeviceWaitConfig
from model_runtime.errors import ConfigurationError
from model_runtime.executable.model import Anchor

__all__ = [
    "AnchorCallbackPolicy",
    "AnchorCallbackPredicate",
    "AnchorWithPolicy",
    "CallbackFactory",
    "CallbackHandle",
    "CallbackInfo",
    "LaunchPolicy",
    "PopefDataUsagePolicy",
    "PopefDataUsagePredicate",
    "ProgramsWithPolicy",
    "SessionConfig",
]

#: Called whenever the device reads from or writes to an anchor (see the module docstring).
CallbackHandle = Callable[[np.ndarray], object]


class AnchorCallbackPolicy(enum.Enum):
    """What to bind to an anchor (seed ``AnchorCallbackPolicy``)."""

    BIND_USER_CB = 0  #: bind the user's callback (from the factory)
    BIND_EMPTY_CB = 1  #: bind an empty callback: inputs read zeros, outputs are dropped
    SKIP_CB = 2  #: bind nothing; the anchor keeps whatever it had


class PopefDataUsagePolicy(enum.Enum):
    """Whether data stored in the executable feeds an anchor (seed ``PopefDataUsagePolicy``)."""

    USE_POPEF_DATA_IF_ANY = 0  #: the stored tensor data feeds the anchor (if it has any)
    USE_USER_DATA = 1  #: ignore stored data: the anchor needs a user callback


class LaunchPolicy(enum.Enum):
    """When the session attaches a device and loads (seed ``LaunchPolicy``)."""

    IMMEDIATE = "immediate"  #: attach a device and load when the session starts
    DEFERRED = "deferred"  #: wait for :meth:`Session.bind_to_device`


@dataclass(frozen=True, slots=True)
class CallbackInfo:
    """What a :data:`CallbackFactory` is told about the anchor it makes a callback for."""

    anchor: Anchor


#: Makes the callback for one anchor; ``None`` keeps the anchor's current binding.
CallbackFactory = Callable[[CallbackInfo], CallbackHandle | None]
AnchorCallbackPredicate = Callable[[Anchor], AnchorCallbackPolicy]
PopefDataUsagePredicate = Callable[[Anchor], PopefDataUsagePolicy]

P = TypeVar("P", AnchorCallbackPolicy, PopefDataUsagePolicy)


@dataclass(frozen=True, slots=True)
class AnchorWithPolicy(Generic[P]):
    """A policy for one anchor (matched by name) in ``pred_anchors_policies``."""

    anchor: Anchor | str
    policy: P

    @property
    def name(self) -> str:
        return self.anchor if isinstance(self.anchor, str) else self.anchor.name


@dataclass(frozen=True, slots=True)
class ProgramsWithPolicy(Generic[P]):
    """A policy for the anchors of some programs in ``pred_program_indexes``."""

    programs_indexes: tuple[int, ...]
    policy: P


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Session configuration (seed ``SessionConfig``).

    ``pred_tensor_data`` decides, per anchor, whether stored data feeds it (``None``: stored
    data wherever there is some). ``max_look_ahead`` is ``"unlimited"`` or a count of main runs
    the session may prepare in advance. It is validated and exposed, and every value behaves
    as ``0`` here: this Session reads a run's inputs only when ``run_main_programs`` is called,
    so it never prepares a run ahead of its caller (the ModelRunner, which does, honours it).

    Raises:
        ConfigurationError: a bad ``policy`` or ``max_look_ahead``.
    """

    policy: LaunchPolicy = LaunchPolicy.DEFERRED
    pred_tensor_data: PopefDataUsagePredicate | None = None
    check_package_hash: bool = True
    wait_config: DeviceWaitConfig = field(default_factory=DeviceWaitConfig)
    max_look_ahead: str | int = "unlimited"

    def __post_init__(self) -> None:
        if not isinstance(self.policy, LaunchPolicy):
            raise ConfigurationError(f"SessionConfig: policy {self.policy!r} is no LaunchPolicy")
        self.look_ahead  # noqa: B018 (validates)

    @property
    def look_ahead(self) -> float:
        """``max_look_ahead`` as a number (``math.inf`` for ``"unlimited"``).

        Raises:
            ConfigurationError: not ``"unlimited"`` nor a non-negative integer.
        """
        value = self.max_look_ahead
        if value == "unlimited":
            return math.inf
        try:
            n = int(value)
        except (TypeError, ValueError):
            n = -1
        if n < 0 or isinstance(value, bool) or (isinstance(value, str) and not value.isdigit()):
            raise ConfigurationError(
                f"SessionConfig: max_look_ahead {value!r} is not 'unlimited' or an integer >= 0"
            )
        return float(n)
