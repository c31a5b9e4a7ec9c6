"""The instance process's plumbing beside :class:`~.stub.Stub`: a future whose waiter reads the
daemon's socket while it waits, and the process's tie to the daemon's life."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol

__all__ = ["PumpedFuture", "die_with_parent"]


class _Pumps(Protocol):
    def pump(self, timeout: float | None, *, idle: bool = False) -> None: ...


class PumpedFuture(Future[Any]):
    """A future whose waiter reads the socket while it waits (its answer comes that way)."""

    def __init__(self, stub: _Pumps, inner: Future[Any]) -> None:
        super().__init__()
        self._stub = stub
        self._inner = inner
        inner.add_done_callback(self._copy)

    def _copy(self, inner: Future[Any]) -> None:
        exc = inner.exception()
        if exc is not None:
            self.set_exception(exc)
        else:
            self.set_result(inner.result())

    def result(self, timeout: float | None = None) -> Any:
        while not self.done():
            self._stub.pump(0.05)
        return super().result()


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the daemon that started it dies."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # EOF on the socket still ends us
