"""Fault plans (DESIGN.md §7): make a device fail on purpose, deterministically.

A :class:`FaultPlan` is a seeded list of :class:`FaultRule`. Each device (replica) gets its own
:class:`FaultInjector` from :meth:`FaultPlan.for_replica`; the Device actor consults it in its
run path, for every main-program run (one ``RunMain``, whatever its device iterations), counted
per device from 1. When several rules fire on the same run, the first in the plan wins (every
``p=`` rule still draws, so one rule's draws never depend on another's).

String form: rules separated by ``;``, each ``KIND:WHEN[:KEY=VALUE...]`` with WHEN one of
``every=N``, ``at=N``, ``p=F`` and keys ``replica=R``, ``action=IPU_RESET|LINK_RESET|...``
(recoverable only) and ``seconds=S`` (slow only), e.g.
``"recoverable:every=50;hang:at=120;app_error:p=0.01;slow:every=10:seconds=0.05"``.
``str(plan)`` writes that form back (``FaultPlan.parse(str(plan), seed)`` is an equal plan).

Kinds (what the device does when the rule fires):

* ``recoverable`` -- the run fails with ``RecoverableRuntimeError(action)``;
* ``app_error`` -- the run fails with ``ApplicationRuntimeError``;
* ``fatal`` -- ``UnrecoverableRuntimeError``; the device stays broken (later runs and resets fail);
* ``hang`` -- the run blocks until the device is reset (or stopped);
* ``slow`` -- the run sleeps ``seconds`` first, then runs normally;
* ``crash`` -- the Device actor itself raises an unexpected exception and dies.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from model_runtime.errors import FaultPlanError, RecoveryAction

__all__ = ["FaultInjector", "FaultKind", "FaultPlan", "FaultRule"]


class FaultKind(enum.Enum):
    RECOVERABLE = "recoverable"
    APP_ERROR = "app_error"
    FATAL = "fatal"
    HANG = "hang"
    SLOW = "slow"
    CRASH = "crash"


@dataclass(frozen=True, slots=True)
class FaultRule:
    """One rule: ``kind`` fires ``every`` N-th run, ``at`` run N, or with probability ``p``.

    Raises:
        FaultPlanError: not exactly one of every/at/p, or a value out of range.
    """

    kind: FaultKind
    every: int | None = None
    at: int | None = None
    p: float | None = None
    replica: int | None = None
    action: RecoveryAction = RecoveryAction.IPU_RESET
    seconds: float = 0.05

    def __post_init__(self) -> None:
        if not isinstance(self.kind, FaultKind):
            try:
                object.__setattr__(self, "kind", FaultKind(self.kind))
            except ValueError:
                raise FaultPlanError(
                    f"fault rule: unknown kind {self.kind!r} "
                    f"(known: {', '.join(k.value for k in FaultKind)})"
                ) from None
        whens = [w for w in (self.every, self.at, self.p) if w is not None]
        if len(whens) != 1:
            raise FaultPlanError(f"fault rule {self}: give exactly one of every=, at=, p=")
        if self.every is not None and self.every < 1:
            raise FaultPlanError(f"fault rule {self}: every= must be >= 1")
        if self.at is not None and self.at < 1:
            raise FaultPlanError(f"fault rule {self}: at= must be >= 1 (runs count from 1)")
        if self.p is not None and not 0.0 <= self.p <= 1.0:
            raise FaultPlanError(f"fault rule {self}: p= must be within [0, 1]")
        if self.replica is not None and self.replica < 0:
            raise FaultPlanError(f"fault rule {self}: replica= must be >= 0")
        if not math.isfinite(self.seconds) or self.seconds < 0:
            raise FaultPlanError(f"fault rule {self}: seconds= must be finite and >= 0")

    def matches(self, iteration: int, draw: float | None) -> bool:
        if self.every is not None:
            return iteration % self.every == 0
        if self.at is not None:
            return iteration == self.at
        return draw is not None and self.p is not None and draw < self.p

    def __str__(self) -> str:
        kind = self.kind.value if isinstance(self.kind, FaultKind) else str(self.kind)
        parts = [kind]
        if self.every is not None:
            parts.append(f"every={self.every}")
        if self.at is not None:
            parts.append(f"at={self.at}")
        if self.p is not None:
            parts.append(f"p={self.p!r}")
        if self.kind is FaultKind.RECOVERABLE and self.action is not RecoveryAction.IPU_RESET:
            parts.append(f"action={self.action.value}")
        if self.kind is FaultKind.SLOW:
            parts.append(f"seconds={self.seconds!r}")
        if self.replica is not None:
            parts.append(f"replica={self.replica}")
        return ":".join(parts)


def _parse_rule(text: str) -> FaultRule:
    kind, *pairs = (part.strip() for part in text.split(":"))
    kw: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise FaultPlanError(f"fault rule {text!r}: {pair!r} is not KEY=VALUE")
        if key in kw:
            raise FaultPlanError(f"fault rule {text!r}: {key}= given twice")
        try:
            if key in ("every", "at", "replica"):
                kw[key] = int(value)
            elif key in ("p", "seconds"):
                kw[key] = float(value)
            elif key == "action":
                kw[key] = RecoveryAction(value.upper())
            else:
                raise FaultPlanError(
                    f"fault rule {text!r}: unknown key {key!r} "
                    "(known: every, at, p, replica, action, seconds)"
                )
        except ValueError:
            raise FaultPlanError(f"fault rule {text!r}: bad value for {key}: {value!r}") from None
    if "action" in kw and kind != FaultKind.RECOVERABLE.value:
        raise FaultPlanError(f"fault rule {text!r}: action= only applies to recoverable")
    if "seconds" in kw and kind != FaultKind.SLOW.value:
        raise FaultPlanError(f"fault rule {text!r}: seconds= only applies to slow")
    try:
        return FaultRule(kind, **kw)  # type: ignore[arg-type]
    except FaultPlanError as exc:
        raise FaultPlanError(f"fault rule {text!r}: {exc}") from None


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """A seeded, deterministic list of fault rules (see the module docstring)."""

    rules: tuple[FaultRule, ...] = ()
    seed: int = 0

    def __init__(self, rules: Iterable[FaultRule] = (), seed: int = 0) -> None:
        object.__setattr__(self, "rules", tuple(rules))
        object.__setattr__(self, "seed", seed)

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> FaultPlan:
        """Parse the string form (empty string: no faults).

        Raises:
            FaultPlanError: naming the rule that does not parse.
        """
        rules = [_parse_rule(r) for r in (r.strip() for r in text.split(";")) if r]
        return cls(rules, seed)

    def for_replica(self, replica: int) -> FaultInjector:
        """A fresh injector for device/replica ``replica`` (counts runs from 1)."""
        return FaultInjector(self, replica)

    def __str__(self) -> str:
        return ";".join(str(r) for r in self.rules)

    def __bool__(self) -> bool:
        return bool(self.rules)


class FaultInjector:
    """One device's view of a plan: counts its main runs and says which rule fires.

    ``p=`` rules draw from ``random.Random`` seeded by (plan seed, replica, rule index), so a
    replica's faults are the same on every run of the program.
    """

    __slots__ = ("_rngs", "_rules", "iteration", "replica")

    def __init__(self, plan: FaultPlan, replica: int) -> None:
        self.replica = replica
        self.iteration = 0
        self._rules = [
            (i, r) for i, r in enumerate(plan.rules) if r.replica is None or r.replica == replica
        ]
        self._rngs = {
            i: random.Random(f"fault-plan:{plan.seed}:{replica}:{i}")
            for i, r in self._rules
            if r.p is not None
        }

    def next_run(self) -> FaultRule | None:
        """Count one main run and return the rule that fires on it (``None``: run normally)."""
        self.iteration += 1
        fired: FaultRule | None = None
        for i, rule in self._rules:
            rng = self._rngs.get(i)
            draw = rng.random() if rng is not None else None
            if fired is None and rule.matches(self.iteration, draw):
                fired = rule
        return fired
