"""The instance processes of one python model, kept alive: a supervisor for processes.

Each of the model's ``instance_group`` instances has a slot; a keeper task per slot restarts
the slot's process whenever it ends, in OTP's terms a ``permanent`` child under
``one_for_one``: only that instance restarts, the others serve on. Restarts back off as
:class:`actors.supervision.Backoff` says (the first after a stable run at once, then growing to
its cap), and never give up: a model that cannot start again stays "not ready" on that slot and
keeps being retried, while its other instances serve. A watchdog kills an instance that holds
requests, waits on nothing of ours and has sent nothing for ``watchdog_s``: a stall is a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from actors.clock import Clock
from actors.session.state import ReplicaStatus
from actors.supervision import Backoff
from model_runtime.errors import ModelLoadError
from model_runtime.python_backend.instance import InstanceProcess, InstanceSpec

__all__ = ["InstancePool", "PoolSettings", "Slot"]

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """How instance processes are started, watched and restarted."""

    backoff: Backoff = field(
        default_factory=lambda: Backoff(initial=0.1, factor=2.0, cap=10.0, reset_after=5.0)
    )
    #: seconds an instance may hold requests without a sign of life (None: never killed)
    watchdog_s: float | None = 60.0
    start_timeout_s: float = 120.0
    stop_grace_s: float = 30.0


@dataclass(slots=True, eq=False)
class Slot:
    """One instance of the model: its current process and its history; what the daemon's
    statistics read of it as of a replica's state (``runs``: the ``execute`` calls of its
    processes, ``runs_by_size`` by batch size; ``changed``: set and renewed at each change of
    ``status``)."""

    index: int
    instance: InstanceProcess | None = None
    status: ReplicaStatus = ReplicaStatus.STARTING
    restarts: int = 0
    consecutive: int = 0
    started_at: float = 0.0
    runs: int = 0
    runs_by_size: dict[int, int] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def set_status(self, status: ReplicaStatus) -> None:
        self.status = status
        self.changed.set()
        self.changed = asyncio.Event()

    def executed(self, sizes: list[int]) -> None:
        """Count ``execute`` calls of these batch sizes."""
        self.runs += len(sizes)
        by_size = self.runs_by_size
        for size in sizes:
            by_size[size] = by_size.get(size, 0) + 1


class InstancePool:
    """Starts the instances, restarts them when they end, and stops them."""

    def __init__(
        self,
        make_spec: Callable[[int], InstanceSpec],
        count: int,
        settings: PoolSettings,
        clock: Clock,
        on_change: Callable[[], None],
    ) -> None:
        self._make_spec = make_spec
        self.slots = [Slot(i) for i in range(count)]
        self.settings = settings
        self._clock = clock
        self._on_change = on_change
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False

    @property
    def restarts(self) -> int:
        """Instance processes restarted since the model loaded (for ``/metrics``)."""
        return sum(s.restarts for s in self.slots)

    def serving(self) -> list[InstanceProcess]:
        """The instances that take requests now."""
        return [s.instance for s in self.slots if s.instance is not None and s.instance.alive]

    async def start(self) -> None:
        """Start every instance at once; returns when all serve.

        Raises:
            ModelLoadError: one did not load (the others are stopped).
        """
        results = await asyncio.gather(
            *(self._spawn(slot) for slot in self.slots), return_exceptions=True
        )
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await self.close()
            raise failure
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keep(slot)) for slot in self.slots]
        if self.settings.watchdog_s is not None:
            self._tasks.append(loop.create_task(self._watch(self.settings.watchdog_s)))

    async def _spawn(self, slot: Slot) -> None:
        instance = InstanceProcess(self._make_spec(slot.index), clock=self._clock)
        instance.on_batch_done(self._on_change)
        instance.on_executed(slot.executed)
        await instance.start(timeout=self.settings.start_timeout_s)
        slot.instance = instance
        slot.set_status(ReplicaStatus.READY)
        slot.started_at = self._clock.monotonic()
        self._on_change()

    async def _keep(self, slot: Slot) -> None:
        backoff = self.settings.backoff
        while not self._closing:
            instance = slot.instance
            if instance is not None:
                await instance.died.wait()
                if self._closing:
                    return
                slot.set_status(ReplicaStatus.FAILED)
                slot.restarts += 1
                self._on_change()
                ran = self._clock.monotonic() - slot.started_at
                slot.consecutive = 0 if ran >= backoff.reset_after else slot.consecutive + 1
                slot.instance = None
            delay = 0.0
            if slot.consecutive:
                delay = min(backoff.cap, backoff.initial * backoff.factor ** (slot.consecutive - 1))
            await self._clock.sleep(delay)
            try:
                await self._spawn(slot)
            except ModelLoadError as exc:
                slot.consecutive += 1
                _log.error("python_instance_restart_failed", slot=slot.index, error=str(exc))
            else:
                _log.info("python_instance_restarted", slot=slot.index, restarts=slot.restarts)

    async def _watch(self, deadline: float) -> None:
        period = min(deadline / 4, 1.0)
        while True:
            await self._clock.sleep(period)
            now = self._clock.monotonic()
            for slot in self.slots:
                instance = slot.instance
                if instance is not None and instance.alive and instance.stalled(now, deadline):
                    instance.set_reason(
                        f"made no progress for {deadline:g} s and was killed by the watchdog"
                    )
                    _log.error("python_instance_stalled", slot=slot.index, pid=instance.pid)
                    instance.kill()

    async def close(self) -> None:
        """Stop restarting; finalize every instance (killed past the grace)."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        grace = self.settings.stop_grace_s
        await asyncio.gather(
            *(s.instance.stop(grace) for s in self.slots if s.instance is not None)
        )
        for slot in self.slots:
            slot.set_status(ReplicaStatus.STOPPED)
