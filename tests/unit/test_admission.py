"""Front-end admission control with a fake clock: the limit is what a model finishes within the
admission delay at its measured rate; the runner's refusal becomes the limit for a while; a
refusal is counted, summarised in the log, and carries the model's prebuilt message."""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Sequence

import pytest
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from model_runtime.server.http.admitting import admission_middleware
from model_runtime.server.http.runner import GuardedAppRunner
from model_runtime.server.inference.admission import (
    CLIENTS,
    DEFAULT_QUEUE_DELAY,
    LAG_HOLD,
    LAG_LIMIT,
    LAG_SUSTAIN,
    LAG_TICK,
    LATCH,
    MIN_LIMIT,
    OVERLOAD_HOLD,
    WINDOW,
    AdmissionControl,
)
from model_runtime.server.inference.looplag import LoopLag

pytestmark = pytest.mark.timeout(10)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _serve(control: AdmissionControl, clock: FakeClock, n: int, seconds_each: float) -> None:
    """``n`` requests one after another, each taking ``seconds_each``."""
    for _ in range(n):
        assert control.try_admit("m") is None
        clock.now += seconds_each
        control.release("m")


def test_no_limit_until_measured_then_what_the_model_finishes_within_the_delay() -> None:
    clock = FakeClock()
    control = AdmissionControl(clock=clock)
    assert DEFAULT_QUEUE_DELAY <= 1.0  # an admitted request waits about this long at most
    for _ in range(1000):  # nothing measured yet: admitted
        assert control.try_admit("m") is None
    for _ in range(1000):  # answered at 1,000 requests/s
        clock.now += 0.001
        control.release("m")
    clock.now += 1.0  # idle time does not count
    _serve(control, clock, 200, 0.001)  # 1,000 requests/s again
    state = control.model("m")
    assert state.rate == pytest.approx(1000, rel=0.05)
    assert state.limit == pytest.approx(1000 * DEFAULT_QUEUE_DELAY, rel=0.05)
    admitted = 0
    while control.try_admit("m") is None:
        admitted += 1
    assert admitted == int(state.limit) + (state.limit % 1 > 0)
    assert "'m'" in (control.try_admit("m") or "") and "retry after 1 s" in state.message
    for _ in range(admitted):  # the load leaves: admitted again
        control.release("m")
    assert control.try_admit("m") is None


def test_a_slow_model_holds_a_closed_loop_of_clients_at_least() -> None:
    # 2 requests/s: 2 within the delay. Clients that each wait for their answer before they
    # send again are no overload however long they wait (Triton queues them): CLIENTS of them
    # joining at once are admitted, beside the ones answered steadily (here one).
    clock = FakeClock()
    control = AdmissionControl(clock=clock)
    _serve(control, clock, 20, 0.5)
    state = control.model("m")
    assert WINDOW < 0.5 and state.floor == MIN_LIMIT and state.steady == 1
    assert state.limit == 1 + CLIENTS + MIN_LIMIT
    assert all(control.try_admit("m") is None for _ in range(CLIENTS))


def test_a_slow_model_admits_a_full_batch_per_replica_at_least() -> None:
    # 2 requests/s, answered one at a time, gives a limit of one: were that the limit, batches
    # would stay that small, and the rate measured from them as low, whatever the load.
    clock = FakeClock()
    capacity = {"m": 64}
    control = AdmissionControl(clock=clock, capacity=lambda name: capacity.get(name, 0))
    _serve(control, clock, 20, 0.5)
    state = control.model("m")
    assert state.floor == 64 and state.limit == state.steady + CLIENTS + 64
    admitted = 0
    while control.try_admit("m") is None:
        admitted += 1
    assert admitted == state.limit
    capacity["m"] = 128  # reloaded with a larger batch: the next window takes it
    for _ in range(admitted):
        clock.now += 0.5
        control.release("m")
    assert state.floor == 128 and state.limit == state.steady + CLIENTS + 128


def test_the_runners_refusal_is_the_limit_for_a_while() -> None:
    clock = FakeClock()
    control = AdmissionControl(queue_delay=None, clock=clock)  # the runner's limit alone
    for _ in range(10):
        assert control.try_admit("m") is None
    control.release("m", queue_full=True)  # the runner refused one with 9 others in flight
    assert control.try_admit("m") is not None  # so with 9 in flight, the next is refused ...
    control.release("m")
    assert control.try_admit("m") is None  # ... with 8, admitted
    assert control.try_admit("m") is not None
    clock.now += LATCH  # then the runner decides again
    assert control.try_admit("m") is None


def test_a_stateful_model_is_never_refused() -> None:
    """Issue 32: its sequence slots bound its work; a step refused mid-sequence would break a
    client's session."""
    clock = FakeClock()
    control = AdmissionControl(queue_delay=None, clock=clock)
    for _ in range(10):
        assert control.try_admit("m") is None
    control.release("m", queue_full=True)
    assert control.try_admit("m") is not None  # stateless: refused at the runner's limit
    control.exempt("m")
    assert all(control.try_admit("m") is None for _ in range(100))
    assert control.at_head(b"/v2/models/m/infer") is control.models["m"]  # admitted at the head
    control.exempt("m", False)  # a reload made it stateless again
    assert control.try_admit("m") is not None


def test_refusals_are_counted_and_logged_as_one_summary() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    control = AdmissionControl(registry, clock=clock)
    _serve(control, clock, 200, 0.01)  # limit 10
    with structlog.testing.capture_logs() as events:
        while control.try_admit("m") is None:
            pass
        for _ in range(99):
            assert control.try_admit("m") is not None
    text = generate_latest(registry).decode()
    assert 'model_runtime_requests_refused_total{model="m",reason="overloaded"} 100.0' in text
    assert [e["event"] for e in events] == ["requests_refused"]


def _simulate(
    control: AdmissionControl,
    clock: FakeClock,
    seconds: float,
    service: float,
    *,
    open_rate: float = 0.0,
    clients: int = 0,
    joins: Sequence[tuple[float, int]] = (),
    lagging: bool = False,
) -> tuple[list[tuple[float, float]], int]:
    """Model "m" serving one request at a time, ``service`` seconds each, for ``seconds`` on
    the fake clock, under an open loop of ``open_rate`` requests/s or a closed loop of
    ``clients`` (each sends its next request as its answer comes), ``joins`` more (seconds
    after the start, how many) joining it later. ``lagging``: the event loop is behind all
    along (a late loop-lag reading every :data:`LAG_TICK`). Returns (when answered, seconds
    waited) of each admitted request, and the refusals."""
    start = clock.now
    events: list[tuple[float, int, str]] = []  # (when, order, what)
    order = 0

    def at(when: float, what: str) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (when, order, what))

    for _ in range(clients):
        at(start, "send")
    for after, more in joins:
        for _ in range(more):
            at(start + after, "send")
    if lagging:
        at(start, "tick")
    if open_rate:
        for k in range(int(seconds * open_rate)):
            at(start + k / open_rate, "send")
    waiting: list[float] = []  # admitted, unanswered: when each arrived (FIFO)
    answered: list[tuple[float, float]] = []
    refused = 0
    busy_until = start
    while events and events[0][0] < start + seconds:
        clock.now, _, what = heapq.heappop(events)
        if what == "tick":
            control.loop_lag(LAG_LIMIT * 2)
            at(clock.now + LAG_TICK, "tick")
        elif what == "send":
            if control.try_admit("m") is None:
                waiting.append(clock.now)
                if len(waiting) == 1:
                    busy_until = max(busy_until, clock.now) + service
                    at(busy_until, "done")
            else:
                refused += 1
                if clients or joins:
                    at(clock.now + 1.0, "send")  # Retry-After
        else:
            arrived = waiting.pop(0)
            control.release("m")
            answered.append((clock.now, clock.now - arrived))
            if clients or joins:
                at(clock.now, "send")
            if waiting:
                busy_until = clock.now + service
                at(busy_until, "done")
    return answered, refused


def test_past_capacity_an_admitted_request_waits_about_one_round_of_service() -> None:
    # Issue 46: an open loop at 3x what the model finishes held a second's work (the admission
    # delay) in flight, so every answered request waited ~1 s. More arrivals than completions
    # mean the queue never drains: hold what the model serves in OVERLOAD_HOLD, refuse the rest.
    clock = FakeClock()
    control = AdmissionControl(clock=clock, capacity=lambda name: 8)
    _serve(control, clock, 500, 0.001)  # 1,000 requests/s: limit 1,000 (a second's work)
    assert control.model("m").limit == pytest.approx(1000, rel=0.05)
    answered, refused = _simulate(control, clock, 3.0, 0.001, open_rate=3000)
    settled = [wait for when, wait in answered if when > clock.now - 2.0]
    assert len(settled) >= 0.95 * 2000  # the model stays busy: goodput is its capacity
    assert refused >= 0.6 * 9000  # the rest refused at once
    assert max(settled) <= 1.5 * OVERLOAD_HOLD  # admitted ones wait about the hold, not 1 s
    assert control.model("m").overloaded
    state = control.model("m")
    while state.inflight:  # what it holds is answered
        clock.now += 0.001
        control.release("m")
    # The overload ends: a second's work may be held again.
    answered, refused = _simulate(control, clock, 1.0, 0.001, open_rate=500)
    assert refused == 0 and not control.model("m").overloaded
    assert control.model("m").limit == pytest.approx(1000, rel=0.1)


def test_a_closed_loop_of_slow_answers_is_not_an_overload() -> None:
    # 300 clients, each sending its next request when answered, on a model finishing 1,000 a
    # second: every request waits 0.3 s (past OVERLOAD_HOLD), yet arrivals only follow answers,
    # and the burst of their first requests is one window: nobody is refused.
    clock = FakeClock()
    control = AdmissionControl(clock=clock, capacity=lambda name: 8)
    _serve(control, clock, 500, 0.001)
    answered, refused = _simulate(control, clock, 3.0, 0.001, clients=300)
    assert refused == 0
    assert len(answered) >= 0.95 * 3000
    assert max(wait for _, wait in answered[-100:]) == pytest.approx(0.3, rel=0.05)
    assert OVERLOAD_HOLD < 0.3


def test_a_closed_loop_waiting_longer_than_the_delay_is_not_refused() -> None:
    # CLIENTS clients on a model finishing 100 a second: each waits 2.56 s, past the admission
    # delay (the front-end limit is 100 in flight), yet arrivals follow answers: nobody is
    # refused. An open loop at 3x that model's rate still is (the overload rule, as above).
    clock = FakeClock()
    control = AdmissionControl(clock=clock, capacity=lambda name: 8)
    _serve(control, clock, 50, 0.01)
    assert 100 * DEFAULT_QUEUE_DELAY < CLIENTS
    answered, refused = _simulate(control, clock, 10.0, 0.01, clients=CLIENTS)
    assert refused == 0 and len(answered) >= 0.95 * 1000
    assert max(wait for _, wait in answered[-100:]) == pytest.approx(2.56, rel=0.05)
    # Its onset is clients joining until its excess passes CLIENTS: those wait their turn
    # (about CLIENTS / 100 s), then admitted requests wait one round (8 at 10 ms each).
    _drain(control, clock)
    answered, refused = _simulate(control, clock, 8.0, 0.01, open_rate=300)
    settled = [wait for when, wait in answered if when > clock.now - 2.0]
    assert control.model("m").overloaded and refused >= 0.6 * 2400
    assert len(settled) >= 0.95 * 200
    assert max(settled) <= 1.5 * 0.08
    assert max(wait for _, wait in answered) <= 1.5 * (2 * CLIENTS + 8) / 100


def test_the_delay_must_be_positive() -> None:
    with pytest.raises(ValueError, match="queue_delay"):
        AdmissionControl(queue_delay=0)


def _drain(control: AdmissionControl, clock: FakeClock) -> None:
    """Answer what a simulation left in flight, 1 ms apart."""
    while control.model("m").inflight:
        clock.now += 0.001
        control.release("m")


def test_a_late_tick_is_a_burst_not_a_loop_behind() -> None:
    clock = FakeClock()
    control = AdmissionControl(clock=clock, capacity=lambda name: 8)
    _serve(control, clock, 2000, 0.001)  # 1,000 a second
    state = control.model("m")
    control.loop_lag(LAG_LIMIT / 2)  # keeping up: nothing changes
    control.loop_lag(LAG_LIMIT * 4)  # late now and then (a burst, a collection): no cap
    control.loop_lag(0.0)
    control.loop_lag(LAG_LIMIT * 2)  # a burst's requests, then its answers: two in a row
    control.loop_lag(LAG_LIMIT * 2)
    assert state.lag_cap == float("inf")
    late = 2
    while state.lag_cap == float("inf"):  # behind: a cap at once
        control.loop_lag(LAG_LIMIT * 2)
        late += 1
    assert late * LAG_TICK <= 0.05  # within 50 ms of falling behind
    ticks = 0
    while state.lag_cap != float("inf"):  # keeping up: it grows back, then goes
        control.loop_lag(0.0)
        ticks += 1
    assert ticks * LAG_TICK <= 1.0  # within a second of the loop keeping up


def test_while_the_loop_is_behind_a_closed_loop_is_never_refused() -> None:
    # A loop behind on a busy host is no overload when arrivals follow answers: 64 clients,
    # 64 more in each of the next three windows (crowded windows in a row: clients joining,
    # not an open loop), then 144 more once those are answered steadily: 400 clients on a model
    # finishing 1,000 a second (each waits 0.4 s), the loop behind all along. Nobody is refused.
    clock = FakeClock()
    control = AdmissionControl(clock=clock, capacity=lambda name: 8)
    _serve(control, clock, 500, 0.001)  # measured, one at a time
    assert 1000 * LAG_HOLD < 128 < CLIENTS < 400
    joins = [(0.15, 64), (0.25, 64), (0.35, 64), (1.5, 144)]
    answered, refused = _simulate(control, clock, 3.0, 0.001, clients=64, joins=joins, lagging=True)
    state = control.model("m")
    assert state.lag_cap < float("inf")  # the loop is behind ...
    assert refused == 0  # ... yet nobody is refused
    assert len(answered) >= 0.95 * 3000
    assert state.steady >= 350 and not state.overloaded


def test_while_the_loop_is_behind_an_open_loop_is_held_to_lag_hold() -> None:
    # 30 clients in a closed loop, then an open loop at 3x what the model finishes, the loop
    # behind: once arrivals outrun answers, admitted requests wait about LAG_HOLD (not the
    # second's work of the front-end limit, nor the clients' share), the rest are refused.
    clock = FakeClock()
    control = AdmissionControl(clock=clock, capacity=lambda name: 8)
    _serve(control, clock, 500, 0.001)
    _simulate(control, clock, 1.0, 0.001, clients=30, lagging=True)
    state = control.model("m")
    assert 25 <= state.steady <= 30
    _drain(control, clock)
    answered, refused = _simulate(control, clock, 3.0, 0.001, open_rate=3000, lagging=True)
    settled = [wait for when, wait in answered if when > clock.now - 2.0]
    assert state.overloaded
    assert state.lag_cap == pytest.approx(1000 * LAG_HOLD, rel=0.1)
    assert len(settled) >= 0.95 * 2000  # goodput: the model's capacity
    assert refused >= 0.6 * 9000
    assert max(settled) <= 1.2 * OVERLOAD_HOLD


def test_nothing_is_held_for_the_loop_before_a_rate_is_measured() -> None:
    # A fresh start: 256 clients at once on a busy host; what the model finishes is unknown.
    clock = FakeClock()
    control = AdmissionControl(clock=clock, capacity=lambda name: 8)
    state = control.model("m")  # known (loaded), nothing measured yet
    for _ in range(LAG_SUSTAIN + 2):
        control.loop_lag(LAG_LIMIT * 2)
    assert all(control.try_admit("m") is None for _ in range(2 * CLIENTS))
    assert state.lag_cap == float("inf")


def test_without_an_admission_delay_nothing_is_refused_at_the_front_end() -> None:
    # `--admission-delay 0`: no front-end limit, no overload limit, no loop-lag limit; only the
    # runner's own refusals (its queue limit) are relayed.
    clock = FakeClock()
    control = AdmissionControl(queue_delay=None, clock=clock, capacity=lambda name: 8)
    _serve(control, clock, 500, 0.001)
    answered, refused = _simulate(control, clock, 2.0, 0.001, open_rate=3000, lagging=True)
    assert refused == 0 and len(answered) >= 0.95 * 2000
    state = control.model("m")
    assert state.limit == state.lag_cap == float("inf") and not state.overloaded
    assert "its queue is full" in state.message


async def test_the_lag_monitor_reports_how_late_its_timer_fires() -> None:
    readings: list[float] = []

    class Recorder(AdmissionControl):
        def loop_lag(self, lag: float) -> None:
            readings.append(lag)

    lag = LoopLag(Recorder(), tick=0.001)
    lag.start()
    await asyncio.sleep(0.05)
    time.sleep(0.1)  # noqa: ASYNC251 -- the loop blocked on purpose: the next tick is late
    await asyncio.sleep(0.01)
    lag.stop()
    assert len(readings) >= 3
    assert max(readings) >= 0.09 and min(readings) < 0.02


def _infer(model: str, body: bytes = b"{}") -> bytes:
    return (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _status(reader: asyncio.StreamReader) -> int:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    await asyncio.wait_for(reader.readexactly(length), 5)
    return int(head.split()[1])


async def test_heads_that_arrive_together_are_each_decided_once_as_they_are_read() -> None:
    """Ten heads in one read of the loop, a limit of four: four admitted, six refused from
    their heads alone. An admitted head is not decided again in the middleware (there, after
    the four entered, it would be refused through aiohttp, the expensive way)."""
    clock = FakeClock()
    control = AdmissionControl(clock=clock)
    _serve(control, clock, 200, 0.25)
    state = control.model("m")
    state.limit = 4  # the limit's rule is tested above; here, four places
    gate, full = asyncio.Event(), asyncio.Event()
    entered = 0

    async def infer(request: web.Request) -> web.Response:
        nonlocal entered
        entered += 1
        if entered == 4:
            full.set()
        await gate.wait()
        return web.Response(text="ok")

    app = web.Application(middlewares=[admission_middleware(control)])
    app.router.add_post("/v2/models/{name}/infer", infer)
    runner = GuardedAppRunner(app, access_log=None)
    runner.guard.head_admission = control.at_head
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        conns = [await asyncio.open_connection("127.0.0.1", site.port) for _ in range(10)]
        for _, writer in conns:  # all ten written before the server reads any
            writer.write(_infer("m"))
        await asyncio.wait_for(full.wait(), 5)
        gate.set()
        statuses = [await _status(reader) for reader, _ in conns]
        for _, writer in conns:
            writer.close()
    finally:
        await runner.cleanup()
    assert sorted(statuses) == [200] * 4 + [503] * 6
    assert entered == 4
    assert runner.guard.early_refused == 6  # every refusal from its head
    assert state.inflight == 0


def test_one_connections_flood_is_refused_not_the_connections_that_wait_for_answers() -> None:
    clock = FakeClock()
    control = AdmissionControl(clock=clock)
    _serve(control, clock, 200, 0.001)  # measured: 1,000 requests/s
    limit = math.ceil(control.model("m").limit)  # admitted below it
    flood = 0  # requests of connections with others in flight (gRPC's native transport)
    while control.try_admit("m", crowded=True) is None:
        flood += 1
    assert flood == limit
    # The flood fills the limit; a request whose connection waits for its answers is admitted
    # (HTTP's, and gRPC's alone on its connection), up to the limit of those in all.
    for _ in range(limit):
        assert control.try_admit("m") is None
    assert control.try_admit("m") is not None
    assert control.try_admit("m", crowded=True) is not None
    for _ in range(flood):  # the flood's answers leave: its share is free again
        control.release("m", crowded=True)
    assert control.try_admit("m", crowded=True) is not None  # the others still hold the limit
    for _ in range(limit):
        control.release("m")
    assert control.try_admit("m", crowded=True) is None
