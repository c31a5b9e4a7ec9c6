"""Front-end admission control with a fake clock: the limit is what a model finishes within the
admission delay at its measured rate; the runner's refusal becomes the limit for a while; a
refusal is counted, summarised in the log, and carries the model's prebuilt message."""

from __future__ import annotations

import asyncio
import time

import pytest
import structlog
from prometheus_client import CollectorRegistry, generate_latest

from model_runtime.server.admission import (
    DEFAULT_QUEUE_DELAY,
    LAG_DECREASE,
    LAG_HOLD,
    LAG_LIMIT,
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
    _serve(control, clock, 200, 0.01)  # 100 a second: limit 100, 10 within LAG_HOLD
    state = control.model("m")
    assert state.rate * LAG_HOLD == pytest.approx(10)
    for _ in range(60):
        assert control.try_admit("m") is None
    control.loop_lag(LAG_LIMIT / 2)  # keeping up: nothing changes
    assert control.try_admit("m") is None
    control.loop_lag(LAG_LIMIT * 2)  # behind, with 61 in flight: hold 42.7 at most
    assert state.lag_cap == pytest.approx(61 * LAG_DECREASE)
    assert control.try_admit("m") is not None
    for _ in range(40):
        control.release("m")
    assert control.try_admit("m") is None  # 22 in flight: under the cap
    control.loop_lag(LAG_LIMIT * 2)  # still behind: the cap follows what is held down
    assert state.lag_cap == pytest.approx(22 * LAG_DECREASE)
    for _ in range(22):
        control.release("m")
    control.loop_lag(LAG_LIMIT * 3)  # nothing held: never under what it finishes in 0.1 s
    assert state.lag_cap == pytest.approx(max(8, state.rate * LAG_HOLD))
    ticks = 0
    while state.lag_cap != float("inf"):  # keeping up: it grows back, then goes
        control.loop_lag(0.0)
        ticks += 1
    assert ticks < 20
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
