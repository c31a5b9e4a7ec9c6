"""The deadlines of requests queued directly (``direct.submit``, through ``direct.expire_in``):
one book per loop, each request failed with the runner's error past its own deadline, an
answered one never; requests of a timeout each (a gRPC caller's deadline, an ensemble step's
time left) each expire on time and leave nothing kept behind."""

from __future__ import annotations

import asyncio

import pytest

from model_runtime.errors import RequestTimeoutError
from model_runtime.server.inference import direct
from model_runtime.server.inference.direct import expire_in


async def test_each_request_fails_past_its_own_deadline_and_an_answered_one_never() -> None:
    loop = asyncio.get_running_loop()
    failed_at: dict[int, float] = {}
    added_at: dict[int, float] = {}

    def request(k: int) -> asyncio.Future[object]:
        future: asyncio.Future[object] = loop.create_future()
        future.add_done_callback(lambda _: failed_at.__setitem__(k, loop.time()))
        added_at[k] = loop.time()
        return future

    first, second = request(0), request(1)
    first_due = expire_in(first, 0.05)
    expire_in(second, 0.05)
    first_due.cancel()  # answered: the timer armed for it goes on to the next
    first.set_result({})
    await asyncio.sleep(0.02)  # the third comes later: its deadline is later
    third = request(2)
    late = expire_in(third, 0.05)
    await asyncio.wait_for(asyncio.wait([second, third]), 2)
    for k, future in ((1, second), (2, third)):
        with pytest.raises(RequestTimeoutError, match="Request timeout expired"):
            future.result()
        assert failed_at[k] >= added_at[k] + 0.05 - 0.002  # (the loop's clock resolution)
    assert failed_at[2] > failed_at[1]
    late.cancel()  # after it expired: nothing to do
    assert first.result() == {} and not direct._book


async def test_a_cancelled_first_deadline_does_not_hold_back_the_next() -> None:
    loop = asyncio.get_running_loop()
    gone = loop.create_future()
    expire_in(gone, 0.02).cancel()
    await asyncio.sleep(0.01)  # (time for the next request to come later)
    waiting = loop.create_future()
    expire_in(waiting, 0.02)
    await asyncio.wait_for(asyncio.wait([waiting]), 2)
    assert isinstance(waiting.exception(), RequestTimeoutError)
    assert not gone.done() and not direct._book


async def test_a_request_answered_in_time_is_left_as_answered() -> None:
    loop = asyncio.get_running_loop()
    answered, waiting = loop.create_future(), loop.create_future()
    expire_in(answered, 0.02)
    expire_in(waiting, 0.02)
    answered.set_result({"y": 1})  # its caller did not cancel the deadline (yet)
    await asyncio.wait_for(asyncio.wait([waiting]), 2)
    assert answered.result() == {"y": 1}
    assert isinstance(waiting.exception(), RequestTimeoutError)


async def test_requests_of_a_timeout_each_expire_on_time_and_leave_nothing_kept() -> None:
    # A gRPC caller's deadline, an ensemble step's time left: later requests may be due sooner.
    loop = asyncio.get_running_loop()
    timeouts = [0.3, 0.03, 0.05, 0.02, 0.04, 0.04, 0.01]
    added_at, failed_at = [], {}
    futures: list[asyncio.Future[object]] = []
    for k, timeout in enumerate(timeouts):
        future: asyncio.Future[object] = loop.create_future()
        future.add_done_callback(lambda _, k=k: failed_at.__setitem__(k, loop.time()))
        added_at.append(loop.time())
        expire_in(future, timeout)
        futures.append(future)
    await asyncio.wait_for(asyncio.wait([futures[-1]]), 2)
    assert not futures[0].done()  # the last, due first, is not held behind the first
    await asyncio.wait_for(asyncio.wait(futures), 2)
    for k, timeout in enumerate(timeouts):
        assert isinstance(futures[k].exception(), RequestTimeoutError)
        assert failed_at[k] >= added_at[k] + timeout - 0.002  # (the loop's clock resolution)
    assert not direct._book  # nothing kept once all have expired
