"""The device's worker thread: jobs in order, answered on the loop, and the hop it measures
(what a run costs in thread hand-offs, which decides what runs inline on the loop)."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from actors.device.worker import SWITCH_ENV, SWITCH_INTERVAL, Worker, claim_switch_interval
from model_runtime.errors import ConfigurationError

pytestmark = pytest.mark.timeout(30)


async def test_the_hop_is_measured_when_the_thread_was_idle_only() -> None:
    worker = Worker("test-worker")
    try:
        assert worker.hop_seconds == 0.0  # nothing measured yet
        for i in range(5):
            assert await worker.submit(lambda i=i: i * 2) == i * 2
        quick = worker.hop_seconds
        assert 0.0 < quick < 0.05
        # A job that waits in line behind a slow one waited for the job, not for the hop.
        # (It runs a while too, so that it is answered after the slow one, on its own.)
        slow = worker.submit(time.sleep, 0.3)
        behind = worker.submit(time.sleep, 0.05)
        assert await slow is None
        await behind
        assert worker.hop_seconds < 0.02  # counted, the wait would add 0.3 / 8 at least
    finally:
        worker.shutdown()


async def test_jobs_run_in_order_and_their_errors_reach_their_callers() -> None:
    worker = Worker("test-worker")
    seen: list[int] = []

    def fail() -> None:
        raise ValueError("no")

    try:
        futures = [worker.submit(seen.append, i) for i in range(20)]
        failing = worker.submit(fail)
        await asyncio.gather(*futures)
        assert seen == list(range(20))
        with pytest.raises(ValueError, match="no"):
            await failing
    finally:
        worker.shutdown()


def test_device_workers_lower_the_default_switch_interval_and_keep_a_chosen_one() -> None:
    # With CPython's default (5 ms) a busy loop keeps the GIL from a worker whose run ended
    # (see worker.py); a value someone set is theirs.
    before = sys.getswitchinterval()
    try:
        for chosen, expected in ((0.005, SWITCH_INTERVAL), (0.002, 0.002)):
            sys.setswitchinterval(chosen)

            async def start_one() -> None:
                Worker("test-worker").shutdown()

            asyncio.run(start_one())
            assert sys.getswitchinterval() == pytest.approx(expected)
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("bad", ["fast", "-0.001", "1", "nan"])
def test_the_switch_interval_variable_sets_it_or_leaves_it_and_refuses_nonsense(bad: str) -> None:
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        claim_switch_interval({SWITCH_ENV: "0"})  # 0: the interpreter's own, untouched
        assert sys.getswitchinterval() == pytest.approx(0.005)
        sys.setswitchinterval(0.002)
        claim_switch_interval({SWITCH_ENV: " 0.0005 "})  # whatever it was
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        with pytest.raises(ConfigurationError, match=SWITCH_ENV):
            claim_switch_interval({SWITCH_ENV: bad})
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)
