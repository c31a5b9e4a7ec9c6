"""Admission control at the front end: refusals that cost almost nothing (DESIGN.md §11).

On this machine the daemon's limit under many small requests is its event loop, not the
device: an accepted JSON request costs ~0.5 ms of loop time, of which the device is a few
percent, so the runner's latency budget (priced at the device's rate) sees no queue while the
loop falls seconds behind. :class:`AdmissionControl` therefore bounds what the front end holds:

- **the front-end limit**: a model's requests in flight at the front end (reading, parsing,
  queued, computing, encoding) may not exceed what it finishes within ``queue_delay`` seconds
  at its measured completion rate (completions per second while it has work, re-measured every
  :data:`WINDOW` seconds; no limit until a first window is measured). By Little's law an
  admitted request then waits about ``queue_delay``, whatever the model. It never holds less
  than a closed loop needs (:meth:`ModelAdmission.closed_loop`: the concurrency answered
  steadily and :data:`CLIENTS` more joining at once): clients that send one request per answer
  are served however long they wait, as Triton serves them; the overload limit below is what
  refuses an open loop.
- **the overload limit**: while more requests arrive than the model finishes (arrivals over
  completions past :data:`OVERLOAD_RATIO` in :data:`OVERLOAD_SUSTAIN` windows in a row, and by
  more than :data:`CLIENTS` in all: an open loop past capacity, not a closed loop, whose
  clients send one request per answer, nor clients joining it), waiting longer helps nobody (the
  queue never drains), so the front-end limit is what the model finishes in its measured
  service time of a full round (``floor / rate``: a batch computing and one filling per
  replica), and never under :data:`OVERLOAD_HOLD` seconds of work: admitted requests wait
  about that, and the rest are refused at once. It lifts once arrivals fall back.
- **the runner's limit**: when the runner refused a request (``QueueFullError``: its latency
  budget or ``max_queue_size``) with ``n`` in flight, requests are refused at ``n`` in flight
  without reaching it, for :data:`LATCH` seconds (then the runner is asked again).

- **the loop's limit**: the front-end limit bounds what is held, not what the event loop can
  afford to take. Past the loop's capacity, requests (refused ones too) wait unread in socket
  buffers, a backlog no limit above sees, and everyone's latency grows with it. So the loop's
  lag is measured (:class:`~.looplag.LoopLag`: how late a timer due every :data:`LAG_TICK` seconds
  fires); while it is over :data:`LAG_LIMIT` (from :data:`LAG_SUSTAIN` ticks in a row on),
  an overloaded model's in-flight cap is what it finishes in :data:`LAG_HOLD` seconds (never
  under its floor). A model that is not overloaded is held to the concurrency answered
  steadily (:attr:`ModelAdmission.steady`: a closed loop's clients) plus the larger of that and
  :data:`CLIENTS` more (clients joining at once): a closed loop on a busy host lags the loop
  too, yet its requests follow its answers, and refusing them sheds nothing. No cap before a
  rate is measured. While the loop keeps up the cap grows back by :data:`LAG_INCREASE` of the
  floor per tick.
  Shed requests cost an early refusal (~a tenth of an admitted one), so the loop catches up.

A stateful model's requests are never refused here (:meth:`AdmissionControl.exempt`): its
sequence slots bound its work already (a sequence runs one step at a time, and new sequences
wait for a slot), and a step refused in the middle of a sequence would break a client's session.

A refused request is answered before its body is parsed, from a 503 built once per model (JSON
error naming the model and the limit, ``Retry-After``), without an access log line: it is
counted in ``model_runtime_requests_refused_total{model,reason}`` and logged as a rate-limited
summary (``requests_refused``), never one line per refusal.

HTTP: :meth:`AdmissionControl.at_head` decides from the request head, in the connection guard,
before aiohttp reads the request (:mod:`model_runtime.server.http.guard`): it refuses, or
admits and the request carries its admission to the app's outermost middleware
(:func:`model_runtime.server.http.admitting.admission_middleware`), which decides for the requests
the guard did not. gRPC, the same rule:
``message = admission.try_admit(model)``; a message means UNAVAILABLE with it, None means
admitted, and then ``admission.release(model, queue_full=...)`` once answered. A front end
that counts each connection's requests in flight (gRPC's native transport) passes
``crowded=True`` for a request whose connection has others in flight: such requests are held
to the limits counting every request in flight, the others counting the requests that are not
crowded, so that one connection's flood is refused, not the connections that wait for their
answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson
from prometheus_client import CollectorRegistry, Counter

from model_runtime.server.observability.ratelog import RateLimitedLog

__all__ = [
    "CLIENTS",
    "DEFAULT_QUEUE_DELAY",
    "LAG_HOLD",
    "LAG_INCREASE",
    "LAG_LIMIT",
    "LAG_SUSTAIN",
    "LAG_TICK",
    "LATCH",
    "MIN_LIMIT",
    "OVERLOAD_HOLD",
    "OVERLOAD_RATIO",
    "OVERLOAD_SUSTAIN",
    "WINDOW",
    "AdmissionControl",
    "ModelAdmission",
]

#: Seconds of front-end work a model may hold (see the module docstring): the daemon's latency
#: budget. Shorter sheds sooner under overload (a closed loop of up to CLIENTS more than the
#: concurrency answered steadily is held whatever it is).
DEFAULT_QUEUE_DELAY = 1.0
#: The front-end limit never falls below this many requests in flight, nor below what the
#: model's replicas take at once (AdmissionControl's ``capacity``): a limit under a full batch
#: per replica would keep batches small, and the rate measured from them low, for good.
MIN_LIMIT = 4
#: Seconds per measurement window of the completion rate (and completions it needs).
WINDOW = 0.1
_WINDOW_COMPLETIONS = 8
#: Seconds the in-flight count at which the runner refused stays the limit.
LATCH = 0.5
#: Seconds between the loop-lag monitor's ticks, and the lag past which a tick is late.
LAG_TICK = 0.01
LAG_LIMIT = 0.01
#: Late ticks in a row before the loop counts as behind (then each late tick holds the cap).
#: One late tick is a burst (64 clients' requests parsed at once on a busy host are one
#: 20-40 ms tick), a collection or a load, not an overload: at 1 the daemon refused some of a
#: burst of 64 concurrent clients at a fresh start while its host was busy.
LAG_SUSTAIN = 3
#: Keeping up: the in-flight cap grows by this share of its floor per tick, up to no cap
#: (faster let it double between two lagging ticks at 3x capacity).
LAG_INCREASE = 0.05
#: ... and an overloaded model holds what it finishes in this many seconds (the latency of
#: what it holds; ``benchmarks/overload.py`` measured 0.1 and 0.03 against it).
LAG_HOLD = 0.07
#: Overload (see the module docstring): arrivals over completions in a window past this ratio.
#: A closed loop's are about equal (each answer brings the next request); 1.5xC is 1.5.
OVERLOAD_RATIO = 1.2
#: Windows in a row with more arrivals than completions before the overload limit holds: one
#: is a burst (clients that start together), not a rate the model cannot keep up with.
OVERLOAD_SUSTAIN = 2
#: ... and then the front-end limit holds at least this many seconds of the model's work.
OVERLOAD_HOLD = 0.05
#: A closed loop's clients starting together: the loop-lag and overload limits admit this many
#: requests in flight above the concurrency answered steadily (``ModelAdmission.steady``), and
#: arrivals count as an overload only once they exceed completions by more than this. A closed
#: loop's arrivals outrun its completions only while its clients join (each client has one
#: request in flight), so up to this many clients starting at once are never refused; an open
#: loop's excess keeps growing, and passes it.
CLIENTS = 256
#: Refusal reasons (the ``reason`` label).
OVERLOADED = "overloaded"
QUEUE_FULL = "queue_full"


class ModelAdmission:
    """One model's front-end state: requests in flight, the measured rate, its limits, its
    prebuilt refusal and counters. Owned by the event loop's thread (no locks)."""

    __slots__ = (
        "_arrivals",
        "_busy",
        "_busy_since",
        "_completions",
        "_crowded",
        "_excess",
        "_peak",
        "_refusals",
        "_window_start",
        "body",
        "clock",
        "crowded",
        "exempt",
        "floor",
        "headers",
        "inflight",
        "lag_cap",
        "limit",
        "message",
        "name",
        "overloaded",
        "rate",
        "refused",
        "response",
        "runner_limit",
        "runner_until",
        "steady",
    )

    def __init__(self, name: str, control: AdmissionControl) -> None:
        self.name = name
        self.clock = control.clock
        self.inflight = 0
        #: Of those, requests whose connection had others in flight (:meth:`refuses`).
        self.crowded = 0
        self.floor = max(MIN_LIMIT, control.capacity(name))
        self.limit = float("inf")  # not measured yet
        self.lag_cap = float("inf")  # the loop keeps up
        self.rate = 0.0
        self.runner_limit = float("inf")
        self.runner_until = 0.0
        self._completions = 0
        self._arrivals = 0  # requests decided in this window, refused ones too
        self._crowded = 0  # windows in a row with more arrivals than completions
        self._excess = 0  # arrivals over completions in those windows
        self._peak = 0  # the most in flight in this window
        self._refusals = 0  # refused in this window
        #: The concurrency answered steadily: the most in flight in the latest window that
        #: refused nothing and whose arrivals did not outrun its completions (a closed loop's
        #: clients). The loop-lag and overload limits hold at least this much more.
        self.steady = 0
        #: The overload limit holds (see the module docstring).
        self.overloaded = False
        self._busy = 0.0
        self._busy_since = 0.0
        self._window_start = self.clock()
        #: Never refused (a stateful model: see :meth:`AdmissionControl.exempt`).
        self.exempt = False
        limit = (
            f"what it can finish within {control.queue_delay:g} s"
            if control.queue_delay < float("inf")
            else "its queue is full"
        )
        self.message = (
            f"model {name!r} is over its admission limit ({limit}); "
            f"retry after {control.retry_after} s"
        )
        self.body = orjson.dumps({"error": self.message})
        self.headers = {"Retry-After": str(control.retry_after)}
        #: The same 503 as a whole HTTP/1.1 response, for refusals before aiohttp.
        self.response = (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: %d\r\nContent-Length: %d\r\n\r\n%s"
            % (control.retry_after, len(self.body), self.body)
        )
        self.refused = {
            reason: control.refused.labels(name, reason) for reason in (OVERLOADED, QUEUE_FULL)
        }

    def refuses(self, crowded: bool = False) -> str | None:
        """The reason a new request is refused now, or None: admitted. O(1), no allocation.
        ``crowded``: its connection has other requests in flight. The front-end and loop-lag
        limits hold a crowded request to every request in flight, any other to those that
        are not crowded (:attr:`crowded` of them are): one connection's flood is refused, and
        connections that wait for their answers are served (in all, at most twice a limit)."""
        self._arrivals += 1
        if self.exempt:
            return None
        n = self.inflight if crowded else self.inflight - self.crowded
        if n >= self.limit or n >= self.lag_cap:
            self._refusals += 1
            return OVERLOADED
        if n >= self.runner_limit:
            if self.clock() < self.runner_until:
                self._refusals += 1
                return QUEUE_FULL
            self.runner_limit = float("inf")
        return None

    def loop_behind(self) -> None:
        """The event loop is behind. Overloaded (an open loop): hold what the model finishes
        in :data:`LAG_HOLD` seconds, never less than the floor, at once, not step by step.
        Otherwise arrivals follow answers (a closed loop, however busy the host): hold the
        concurrency answered steadily plus that, or plus :data:`CLIENTS` joining at once.
        Nothing is held before a rate is measured (what the model finishes is unknown)."""
        if self.rate == 0.0:
            return
        hold = self.rate * LAG_HOLD
        if not self.overloaded:
            hold = max(self.steady + hold, self.closed_loop())
        self.lag_cap = max(self.floor, hold)

    def closed_loop(self) -> int:
        """What a closed loop may hold: the concurrency answered steadily, :data:`CLIENTS`
        joining at once, and a full batch per replica."""
        return self.steady + CLIENTS + self.floor

    def loop_keeps_up(self) -> None:
        """The event loop keeps up: raise the cap by :data:`LAG_INCREASE` of the floor (gone
        once over the front-end limit, or far over what is held)."""
        if self.lag_cap < float("inf"):
            self.lag_cap += self.floor * LAG_INCREASE
            if self.lag_cap >= self.limit or self.lag_cap > 4 * max(self.inflight, self.floor):
                self.lag_cap = float("inf")  # past anything it would hold back

    def enter(self) -> None:
        """One more request in flight."""
        if self.inflight == 0:
            self._busy_since = self.clock()
        self.inflight += 1
        if self.inflight > self._peak:
            self._peak = self.inflight

    def withdraw(self) -> None:
        """Undo an :meth:`enter` for a request that never went further (admitted from its head,
        then its connection closed, or aiohttp rejected it): no completion is counted."""
        self.inflight -= 1
        if self.inflight == 0:
            now = self.clock()
            self._busy += now - self._busy_since
            self._busy_since = now

    def leave(
        self, queue_full: bool, queue_delay: float, capacity: Callable[[str], int] | None = None
    ) -> None:
        """A request in flight was answered (``queue_full``: the runner refused it)."""
        now = self.clock()
        if queue_full:
            self.runner_limit = max(1, self.inflight - 1)
            self.runner_until = now + LATCH
        self.inflight -= 1
        self._completions += 1
        if self.inflight == 0:
            self._busy += now - self._busy_since
            self._busy_since = now
        if now - self._window_start < WINDOW or self._completions < _WINDOW_COMPLETIONS:
            return
        busy = self._busy + (now - self._busy_since if self.inflight else 0.0)
        if busy > 0.0:
            measured = self._completions / busy
            self.rate = measured if self.rate == 0.0 else 0.5 * (self.rate + measured)
            if capacity is not None:  # a reload may have changed the batch size or replicas
                self.floor = max(MIN_LIMIT, capacity(self.name))
            grew = self._arrivals - self._completions  # refused ones are arrivals too
            if self._arrivals > OVERLOAD_RATIO * self._completions:
                self._crowded += 1
                self._excess += grew
            else:
                self._crowded = self._excess = 0
            if grew <= 0 and not self._refusals:  # answers kept pace, nobody refused
                self.steady = self._peak
            # An open loop past capacity, not clients joining (their excess is their number).
            self.overloaded = (
                queue_delay < float("inf")
                and self._crowded >= OVERLOAD_SUSTAIN
                and self._excess > CLIENTS
            )
            if self.overloaded:  # the queue would never drain: hold one round's service time
                hold = min(queue_delay, max(OVERLOAD_HOLD, self.floor / self.rate))
                self.limit = max(self.floor, self.rate * hold)
            else:  # arrivals follow answers: a closed loop's clients are held however slow
                self.limit = max(self.closed_loop(), self.rate * queue_delay)
        self._completions = self._arrivals = self._refusals = 0
        self._peak = self.inflight
        self._busy = 0.0
        self._busy_since = now
        self._window_start = now


class AdmissionControl:
    """Front-end admission for every model of one server (see the module docstring).

    ``queue_delay`` None turns every front-end limit off (the front-end, overload and
    loop-lag limits); the runner's limit (its own refusals) still applies.
    Metrics go to ``registry`` (the daemon's own), or a private one. ``clock``: seconds, the
    time base of the rate and the latch (the same as the rate-limited log's). ``capacity``:
    requests a model's replicas take at once (0 if unknown), the floor of its limit.

    Raises:
        ValueError: ``queue_delay`` is not > 0.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        queue_delay: float | None = DEFAULT_QUEUE_DELAY,
        retry_after: int = 1,
        clock: Callable[[], float] = time.monotonic,
        capacity: Callable[[str], int] = lambda name: 0,
    ) -> None:
        if queue_delay is not None and not queue_delay > 0:
            raise ValueError(f"queue_delay must be > 0 seconds, got {queue_delay}")
        self.queue_delay = queue_delay if queue_delay is not None else float("inf")
        self.retry_after = retry_after
        self.clock = clock
        self.capacity = capacity
        self.refused = Counter(
            "model_runtime_requests_refused",
            "Inference requests refused by admission control before their body was parsed "
            "(overloaded: the front-end limit; queue_full: the runner's queue limit)",
            ["model", "reason"],
            registry=registry or CollectorRegistry(),
        )
        self.models: dict[str, ModelAdmission] = {}
        # Request targets already resolved to a model (bounded: cleared when full).
        self._targets: dict[bytes, ModelAdmission] = {}
        self.log = RateLimitedLog("requests_refused")
        self._late = 0  # late loop-lag readings in a row

    def model(self, name: str) -> ModelAdmission:
        """The state of model ``name`` (made on first use)."""
        state = self.models.get(name)
        if state is None:
            state = self.models[name] = ModelAdmission(name, self)
        return state

    def loop_lag(self, lag: float) -> None:
        """One reading of the event loop's lag, in seconds (see :class:`LoopLag`): behind
        after :data:`LAG_SUSTAIN` late readings in a row, and on each late one while a cap
        holds."""
        if self.queue_delay == float("inf"):
            return  # every front-end limit is off
        if lag > LAG_LIMIT:
            self._late += 1
            sustained = self._late >= LAG_SUSTAIN
            for state in self.models.values():
                if sustained or state.lag_cap < float("inf"):
                    state.loop_behind()
        else:
            self._late = 0
            for state in self.models.values():
                state.loop_keeps_up()

    def refuse(self, state: ModelAdmission, reason: str) -> None:
        """Count and summarise a refusal of one of ``state``'s requests for ``reason``."""
        state.refused[reason].inc()
        self.log(model=state.name, reason=reason, in_flight=state.inflight, limit=state.limit)

    def exempt(self, model: str, exempt: bool = True) -> None:
        """Admit every request of ``model`` (or stop doing so): a stateful model's, whose
        sequence slots bound its work and whose steps must not be refused mid-sequence."""
        self.model(model).exempt = exempt

    # -- gRPC (and any other front end) ------------------------------------------------------

    def try_admit(self, model: str, *, crowded: bool = False) -> str | None:
        """Admit one request for ``model``: None, and it counts as in flight until
        :meth:`release`; or the refusal's message (counted and logged as a summary), to be
        answered at once (gRPC: UNAVAILABLE with the message; HTTP: 503). ``crowded``: its
        connection has other requests in flight, where the front end counts them (fairness
        between connections: see :meth:`ModelAdmission.refuses`); give the same to
        :meth:`release`.

        Raises:
            nothing.
        """
        state = self.model(model)
        reason = state.refuses(crowded)
        if reason is not None:
            self.refuse(state, reason)
            return state.message
        state.enter()
        state.crowded += crowded
        return None

    def release(self, model: str, *, queue_full: bool = False, crowded: bool = False) -> None:
        """An admitted request of ``model`` was answered; ``queue_full``: the runner refused
        it (``QueueFullError``), so its in-flight count becomes the limit for a while;
        ``crowded``: what :meth:`try_admit` was told."""
        state = self.model(model)
        state.crowded -= crowded
        state.leave(queue_full, self.queue_delay, self.capacity)

    # -- HTTP ------------------------------------------------------------------------------------

    def at_head(self, target: bytes) -> bytes | ModelAdmission | None:
        """Admission from a POST's request target alone, for the connection guard
        (:class:`~model_runtime.server.http.guard.ConnectionGuard`), before aiohttp reads the
        request:

        - the prebuilt 503 (a whole HTTP/1.1 response) when ``target`` is the infer URL of a
          model over its limit now, counted and summarised like any refusal;
        - the model's state when it is admitted: it is in flight from now, and the request
          carries it to the HTTP app's admission middleware
          (:mod:`model_runtime.server.http.admitting`), or the guard gives it back
          with :meth:`ModelAdmission.withdraw`;
        - None for any other target: the middleware decides.

        Deciding here, once, matters under overload: a head let through to be checked again in
        the middleware found its model full by then (the heads of one loop iteration all
        passed before any entered) and was refused the expensive way, through aiohttp."""
        state = self._targets.get(target)
        if state is None:
            state = self._model_of(target)
            if state is None:
                return None
            if len(self._targets) >= 256:
                self._targets.clear()
            self._targets[target] = state
        reason = state.refuses()
        if reason is not None:
            self.refuse(state, reason)
            return state.response
        state.enter()
        return state

    def _model_of(self, target: bytes) -> ModelAdmission | None:
        """The state of the known model whose infer URL ``target`` is, or None."""
        if not target.startswith(b"/v2/models/") or not target.endswith(b"/infer"):
            return None
        parts = target[11:-6].split(b"/")
        if len(parts) not in (1, 3) or (len(parts) == 3 and parts[1] != b"versions"):
            return None
        if b"%" in parts[0]:
            return None  # percent-encoded: aiohttp decodes it, the middleware decides
        try:
            return self.models.get(parts[0].decode())
        except UnicodeDecodeError:
            return None
