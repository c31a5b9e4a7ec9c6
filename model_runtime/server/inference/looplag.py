"""The event loop's lag, as admission control reads it: how late a periodic timer fires.

:class:`LoopLag` reports each tick's lateness to what it measures for
(:meth:`~.admission.AdmissionControl.loop_lag`), from one timer handle, no task.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from model_runtime.server.inference.admission import LAG_TICK

__all__ = ["LagSink", "LoopLag"]


class LagSink(Protocol):
    """What a lag reading is reported to (admission control)."""

    def loop_lag(self, lag: float) -> None: ...


class LoopLag:
    """Measures the running event loop's lag for ``control``: a timer due every
    :data:`LAG_TICK` seconds reports how late it fired (:meth:`AdmissionControl.loop_lag`).
    ``start()`` on the loop, ``stop()`` when done; one timer handle, no task."""

    def __init__(self, control: LagSink, tick: float = LAG_TICK) -> None:
        self.control = control
        self.tick = tick
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        """Start ticking on the running loop.

        Raises:
            RuntimeError: no running event loop.
        """
        loop = asyncio.get_running_loop()
        self._due = loop.time() + self.tick
        self._handle = loop.call_at(self._due, self._tick, loop)

    def stop(self) -> None:
        """Stop ticking."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        self.control.loop_lag(now - self._due)
        self._due = now + self.tick
        self._handle = loop.call_at(self._due, self._tick, loop)
