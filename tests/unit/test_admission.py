"""Front-end admission control with a fake clock: the limit is what a model finishes within the
admission delay at its measured rate; the runner's refusal becomes the limit for a while; a
refusal is counted, summarised in the log, and carries the model's prebuilt message."""

from __future__ import annotations

import asyncio
import time

import pytest
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from model_runtime.server.http.admitting import admission_middleware
from model_runtime.server.http.runner import GuardedAppRunner
from model_runtime.server.inference.admission import (
    DEFAULT_QUEUE_DELAY,
    LAG_HOLD,
    LAG_LIMIT,
    LAG_TICK,
    LATCH,
    MIN_LIMIT,
    WINDOW,
    AdmissionControl,
    LoopLag,
)

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


def test_a_slow_model_holds_at_least_the_minimum() -> None:
    clock = FakeClock()
    control = AdmissionControl(clock=clock)
    _serve(control, clock, 20, 0.5)  # 2 requests/s: 0.2 within the delay
    assert control.model("m").limit == MIN_LIMIT
    assert WINDOW < 0.5


def test_a_slow_model_admits_a_full_batch_per_replica_at_least() -> None:
    # 2 requests/s, answered one at a time, gives a limit of one: were that the limit, batches
    # would stay that small, and the rate measured from them as low, whatever the load.
    clock = FakeClock()
    capacity = {"m": 64}
    control = AdmissionControl(clock=clock, capacity=lambda name: capacity.get(name, 0))
    _serve(control, clock, 20, 0.5)
    assert control.model("m").limit == 64
    admitted = 0
    while control.try_admit("m") is None:
        admitted += 1
    assert admitted == 64
    capacity["m"] = 128  # reloaded with a larger batch: the next window takes it
    for _ in range(admitted):
        clock.now += 0.5
        control.release("m")
    assert control.model("m").limit == 128


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


def test_the_delay_must_be_positive() -> None:
    with pytest.raises(ValueError, match="queue_delay"):
        AdmissionControl(queue_delay=0)


def test_while_the_loop_is_behind_fewer_are_held_then_the_cap_lifts() -> None:
    # Past the loop's capacity requests wait unread in socket buffers, where no in-flight limit
    # sees them: the loop's lag shrinks what a model may hold until the loop keeps up again.
    clock = FakeClock()
    control = AdmissionControl(clock=clock, capacity=lambda name: 8)
    _serve(control, clock, 2000, 0.001)  # 1,000 a second: limit 1,000
    state = control.model("m")
    assert state.rate == pytest.approx(1000)
    hold = 1000 * LAG_HOLD  # what it finishes in LAG_HOLD
    assert 8 < hold < 100
    for _ in range(100):
        assert control.try_admit("m") is None
    control.loop_lag(LAG_LIMIT / 2)  # keeping up: nothing changes
    assert control.try_admit("m") is None
    control.loop_lag(LAG_LIMIT * 4)  # late now and then (a burst, a collection): no cap
    control.loop_lag(0.0)
    control.loop_lag(LAG_LIMIT * 2)  # a burst's requests, then its answers: two in a row
    control.loop_lag(LAG_LIMIT * 2)
    assert state.lag_cap == float("inf")
    assert control.try_admit("m") is None
    late = 2
    while state.lag_cap == float("inf"):  # behind, with 102+ in flight: at once, hold what
        control.loop_lag(LAG_LIMIT * 2)  # it finishes in LAG_HOLD, no more
        late += 1
    assert late * LAG_TICK <= 0.05  # within 50 ms of falling behind
    assert state.lag_cap == pytest.approx(hold)
    assert control.try_admit("m") is not None
    for _ in range(102 - int(hold) + 1):
        control.release("m")
    assert control.try_admit("m") is None  # under the cap again
    control.loop_lag(LAG_LIMIT * 2)  # still behind: the same cap
    assert state.lag_cap == pytest.approx(hold)
    while state.inflight:
        control.release("m")
    control.loop_lag(LAG_LIMIT * 3)
    assert state.lag_cap == pytest.approx(hold)
    ticks = 0
    while state.lag_cap != float("inf"):  # keeping up: it grows back, then goes
        control.loop_lag(0.0)
        ticks += 1
    assert ticks * LAG_TICK <= 1.0  # within a second of the loop keeping up
    assert control.try_admit("m") is None


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
    _serve(control, clock, 200, 0.25)  # 4 requests/s: the limit is 4 in flight
    state = control.model("m")
    assert state.limit == MIN_LIMIT == 4
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
