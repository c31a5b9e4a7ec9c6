"""A device's worker thread: runs jobs one at a time, answers them on the event loop.

Replaces a one-thread ``ThreadPoolExecutor`` with ``run_in_executor`` on the hot path. That pair
costs, per job, a ``concurrent.futures.Future``, a chained asyncio future, and one
``call_soon_threadsafe`` (a write to the loop's self-pipe) whether or not the loop is already
due to wake. Here a job is ``(future, fn, args)`` on a ``SimpleQueue``; the thread runs it and
appends the outcome to a list that the loop delivers in one callback, scheduled only when none
is pending: at most one cross-thread wake-up per job, and fewer when jobs finish while the loop
is busy. Futures are plain asyncio futures, resolved on the loop.

A worker needs the GIL back after every job to hand over its outcome, and with CPython's default
switch interval (5 ms) a busy event loop keeps it from the worker: each time the loop polls it
lets the GIL go and takes it back before the woken worker can, which restarts the worker's
wait, so a device that finished its run idles until the loop runs out of work. The first
worker therefore lowers the interpreter's switch interval from that default to
:data:`SWITCH_INTERVAL` (:func:`claim_switch_interval`; a value someone chose is kept), or to
``MODEL_RUNTIME_SWITCH_INTERVAL`` seconds when that is set (``0``: leave the interval alone).

A worker stuck in a job that ignores termination is abandoned (:meth:`Worker.abandon`): its
queued jobs are cancelled, and its thread (a daemon thread) answers the stuck job, if it ever
returns, and exits.
"""

from __future__ import annotations

import asyncio
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from model_runtime.errors import ConfigurationError

__all__ = ["SWITCH_ENV", "SWITCH_INTERVAL", "Worker", "claim_switch_interval"]

#: Seconds: the interpreter switch interval device workers run under (module docstring): a
#: thread waiting for the GIL asks for it after this long. CPython's default is 5 ms.
SWITCH_INTERVAL = 1e-4
#: Environment variable: the switch interval in seconds instead (read at each claim); 0: the
#: interpreter's own, untouched.
SWITCH_ENV = "MODEL_RUNTIME_SWITCH_INTERVAL"
_CPYTHON_DEFAULT = 0.005

#: Called on the loop with a job's result and error before its future is resolved, even when
#: that future was cancelled meanwhile (book-keeping that must happen once per job); returns
#: the error the future gets (``None``: the result).
Hook = Callable[[Any, BaseException | None], BaseException | None]
_Job = tuple["asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...], Hook | None, float]
#: (future, hook, result, error, the job's hop to the thread, when it ended; NaN: not measured)
_Outcome = tuple["asyncio.Future[Any]", Hook | None, Any, BaseException | None, float, float]
_NAN = float("nan")


def claim_switch_interval(environ: Mapping[str, str] | None = None) -> None:
    """Lower the interpreter's switch interval to :data:`SWITCH_INTERVAL` if it is still
    CPython's default (module docstring); any other value is left as it is. With
    :data:`SWITCH_ENV` set: that many seconds, whatever the interval was (0: untouched).

    Raises:
        ConfigurationError: :data:`SWITCH_ENV` is not a number of seconds >= 0.
    """
    text = (os.environ if environ is None else environ).get(SWITCH_ENV, "").strip()
    if text:
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not 0.0 <= seconds < 1.0:  # (nan fails too)
            raise ConfigurationError(
                f"{SWITCH_ENV}={text!r}: expected seconds, at least 0 and under 1 (0: leave "
                "the interpreter's switch interval alone)"
            )
        if seconds > 0.0:
            sys.setswitchinterval(seconds)
    elif sys.getswitchinterval() == _CPYTHON_DEFAULT:
        sys.setswitchinterval(SWITCH_INTERVAL)


class Worker:
    """One thread that runs submitted callables in order (see the module docstring)."""

    __slots__ = (
        "_done",
        "_jobs",
        "_lock",
        "_loop",
        "_scheduled",
        "_stopped",
        "_thread",
        "hop_seconds",
    )

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        claim_switch_interval()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._done: list[_Outcome] = []
        self._lock = threading.Lock()
        self._scheduled = False
        self._stopped = False
        #: A job's round trip to an idle thread and back, without the job: the wake-up of
        #: the thread plus the loop's of its answer (a moving average; 0 until measured).
        self.hop_seconds = 0.0
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop it answers on (its owner's)."""
        return self._loop

    def submit(
        self, fn: Callable[..., Any], *args: Any, hook: Hook | None = None
    ) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on the worker after the jobs before it; on the loop only.

        A job whose future is done before it starts (cancelled, or failed by its owner) is
        skipped (its ``hook`` still gets a ``CancelledError``); ``hook`` (see :data:`Hook`)
        runs on the loop when it ends.

        Raises:
            RuntimeError: the worker was shut down or abandoned.
        """
        if self._stopped:
            raise RuntimeError("the device worker has stopped")
        future: asyncio.Future[Any] = self._loop.create_future()
        self._jobs.put((future, fn, args, hook, time.monotonic()))
        return future

    def shutdown(self) -> None:
        """Take no more jobs; the thread ends after the jobs already submitted."""
        if not self._stopped:
            self._stopped = True
            self._jobs.put(None)

    def abandon(self, error: BaseException) -> None:
        """Give up on the thread (stuck in a job): queued jobs fail with ``error`` (not a
        cancellation, which their awaiting tasks would take for their own); the thread
        answers the current job if it ever returns, and exits."""
        self.shutdown()
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None and not job[0].done():
                job[0].set_exception(error)
                job[0].exception()  # its awaiter may be gone: no "never retrieved" warning
        self._jobs.put(None)

    # -- the thread ----------------------------------------------------------------------------

    def _main(self) -> None:
        jobs = self._jobs
        idle_since = 0.0  # when the last job ended
        while True:
            job = jobs.get()
            if job is None:
                return
            future, fn, args, hook, submitted = job
            # The thread's wake-up, when it was idle as the job came (not a wait in line).
            woke = time.monotonic() - submitted if submitted >= idle_since else _NAN
            outcome: _Outcome
            if future.done():  # a read of a flag: benign across threads
                if hook is None:
                    continue
                outcome = (future, hook, None, asyncio.CancelledError(), _NAN, 0.0)
            else:
                try:
                    result = fn(*args)
                    idle_since = time.monotonic()
                    outcome = (future, hook, result, None, woke, idle_since)
                except Exception as exc:
                    idle_since = time.monotonic()
                    outcome = (future, hook, None, exc, woke, idle_since)
            with self._lock:
                self._done.append(outcome)
                if self._scheduled:
                    continue  # the loop has a delivery pending: it takes this one too
                self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return

    def _deliver(self) -> None:
        with self._lock:
            done, self._done = self._done, []
            self._scheduled = False
        woke, ended = done[0][4], done[0][5]
        if woke == woke:  # measured (not NaN): the first answer is the one that woke the loop
            hop = woke + (time.monotonic() - ended)
            average = self.hop_seconds
            self.hop_seconds = hop if average == 0.0 else average + (hop - average) / 8
        for future, hook, result, exc, _, _ in done:
            if hook is not None:
                exc = hook(result, exc)
            if future.done():
                continue
            if exc is None:
                future.set_result(result)
            else:
                future.set_exception(exc)
