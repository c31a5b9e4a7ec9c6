"""Connection limits of the daemon's HTTP server (DESIGN.md §11).

aiohttp closes idle keep-alive connections, but a client that sends a request head one byte at
a time keeps its socket (and a file descriptor) for as long as it likes, and nothing bounds how
many sockets are open at once: a thousand slow clients exhaust the descriptors and the server
stops accepting anyone. :class:`~model_runtime.server.http.runner.GuardedAppRunner` is an
``aiohttp.web.AppRunner`` whose connections pass through a guard that adds:

- a **header timeout**: a request head must be complete within ``header_timeout`` seconds of
  its first byte; past it the connection is closed (no answer: there is no request to answer);
- an **idle timeout** (``keepalive_timeout``; aiohttp's own between requests): a connection
  with no request for that long is closed, a new one that has sent nothing yet too. A client
  pool opened ahead of use (load balancers and proxies pre-connect) is idle, not slow: closed
  after the header timeout, it would come back as a burst of reconnects in the next rush;
- a **connection limit**: past ``max_connections`` open connections a new one is answered
  ``503`` with ``Retry-After`` and closed at once, before it costs more than its accept;
- **slow and idle connections make room**: once the open connections near the limit (its
  last sixteenth, :func:`high_water`), each new connection closes the one whose head has been
  arriving the longest, if for ``pressure_header_timeout`` at least (the header timeout under
  pressure: a whole head comes in one round trip), else the connection idle in keep-alive the
  longest (one that has been answered and sent nothing since), so a client that sends whole
  requests is served rather than refused while slow or idle ones are held for their timeouts;
  only when none is slow or idle is the limit's 503 given;
- a **write timeout**: a connection whose answers wait in its write buffer (past the
  transport's high-water mark) for ``write_timeout`` seconds is closed, its answers dropped;
  while they wait, nothing more is answered on it at the protocol level;
- a **memory budget** (:class:`~model_runtime.server.http.budget.ByteBudget`): a request body
  not yet in hand counts its ``Content-Length`` (a chunked one the largest body) against
  ``memory_budget`` bytes for the whole server until its request is over, and answers waiting
  past a write buffer's high-water mark count while they wait; a request past it is answered
  503 at once, its body skipped, not buffered;
- **admission at the protocol level** (:attr:`ConnectionGuard.head_admission`): the head of
  a request that arrives on a connection idle in keep-alive is read as soon as it is in, and
  its admission decided from it, once. A refused one (an infer request over its model's
  admission limit) is answered from prebuilt bytes and its body skipped as it arrives: aiohttp
  never sees it, so no request object, task, middleware or parse is paid for it. An admitted
  one goes to aiohttp carrying its admission (:data:`ADMITTED`), so the middleware does not
  decide again (by then, under overload, its model would be full, and it would be refused
  the expensive way). Only a plain head is read here
  (:func:`~model_runtime.server.http.heads.plain_head`); anything else goes to aiohttp, whose
  middleware decides the usual way;
- **HTTP/2 on the HTTP/1.1 port**: a client that opens with the HTTP/2 preface (gRPC, curl
  ``--http2-prior-knowledge``) gets an HTTP/2 GOAWAY with ``HTTP_1_1_REQUIRED`` (what it can
  read) and one rate-limited warning in the log, not aiohttp's traceback. Other malformed
  request lines are logged the same way (:class:`QuietParseErrors`).

The timeouts are wall-clock (the event loop's clock): the guard runs on the real network. The
guard's state and limits are here; each connection's protocol, which applies them, is
:class:`~model_runtime.server.http.connection.GuardedConnection`, and
:class:`~model_runtime.server.http.runner.GuardedAppRunner` puts the two together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from model_runtime.server.http.budget import (
    DEFAULT_BUDGET,
    ByteBudget,
    budget_message,
    budget_refusal,
)
from model_runtime.server.observability.ratelog import RateLimitedLog
from model_runtime.server.security.fdlimit import default_max_connections

if TYPE_CHECKING:
    from model_runtime.server.http.fastpath import FastInfer

__all__ = [
    "ADMITTED",
    "Admitted",
    "ConnectionGuard",
    "ConnectionLimits",
    "Guarded",
    "high_water",
]


class Guarded(Protocol):
    """What the guard asks of a connection it holds
    (:class:`~model_runtime.server.http.connection.GuardedConnection`)."""

    def head_began(self) -> float | None: ...
    def close_slow(self) -> None: ...
    def is_idle(self) -> bool: ...
    def close_idle(self) -> None: ...
    def request_started(self) -> Admitted | None: ...
    def request_finished(self, payload: Any) -> None: ...


class Admitted(Protocol):
    """A request's admission, taken from its head: given back if the request goes nowhere."""

    def withdraw(self) -> None: ...


#: The key under which a request admitted from its head carries its admission in the
#: ``aiohttp.web.Request`` to the app's middleware.
ADMITTED = web.RequestKey("model_runtime.admitted", Admitted)


#: ``head_admission(target)`` (a POST's request target): the whole HTTP response (bytes)
#: refusing it now; its :class:`Admitted` when admitted; None when the app decides.
HeadAdmission = Callable[[bytes], "bytes | Admitted | None"]


def high_water(limit: int) -> int:
    """Open connections from which a new one closes the longest-idle keep-alive connection
    first: the limit less a sixteenth of it (at least one)."""
    return limit - max(1, limit // 16)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The guard's limits, in seconds and connections (see the module docstring).

    ``max_connections`` None: :func:`default_max_connections`.
    """

    header_timeout: float = 10.0
    keepalive_timeout: float = 75.0
    max_connections: int | None = None
    retry_after: int = 1
    pressure_header_timeout: float = 1.0
    write_timeout: float = 30.0
    memory_budget: int = DEFAULT_BUDGET

    def __post_init__(self) -> None:
        timeouts = (
            self.header_timeout,
            self.keepalive_timeout,
            self.pressure_header_timeout,
            self.write_timeout,
        )
        if not all(t > 0 for t in timeouts):
            raise ValueError(
                "header_timeout, keepalive_timeout, pressure_header_timeout and "
                "write_timeout must be > 0"
            )
        if self.memory_budget < 1:
            raise ValueError(f"memory_budget must be >= 1, got {self.memory_budget}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")


def _refusal(limit: int, retry_after: int) -> bytes:
    body = b'{"error":"too many connections (limit %d); retry later"}' % limit
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        b"Retry-After: %d\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
        % (retry_after, len(body), body)
    )


class ConnectionGuard:
    """The state the guard keeps for one server: its open connections and counters.

    ``budget``: the memory budget of bytes in flight, when shared with another front end
    (default: its own, of ``limits.memory_budget`` bytes).
    """

    def __init__(self, limits: ConnectionLimits, budget: ByteBudget | None = None) -> None:
        self.limits = limits
        self.limit = limits.max_connections or default_max_connections()
        self.high_water = high_water(self.limit)
        self.refusal = _refusal(self.limit, limits.retry_after)
        self.open: dict[RequestHandler, Guarded] = {}
        #: Connections idle in keep-alive since (loop time), longest idle first (dicts keep
        #: insertion order).
        self.idle: dict[Guarded, float] = {}
        #: Connections with a head (or a refused body) under the header timeout, oldest first.
        self.heads: dict[Guarded, None] = {}
        self.budget = budget or ByteBudget(limits.memory_budget)
        self.budget_refusal = budget_refusal(self.budget.limit, limits.retry_after)
        self.refused = 0
        #: Admission decided from plain request heads (see :data:`HeadAdmission` and
        #: :meth:`GuardedConnection._refuse_early`). None: the app decides on every request.
        self.head_admission: HeadAdmission | None = None
        #: Admitted infer requests answered without aiohttp
        #: (:mod:`model_runtime.server.http.fastpath`); None: all go to aiohttp.
        self.fast: FastInfer | None = None
        #: A head announcing a larger body goes to aiohttp (whose limit answers it 413).
        self.early_max_body = 64 << 20
        self.early_refused = 0
        self.state_checked = False  #: aiohttp's protocol state checked (runner.guarded)
        self.idle_closed = 0
        self.slow_closed = 0  # late heads closed near the limit
        self.write_timeouts = 0
        self.header_timeouts = 0
        self.idle_timeouts = 0  # new connections that sent nothing within keepalive_timeout
        self.limit_log = RateLimitedLog("connection_limit_reached")
        self.http2_log = RateLimitedLog("http2_preface_refused")
        self.idle_log = RateLimitedLog("idle_connections_closed_near_limit")
        self.slow_log = RateLimitedLog("slow_connections_closed_near_limit")
        self.budget_log = RateLimitedLog("memory_budget_spent")

    def make_room(self, now: float) -> bool:
        """Near the limit: close one connection (loop time ``now``): the one whose head has
        been arriving the longest if for ``pressure_header_timeout`` at least; else the one
        idle in keep-alive the longest, or that head if it began before that one was idle.
        (A client that sends whole requests on its connection is the last to lose it; a
        head under way is closed only in place of an idle connection.) False if none is
        idle or slow."""
        began = self._oldest_head()
        if began is not None and now - began >= self.limits.pressure_header_timeout:
            return self._close_slow()
        idle_since = next(iter(self.idle.values()), None)
        if began is not None and idle_since is not None and began <= idle_since:
            return self._close_slow()
        return self.close_idle()

    def _oldest_head(self) -> float | None:
        """When the head arriving the longest began (loop time); None when none is."""
        heads = self.heads
        while heads:
            conn = next(iter(heads))
            began = conn.head_began()
            if began is not None:
                return began
            del heads[conn]
        return None

    def _close_slow(self) -> bool:
        """Close the connection whose head has been arriving the longest (there is one)."""
        conn = next(iter(self.heads))
        del self.heads[conn]
        conn.close_slow()
        self.slow_closed += 1
        self.slow_log(limit=self.limit, open=len(self.open))
        return True

    def close_idle(self) -> bool:
        """Close the connection idle in keep-alive the longest; False if none is idle."""
        idle = self.idle
        while idle:
            conn = next(iter(idle))
            del idle[conn]
            if conn.is_idle():
                conn.close_idle()
                self.idle_closed += 1
                self.idle_log(limit=self.limit, open=len(self.open))
                return True
        return False

    def collect(self) -> Iterator[Metric]:
        """The guard's counts as Prometheus metrics (register the guard in a registry)."""
        yield GaugeMetricFamily(
            "model_runtime_http_connections_open", "HTTP connections open", value=len(self.open)
        )
        yield CounterMetricFamily(
            "model_runtime_http_connections_refused",
            "New HTTP connections answered 503 and closed past the connection limit",
            value=self.refused,
        )
        closed = CounterMetricFamily(
            "model_runtime_http_connections_closed",
            "HTTP connections closed by the server: a head not complete within the header "
            "timeout (header_timeout), a new connection silent for the keep-alive timeout "
            "(silent), the longest idle keep-alive one near the connection limit (near_limit), "
            "the longest arriving head near it (slow_near_limit), answers not taken within the "
            "write timeout (write_timeout)",
            labels=["reason"],
        )
        closed.add_metric(["header_timeout"], self.header_timeouts)
        closed.add_metric(["silent"], self.idle_timeouts)
        closed.add_metric(["near_limit"], self.idle_closed)
        closed.add_metric(["slow_near_limit"], self.slow_closed)
        closed.add_metric(["write_timeout"], self.write_timeouts)
        yield closed
        yield GaugeMetricFamily(
            "model_runtime_http_bytes_in_flight",
            "Request body bytes counted against the memory budget (announced, not yet done)",
            value=self.budget.in_use,
        )
        yield CounterMetricFamily(
            "model_runtime_http_requests_refused_memory_budget",
            "Requests answered 503 because their bodies did not fit the memory budget",
            value=self.budget.refused,
        )
        if self.fast is not None:
            yield CounterMetricFamily(
                "model_runtime_requests_answered_at_protocol_level",
                "Inference requests answered from the connection's bytes without aiohttp "
                "(admitted from a plain head: model_runtime.server.http.fastpath)",
                value=self.fast.taken,
            )
        yield CounterMetricFamily(
            "model_runtime_requests_refused_early",
            "Inference requests refused from their head alone, before aiohttp read them (a "
            "part of model_runtime_requests_refused)",
            value=self.early_refused,
        )

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Tells the connection its request head is complete (the header timeout stops), and
        holds its body's bytes against the memory budget while it runs."""
        conn = self.open.get(request.protocol)
        if conn is None:
            return await handler(request)  # type: ignore[no-any-return]
        admitted = conn.request_started()
        size = self._in_flight(request)
        try:
            if size and not self.budget.take(size):
                if admitted is not None:
                    admitted.withdraw()
                self.budget_log(limit=self.budget.limit)
                return web.json_response(
                    {"error": budget_message(self.budget.limit)},
                    status=503,
                    headers={"Retry-After": str(self.limits.retry_after)},
                )
            if admitted is not None:
                request[ADMITTED] = admitted
            try:
                return await handler(request)  # type: ignore[no-any-return]
            finally:
                if size:
                    self.budget.give(size)
        finally:
            conn.request_finished(request.content)

    def _in_flight(self, request: web.Request) -> int:
        """The bytes of ``request``'s body still to come (counted whole: its Content-Length,
        or the largest body when chunked); 0 when all of it came with its head, or when it is
        larger than any body read (the app refuses it unread: 400 in Triton's words)."""
        content = request.content
        if content.is_eof():
            return 0
        length = request.content_length
        if length is None:
            return self.early_max_body
        return 0 if length > self.early_max_body else length
