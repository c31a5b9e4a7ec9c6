"""What feeds and drains each anchor of a session: the anchor table and the bindings.

Which anchors cross the host/device boundary, per program kind:

* load programs read the weights and variables they own (data stored in the executable, or,
  when :class:`PopefDataUsagePolicy` says ``USE_USER_DATA`` or there is none, a user binding);
* main programs read their ``USER_INPUT`` anchors and write their ``USER_OUTPUT`` anchors once
  per device iteration;
* save programs write the variables they own.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from actors.device.manager import AttachedDevice
from model_runtime.errors import InputValidationError
from model_runtime.executable.model import (
    Anchor,
    AnchorRole,
    ExecutableMetadata,
    ProgramKind,
)
from model_runtime.lowlevel.policies import (
    CallbackHandle,
    PopefDataUsagePolicy,
    PopefDataUsagePredicate,
)
from model_runtime.lowlevel.queues import InputQueue, OutputQueue

__all__ = ["EMPTY", "AnchorTable", "Binding", "Empty", "Occupancy", "QueueBound", "UserCallback"]


@dataclass(frozen=True, slots=True)
class UserCallback:
    callback: CallbackHandle


@dataclass(frozen=True, slots=True)
class Empty:
    """The seed's empty callback: inputs read zeros, outputs are dropped."""


@dataclass(frozen=True, slots=True)
class QueueBound:
    queue: InputQueue | OutputQueue


Binding = UserCallback | Empty | QueueBound
EMPTY = Empty()


class AnchorTable:
    """The anchors of one executable, classified (see the module docstring)."""

    def __init__(self, meta: ExecutableMetadata, pred: PopefDataUsagePredicate | None) -> None:
        self.meta = meta
        self.kinds = {p.id: p.kind for p in meta.programs}
        save_ids = {p.id for p in meta.programs if p.kind is ProgramKind.SAVE}
        in_roles = (AnchorRole.USER_INPUT, AnchorRole.WEIGHT, AnchorRole.VARIABLE)
        self.inputs = tuple(a for a in meta.anchors if a.role in in_roles)
        self.outputs = tuple(
            a
            for a in meta.anchors
            if a.role is AnchorRole.USER_OUTPUT
            or (a.role is AnchorRole.VARIABLE and save_ids.intersection(a.programs))
        )
        self.popef_fed = frozenset(
            a.name
            for a in self.inputs
            if a.has_data
            and (pred is None or _policy(pred, a) is PopefDataUsagePolicy.USE_POPEF_DATA_IF_ANY)
        )
        self.user_inputs = tuple(a for a in self.inputs if a.name not in self.popef_fed)
        main = set(meta.program_flow.main)
        self.per_run = {
            a.name: meta.device_iterations if main.intersection(a.programs) else 1
            for a in (*self.inputs, *self.outputs)
            if a.role in (AnchorRole.USER_INPUT, AnchorRole.USER_OUTPUT)
        }

    def anchor(self, name: str) -> Anchor:
        """The anchor named (or with handle) ``name``.

        Raises:
            InputValidationError: no such anchor.
        """
        for a in self.meta.anchors:
            if a.name == name:
                return a
        for a in self.meta.anchors:
            if a.handle == name:
                return a
        raise InputValidationError(
            f"model {self.meta.model_name!r} has no anchor {name!r}; anchors: "
            f"{[a.name for a in self.meta.anchors]}"
        )

    def check_programs(self, programs: tuple[int, ...]) -> None:
        """Raises: InputValidationError: a program id the executable does not have."""
        unknown = [p for p in programs if p not in self.kinds]
        if unknown:
            raise InputValidationError(
                f"model {self.meta.model_name!r} has no program {unknown}; "
                f"programs: {sorted(self.kinds)}"
            )

    def reads(self, program: int) -> tuple[Anchor, ...]:
        """Anchors ``program`` reads from the host."""
        kind = self.kinds[program]
        if kind is ProgramKind.LOAD:
            roles: tuple[AnchorRole, ...] = (AnchorRole.WEIGHT, AnchorRole.VARIABLE)
        elif kind is ProgramKind.MAIN:
            roles = (AnchorRole.USER_INPUT,)
        else:
            return ()
        return tuple(a for a in self.inputs if a.role in roles and program in a.programs)

    def writes(self, program: int) -> tuple[Anchor, ...]:
        """Anchors ``program`` writes to the host."""
        kind = self.kinds[program]
        role = {ProgramKind.MAIN: AnchorRole.USER_OUTPUT, ProgramKind.SAVE: AnchorRole.VARIABLE}
        want = role.get(kind)
        return tuple(a for a in self.outputs if a.role is want and program in a.programs)


def _policy(pred: PopefDataUsagePredicate, anchor: Anchor) -> PopefDataUsagePolicy:
    policy = pred(anchor)
    if not isinstance(policy, PopefDataUsagePolicy):
        raise InputValidationError(
            f"pred_tensor_data returned {policy!r} for {anchor.name!r}, not a PopefDataUsagePolicy"
        )
    return policy


def checked_input(anchor: Anchor, value: object) -> np.ndarray:
    """``value`` returned by an input callback, if it has the anchor's shape and dtype.

    Raises:
        InputValidationError: it does not.
    """
    arr = np.asarray(value)
    if arr.shape != anchor.shape or arr.dtype != anchor.dtype:
        raise InputValidationError(
            f"callback of anchor {anchor.name!r} gave {arr.dtype.name}{list(arr.shape)}, "
            f"expected {anchor.dtype.name}{list(anchor.shape)}"
        )
    return arr


def read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class Occupant(Protocol):
    """A session that may be a device's active one (``SessionCore``): the one it replaces
    saves and unloads its executable."""

    async def _deactivate(self, occ: Occupancy) -> None: ...


@dataclass(eq=False)
class Occupancy:
    """Which session's executable is on a (possibly shared) device; switches hold ``lock``."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    active: Occupant | None = None


_occupancy: weakref.WeakKeyDictionary[AttachedDevice, Occupancy] = weakref.WeakKeyDictionary()


def occupancy(device: AttachedDevice) -> Occupancy:
    """The occupancy record of ``device`` (shared by every session bound to it)."""
    occ = _occupancy.get(device)
    if occ is None:
        occ = _occupancy[device] = Occupancy()
    return occ


def zeros_like_anchor(anchor: Anchor) -> np.ndarray:
    z: np.ndarray[Any, Any] = np.zeros(anchor.shape, anchor.dtype)
    z.flags.writeable = False
    return z
