"""The deadlines of requests queued directly (``direct.submit``): one book per timeout and
loop, one timer for all of its requests, each failed past its own deadline; the books of
timeouts of a request each (a gRPC caller's deadline, an ensemble step's time left) are not
kept without bound."""

from __future__ import annotations

import asyncio

import pytest

from model_runtime.errors import RequestTimeoutError
from model_runtime.server.inference import direct
from model_runtime.server.inference.direct import BOOKS_KEPT, Deadlines, book_of


async def test_each_request_fails_past_its_own_deadline_and_an_answered_one_never() -> None:
    loop = asyncio.get_running_loop()
    book = Deadlines(loop, 0.05)
    failed_at: dict[int, float] = {}
    added_at: dict[int, float] = {}

    def request(k: int) -> asyncio.Future[object]:
        future: asyncio.Future[object] = loop.create_future()
        future.add_done_callback(lambda _: failed_at.__setitem__(k, loop.time()))
        added_at[k] = loop.time()
        return future

    first, second = request(0), request(1)
    first_due = book.add(first)
    book.add(second)
    first_due.cancel()  # answered: the timer armed for it goes on to the next
    first.set_result({})
    await asyncio.sleep(0.02)  # the third comes later: its deadline is later
    third = request(2)
    late = book.add(third)
    await asyncio.wait_for(asyncio.wait([second, third]), 2)
    for k, future in ((1, second), (2, third)):
        with pytest.raises(RequestTimeoutError, match="Request timeout expired"):
            future.result()
        assert failed_at[k] >= added_at[k] + 0.05 - 0.002  # (the loop's clock resolution)
    assert failed_at[2] > failed_at[1]
    late.cancel()  # after it expired: nothing to do
    assert first.result() == {} and len(book) == 0


async def test_a_cancelled_first_deadline_does_not_hold_back_the_next() -> None:
    loop = asyncio.get_running_loop()
    book = Deadlines(loop, 0.02)
    gone = loop.create_future()
    book.add(gone).cancel()
    await asyncio.sleep(0.01)  # (time for the next request to come later)
    waiting = loop.create_future()
    book.add(waiting)
    await asyncio.wait_for(asyncio.wait([waiting]), 2)
    assert isinstance(waiting.exception(), RequestTimeoutError)
    assert not gone.done() and len(book) == 0


async def test_a_request_answered_in_time_is_left_as_answered() -> None:
    loop = asyncio.get_running_loop()
    book = Deadlines(loop, 0.02)
    answered, waiting = loop.create_future(), loop.create_future()
    book.add(answered)
    book.add(waiting)
    answered.set_result({"y": 1})  # its caller did not cancel the deadline (yet)
    await asyncio.wait_for(asyncio.wait([waiting]), 2)
    assert answered.result() == {"y": 1}
    assert isinstance(waiting.exception(), RequestTimeoutError)


async def test_books_of_many_timeouts_are_not_kept_without_bound() -> None:
    # Each request of its own timeout makes a book; past BOOKS_KEPT they are forgotten, and a
    # forgotten book still fails what it holds at its deadline (its armed timer keeps it).
    loop = asyncio.get_running_loop()
    held = loop.create_future()
    book_of(0.05).add(held)
    for i in range(2 * BOOKS_KEPT):
        book_of(1000.0 + i / 7)
    assert len(direct._BOOKS) <= BOOKS_KEPT
    await asyncio.wait_for(asyncio.wait([held]), 2)
    assert isinstance(held.exception(), RequestTimeoutError)
