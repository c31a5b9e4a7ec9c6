"""Fault plans (DESIGN.md §7): make a device fail on purpose, deterministically.

A :class:`FaultPlan` is a seeded list of :class:`FaultRule`. Each device (replica) gets its own
:class:`FaultInjector` from :meth:`FaultPlan.for_replica`, kept for the replica's whole life (one
injector shared by the replica's consecutive Device actors); the Device actor consults it in its
run path, for every main-program run (one ``RunMain``, whatever its device iterations), counted
per device/replica from 1. When several rules fire on the same run, the first in the plan wins
(every ``p=`` rule still draws, so one rule's draws never depend on another's).

String form: rules separated by ``;``, each ``KIND:WHEN[:KEY=VALUE...]`` with WHEN one of
``every=N``, ``at=N``, ``p=F`` and keys ``from=N``, ``until=N`` (a window of runs),
``replica=R``, ``action=IPU_RESET|LINK_RESET|...`` (recoverable only) and ``seconds=S`` (slow
only), e.g. ``"recoverable:every=50;hang:at=120;app_error:p=0.01;slow:every=10:seconds=0.05"``.
``str(plan)`` writes that form back (``FaultPlan.parse(str(plan), seed)`` is an equal plan).

Windows: ``from=N`` and ``until=N`` (both optional, both inclusive, run numbers as above, >= 1,
``until >= from``) limit a rule to those runs, so a burst that then stops can be written:
``"recoverable:every=2:from=100:until=140"`` fires on the even runs 100..140 only (``every=``
counts from run 1, not from the window's start), ``"fatal:every=1:from=10"`` on every run from
10 on. ``at=N`` may be combined with a window only if N lies inside it. A ``p=`` rule draws on
every run, inside its window or not, so the draws never depend on windows. In
:class:`FaultRule` the window is ``start`` and ``until`` (``from`` is a Python keyword).

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
import threading
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
    """One rule: ``kind`` fires ``every`` N-th run, ``at`` run N, or with probability ``p``,
    only on runs ``start..until`` (inclusive; ``None``: unbounded on that side).

    Raises:
        FaultPlanError: not exactly one of every/at/p, a value out of range, an empty window or
            an ``at`` outside its window.
    """

    kind: FaultKind
    every: int | None = None
    at: int | None = None
    p: float | None = None
    replica: int | None = None
    action: RecoveryAction = RecoveryAction.IPU_RESET
    seconds: float = 0.05
    start: int | None = None
    until: int | None = None

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
        if self.start is not None and self.start < 1:
            raise FaultPlanError(f"fault rule {self}: from= must be >= 1 (runs count from 1)")
        if self.until is not None and self.until < 1:
            raise FaultPlanError(f"fault rule {self}: until= must be >= 1 (runs count from 1)")
        if self.start is not None and self.until is not None and self.until < self.start:
            raise FaultPlanError(f"fault rule {self}: until= must be >= from=")
        if self.at is not None and not self.in_window(self.at):
            raise FaultPlanError(f"fault rule {self}: at= must lie within from=..until=")

    def in_window(self, iteration: int) -> bool:
        """Whether run ``iteration`` lies in the window ``from=``..``until=`` (inclusive)."""
        if self.start is not None and iteration < self.start:
            return False
        return self.until is None or iteration <= self.until

    def matches(self, iteration: int, draw: float | None) -> bool:
        """Whether the rule fires on run ``iteration`` (``draw``: this run's draw for ``p=``)."""
        if not self.in_window(iteration):
            return False
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
        if self.start is not None:
            parts.append(f"from={self.start}")
        if self.until is not None:
            parts.append(f"until={self.until}")
        if self.kind is FaultKind.RECOVERABLE and self.action is not RecoveryAction.IPU_RESET:
            parts.append(f"action={self.action.value}")
        if self.kind is FaultKind.SLOW:
            parts.append(f"seconds={self.seconds!r}")
        if self.replica is not None:
            parts.append(f"replica={self.replica}")
        return ":".join(parts)


_FIELD = {"from": "start"}  # string key -> FaultRule field, where they differ


def _parse_rule(text: str) -> FaultRule:
    kind, *pairs = (part.strip() for part in text.split(":"))
    kw: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise FaultPlanError(f"fault rule {text!r}: {pair!r} is not KEY=VALUE")
        if _FIELD.get(key, key) in kw:
            raise FaultPlanError(f"fault rule {text!r}: {key}= given twice")
        try:
            if key in ("every", "at", "replica", "until"):
                kw[key] = int(value)
            elif key == "from":
                kw["start"] = int(value)
            elif key in ("p", "seconds"):
                kw[key] = float(value)
            elif key == "action":
                kw[key] = RecoveryAction(value.upper())
            else:
                raise FaultPlanError(
                    f"fault rule {text!r}: unknown key {key!r} "
                    "(known: every, at, p, from, until, replica, action, seconds)"
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
        """A fresh injector for device/replica ``replica`` (counts runs from 1).

        Call it once per replica and keep the injector for the replica's whole life (see
        :class:`FaultInjector`); a new one starts counting again from run 1.
        """
        return FaultInjector(self, replica)

    def __str__(self) -> str:
        return ";".join(str(r) for r in self.rules)

    def __bool__(self) -> bool:
        return bool(self.rules)


class FaultInjector:
    """One replica's view of a plan: counts its main runs and says which rule fires.

    ``p=`` rules draw from ``random.Random`` seeded by (plan seed, replica, rule index), so a
    replica's faults are the same on every run of the program.

    One injector is kept per replica for the replica's whole life and shared by its consecutive
    Device actors: run numbers (``iteration``), ``at=``/``from=``/``until=`` and the ``p=`` draws
    go on across a device restart, so ``at=N`` fires once even when the device is restarted
    (a fresh injector per Device would fire it again after every restart). Nothing here is tied
    to one Device: the injector holds no reference to it, and :meth:`next_run` is thread-safe,
    so an old device's worker that is still finishing cannot corrupt the count of the new one's.
    """

    __slots__ = ("_lock", "_rngs", "_rules", "iteration", "plan", "replica")

    def __init__(self, plan: FaultPlan, replica: int) -> None:
        self.plan = plan
        self.replica = replica
        self.iteration = 0
        self._lock = threading.Lock()
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
        with self._lock:
            self.iteration += 1
            fired: FaultRule | None = None
            for i, rule in self._rules:
                rng = self._rngs.get(i)
                draw = rng.random() if rng is not None else None  # drawn in and out of window
                if fired is None and rule.matches(self.iteration, draw):
                    fired = rule
            return fired
