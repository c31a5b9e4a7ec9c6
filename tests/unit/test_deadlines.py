"""The deadlines of one loop's requests (model_runtime/deadlines.py):
each key expires once, at its own deadline, with the timeout it was added with; a discarded one
never; one timer serves the keys that come in deadline order, and a key whose deadline comes
before the last one's still expires on time. A fake loop (its clock moved by the test) stands
in for the event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from model_runtime.deadlines import Deadlines


class _Handle:
    def __init__(self, loop: FakeLoop, at: float, fn: Callable[..., None], args: Any) -> None:
        self.loop, self.at, self.fn, self.args = loop, at, fn, args

    def cancel(self) -> None:
        if self in self.loop.armed:
            self.loop.armed.remove(self)


class FakeLoop:
    """``time()`` and ``call_at()``: the timers armed, fired in time order by :meth:`advance`."""

    def __init__(self) -> None:
        self.now = 100.0
        self.armed: list[_Handle] = []

    def time(self) -> float:
        return self.now

    def call_at(self, at: float, fn: Callable[..., None], *args: Any) -> _Handle:
        handle = _Handle(self, at, fn, args)
        self.armed.append(handle)
        return handle

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while due := sorted((h for h in self.armed if h.at <= end), key=lambda h: h.at):
            handle = due[0]
            self.armed.remove(handle)
            self.now = max(self.now, handle.at)
            handle.fn(*handle.args)
        self.now = end


Expired = list[tuple[str, float, float]]  # key, its timeout, when


def _book() -> tuple[FakeLoop, Deadlines[str], Expired]:
    loop = FakeLoop()
    expired: Expired = []
    book: Deadlines[str] = Deadlines(
        loop,  # type: ignore[arg-type]
        lambda key, timeout: expired.append((key, timeout, loop.now)),
    )
    return loop, book, expired


def test_each_key_expires_at_its_own_deadline_in_order() -> None:
    loop, book, expired = _book()
    book.add("a", 1.0)
    loop.advance(0.25)
    book.add("b", 1.0)
    loop.advance(0.25)
    book.add("c", 1.0)
    loop.advance(0.5)  # a's deadline
    assert expired == [("a", 1.0, 101.0)]
    loop.advance(0.2)  # b's is 0.05 s on: not yet
    assert [k for k, _, _ in expired] == ["a"]
    loop.advance(0.3)
    assert expired == [("a", 1.0, 101.0), ("b", 1.0, 101.25), ("c", 1.0, 101.5)]
    assert len(book) == 0 and not loop.armed  # nothing left, no timer armed


def test_a_discarded_key_never_expires_and_the_next_keeps_its_deadline() -> None:
    loop, book, expired = _book()
    book.add("answered", 2.0)
    loop.advance(1.0)
    book.add("waiting", 2.0)
    book.discard("answered")
    book.discard("never added")  # (nothing)
    loop.advance(1.0)  # the answered one's deadline: the timer finds the next one not due
    assert expired == []
    loop.advance(1.0)
    assert expired == [("waiting", 2.0, 103.0)]


def test_one_timer_serves_the_keys_that_come_in_deadline_order() -> None:
    loop, book, expired = _book()
    for i in range(1000):
        book.add(str(i), 5.0)
        loop.advance(0.001)
    assert len(loop.armed) == 1  # not one per key
    loop.advance(10.0)
    assert [k for k, _, _ in expired] == [str(i) for i in range(1000)]


def test_a_key_due_before_the_last_one_expires_on_time() -> None:
    loop, book, expired = _book()
    book.add("long", 60.0)
    book.add("short", 0.2)  # before the last one in line: a timer of its own
    book.add("discarded", 0.1)
    book.discard("discarded")
    assert len(book) == 2 and len(loop.armed) == 2  # the line's timer and short's
    loop.advance(0.2)
    assert expired == [("short", 0.2, 100.2)]
    loop.advance(59.8)
    assert [(k, t) for k, t, _ in expired] == [("short", 0.2), ("long", 60.0)]
    assert len(book) == 0 and not loop.armed


def test_a_shorter_timeout_after_the_line_emptied_is_not_late() -> None:
    loop, book, expired = _book()
    book.add("long", 60.0)
    book.discard("long")  # answered: the line is empty, its timer armed for 60 s on
    book.add("short", 0.5)
    loop.advance(0.5)
    assert expired == [("short", 0.5, 100.5)]


def test_a_key_added_after_the_others_expired_gets_a_timer_again() -> None:
    loop, book, expired = _book()
    book.add("first", 1.0)
    loop.advance(1.0)
    book.add("later", 1.0)
    assert len(loop.armed) == 1
    loop.advance(1.0)
    assert [k for k, _, _ in expired] == ["first", "later"]


def test_an_expiry_that_discards_or_adds_keys_leaves_the_others_on_time() -> None:
    # (as the runner's: a request's expiry may end others with it, or queue another)
    loop = FakeLoop()
    seen: list[tuple[str, float]] = []
    book: Deadlines[str]

    def expire(key: str, timeout: float) -> None:
        seen.append((key, loop.now))
        if key == "a":
            book.discard("b")
            book.add("d", 1.0)

    book = Deadlines(loop, expire)  # type: ignore[arg-type]
    book.add("a", 1.0)
    book.add("b", 1.0)
    loop.advance(0.5)
    book.add("c", 1.0)
    loop.advance(2.0)
    assert seen == [("a", 101.0), ("c", 101.5), ("d", 102.0)]
    assert len(book) == 0
