"""What gRPC calls may hold of the server: a slot while computed, bytes until written.

grpc.aio keeps a call (its task, its answer, and its slot among ``maximum_concurrent_rpcs``)
until the answer is written, and a client that never opens its flow-control window never lets
it be written: with grpc's own limit, such clients hold every slot. :class:`CallBudget` wraps
each unary handler and takes that limit's place:

- at most ``max_calls`` calls are being computed at once (from their start to their answer);
  past it a call is refused at once with RESOURCE_EXHAUSTED. A call whose answer is made no
  longer counts: an answer that waits on its client holds memory, not a slot;
- the bytes of the calls in flight (requests received, answers not yet written, and
  :data:`CALL_OVERHEAD` for each) have a budget, ``max_bytes``: a call that would pass it is
  refused at once with RESOURCE_EXHAUSTED (its answer, if it was already made, is dropped)
  when its connection (grpc's peer address) has another call in flight, and in any case past
  twice the budget; a connection with nothing else in flight is admitted up to then, so a
  client that waits for its answers is not refused for what others hold. A refusal is a
  trailers-only answer, which flow control does not hold back;
- a connection with an answer not written ``write_timeout`` seconds after it was made is
  stalled: its new calls are refused at once (RESOURCE_EXHAUSTED) until that answer is
  written or the connection closes. (grpc.aio cannot end a server call from Python: cancelling
  its task leaves the stream open and the answer in grpc's buffers, so the call stays counted
  until grpc ends it.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from model_runtime.server.observability.ratelog import RateLimitedLog

__all__ = ["CALL_OVERHEAD", "CallBudget", "QuietUnwrittenAnswers", "quiet_unwritten_answers"]

#: Bytes counted for each call in flight beyond its messages (its task, its grpc state).
CALL_OVERHEAD = 4096

Unary = Callable[[Any, Any], Awaitable[Any]]


def _byte_size(message: Any) -> int:
    size: int = message.ByteSize()
    return size


class CallBudget:
    """The per-connection and per-server holdings of one gRPC listener (see the module)."""

    def __init__(
        self,
        *,
        write_timeout: float,
        max_calls: int,
        max_bytes: int,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if write_timeout <= 0 or max_calls < 1 or max_bytes < 1:
            raise ValueError("write_timeout, max_calls and max_bytes must be > 0")
        self.write_timeout = write_timeout
        self.max_calls = max_calls
        self.max_bytes = max_bytes
        self._clock = clock
        #: Calls in flight by connection; bytes they hold in all; calls being computed.
        self.calls: dict[str, int] = {}
        self.bytes = 0
        self.computing = 0
        #: Calls answered and not yet written: their task -> (connection, write deadline).
        self.unsent: dict[Any, tuple[str, float]] = {}
        #: Connections with answers past their write deadline -> how many.
        self.stalled: dict[str, int] = {}
        self._late: set[Any] = set()
        self.refused_calls = 0
        self.refused_bytes = 0
        self.refused_stalled = 0
        self.timed_out = 0
        self._sweep: asyncio.TimerHandle | None = None
        self._log = RateLimitedLog("grpc_calls_refused_budget")
        self._timeout_log = RateLimitedLog("grpc_answers_not_written_in_time")

    def wrap(self, behaviour: Unary, size_of: Callable[[Any], int] = _byte_size) -> Unary:
        """``behaviour`` (a unary handler ``(request, context) -> answer``) under the budget.
        ``size_of``: the bytes of a request or answer (a message's ``ByteSize``; ``len`` for
        a handler of serialized messages)."""

        async def call(request: Any, context: Any) -> Any:
            peer = context.peer()
            held = self.calls.get(peer, 0)
            # The native transport says what to count of the request (its message's bytes).
            counted = getattr(context, "message_bytes", None)
            size = CALL_OVERHEAD + (size_of(request) if counted is None else counted)
            why = self._refusal(held, size, peer)
            if why is not None:
                await self._refuse(context, why, peer)
            task = asyncio.current_task()
            assert task is not None
            self.calls[peer] = held + 1
            self.bytes += size
            self.computing += 1
            # ``size`` grows by the answer's below: the release reads it when the call ends.
            task.add_done_callback(lambda _: self.leave(peer, size))
            try:
                answer = await behaviour(request, context)
            finally:
                self.computing -= 1
            answer_size = size_of(answer)
            why = self._refusal(self.calls[peer] - 1, answer_size, peer, computing=False)
            if why is not None:
                await self._refuse(context, why, peer)
            self.bytes += answer_size
            size += answer_size
            self._hold(task, peer)
            return answer

        return call

    def try_enter(self, peer: str, size: int) -> bool:
        """What :meth:`wrap`'s call counts as it starts, for a transport that answers a call
        by callbacks (:mod:`.unary`): False, nothing counted (nor the refusal: the call goes
        the wrapped way, which refuses it), when the call would be refused. Then
        :meth:`computed` once its answer is made, :meth:`leave` once its stream ends."""
        held = self.calls.get(peer, 0)
        if (
            self.stalled or self.computing >= self.max_calls or self.bytes + size > self.max_bytes
        ) and self._refusal(held, size, peer, count=False) is not None:  # (else: no refusal)
            return False
        self.calls[peer] = held + 1
        self.bytes += size
        self.computing += 1
        return True

    def enter(self, peer: str, size: int) -> str | None:
        """:meth:`try_enter`, or why the call is refused (counted and logged as :meth:`wrap`
        counts a refusal; nothing else counted)."""
        held = self.calls.get(peer, 0)
        why = self._refusal(held, size, peer)
        if why is not None:
            self._log(reason=why, peer=peer)
            return why
        self.calls[peer] = held + 1
        self.bytes += size
        self.computing += 1
        return None

    def computed(self, peer: str, answer_size: int) -> str | None:
        """A call :meth:`try_enter` counted has its answer (``answer_size`` bytes, counted
        from now), or failed (0); why the answer is refused instead (its bytes not counted)."""
        self.computing -= 1
        if answer_size:
            if not self.stalled and self.bytes + answer_size <= self.max_bytes:
                self.bytes += answer_size  # (no refusal possible)
                return None
            why = self._refusal(self.calls[peer] - 1, answer_size, peer, computing=False)
            if why is not None:
                self._log(reason=why, peer=peer)
                return why
            self.bytes += answer_size
        return None

    def leave(self, peer: str, size: int) -> None:
        """A call :meth:`try_enter` counted ended (``size``: all it counted)."""
        held = self.calls[peer] - 1
        if held:
            self.calls[peer] = held
        else:
            del self.calls[peer]
        self.bytes -= size

    def hold_message(self, peer: str, size: int) -> str | None:
        """Count ``size`` bytes of a message about to be received on ``peer``'s connection,
        before any of it is buffered (None), or say why it is refused: its connection is
        stalled, or the bytes in flight would pass the budget (no allowance for a connection
        with nothing else in flight here: a big message is its own memory), unless nothing at
        all is in flight (then up to twice the budget). Counted bytes are given back with
        :meth:`drop_message` once its call ends."""
        why = self._refusal(self.calls.get(peer, 0), size, peer, computing=False)
        if why is None and self.bytes and self.bytes + size > self.max_bytes:
            self.refused_bytes += 1
            why = (
                f"the server holds {self.bytes} bytes of calls in flight (budget "
                f"{self.max_bytes}); retry later"
            )
        if why is None:
            self.bytes += size
        else:
            self._log(reason=why, peer=peer)
        return why

    def drop_message(self, size: int) -> None:
        """Give back what :meth:`hold_message` counted."""
        self.bytes -= size

    async def _refuse(self, context: Any, why: str, peer: str) -> None:
        self._log(reason=why, peer=peer)
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)

    def _refusal(
        self, others: int, size: int, peer: str, *, computing: bool = True, count: bool = True
    ) -> str | None:
        if peer in self.stalled:
            self.refused_stalled += count
            return (
                f"this connection has not read an answer in {self.write_timeout} s; "
                "read the answers of the calls sent"
            )
        if computing and self.computing >= self.max_calls:
            self.refused_calls += count
            return f"Concurrent RPC limit exceeded ({self.max_calls} calls being computed)"
        total = self.bytes + size
        if total > self.max_bytes and (others or total > 2 * self.max_bytes):
            self.refused_bytes += count
            return (
                f"the server holds {self.bytes} bytes of calls in flight (budget "
                f"{self.max_bytes}); retry later"
            )
        return None

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _hold(self, task: asyncio.Task[Any], peer: str) -> None:
        self.hold_unsent(task, peer)
        task.add_done_callback(self.written)

    def hold_unsent(self, key: Any, peer: str, now: float | None = None) -> None:
        """The answer of ``key`` (a call: hashable) is made and not yet written: its
        connection is stalled if it is not :meth:`written` within the write timeout.
        ``now``: the event loop's time, if the caller has it (a budget's own clock first)."""
        if now is None or self._clock is not None:
            now = self._now()
        self.unsent[key] = (peer, now + self.write_timeout)
        if self._sweep is None:
            loop = asyncio.get_running_loop()
            self._sweep = loop.call_later(self.write_timeout / 4, self.sweep)

    def written(self, key: Any) -> None:
        """The answer :meth:`hold_unsent` held is written (or dropped)."""
        peer, _ = self.unsent.pop(key)
        if self._late and key in self._late:
            self._late.discard(key)
            left = self.stalled[peer] - 1
            if left:
                self.stalled[peer] = left
            else:
                del self.stalled[peer]

    def sweep(self) -> None:
        """Mark stalled the connections with answers past their write deadline (runs every
        quarter of the write timeout while answers wait)."""
        self._sweep = None
        now = self._now()
        late = 0
        for task, (peer, deadline) in self.unsent.items():
            if deadline <= now and task not in self._late:
                self._late.add(task)
                self.stalled[peer] = self.stalled.get(peer, 0) + 1
                late += 1
        if late:
            self.timed_out += late
            self._timeout_log(late=late, stalled_connections=len(self.stalled))
        if self.unsent:
            loop = asyncio.get_running_loop()
            self._sweep = loop.call_later(self.write_timeout / 4, self.sweep)

    def collect(self) -> list[Metric]:
        """The budget's counts as Prometheus metrics."""
        refused = CounterMetricFamily(
            "model_runtime_grpc_calls_refused_budget",
            "gRPC calls refused RESOURCE_EXHAUSTED at once: too many being computed (calls), "
            "the bytes in flight past the budget (bytes), their connection stalled (stalled)",
            labels=["reason"],
        )
        refused.add_metric(["calls"], self.refused_calls)
        refused.add_metric(["bytes"], self.refused_bytes)
        refused.add_metric(["stalled"], self.refused_stalled)
        return [
            refused,
            CounterMetricFamily(
                "model_runtime_grpc_answers_timed_out",
                "gRPC answers not written within the write timeout (their client does not "
                "read); their connections are refused new calls",
                value=self.timed_out,
            ),
            GaugeMetricFamily(
                "model_runtime_grpc_bytes_in_flight",
                "Bytes of gRPC calls in flight: requests received, answers not yet written",
                value=self.bytes,
            ),
        ]


class QuietUnwrittenAnswers(logging.Filter):
    """grpc.aio logs an error with a traceback for every answer that could not be written
    because its client left; a client that leaves with many is not the server's error. Those
    records become one rate-limited warning."""

    def __init__(self) -> None:
        super().__init__()
        self._log = RateLimitedLog("grpc_answers_not_written_client_left")

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("ExecuteBatchError raised in core"):
            self._log()
            return False
        return True


def quiet_unwritten_answers() -> None:
    """Install :class:`QuietUnwrittenAnswers` on grpc.aio's logger (once)."""
    logger = logging.getLogger("grpc._cython.cygrpc")
    if not any(isinstance(f, QuietUnwrittenAnswers) for f in logger.filters):
        logger.addFilter(QuietUnwrittenAnswers())
