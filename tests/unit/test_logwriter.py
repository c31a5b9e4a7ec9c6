"""The daemon's log output in batches: info lines wait for one write, a warning or a line from
another thread writes everything at once, in order, and nothing is lost at exit."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest

from model_runtime.server.observability.logwriter import FLUSH_BYTES, BatchedLogWriter

pytestmark = pytest.mark.timeout(30)


class File:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.writes.append(data)
        return len(data)

    def flush(self) -> None:
        pass


async def test_info_lines_on_the_loop_are_written_together_and_a_warning_at_once() -> None:
    file = File()
    writer = BatchedLogWriter(file)  # type: ignore[arg-type]
    writer.batch_on(asyncio.get_running_loop())
    for i in range(100):
        writer.info(f"line {i}".encode())
    assert file.writes == []  # waiting for the batch
    writer.warning(b"bad")  # everything before it, then it, now
    assert file.writes == [b"".join(b"line %d\n" % i for i in range(100)) + b"bad\n"]
    writer.info("text")  # a str from a console renderer
    await asyncio.sleep(0.2)  # the batch's timer
    assert file.writes[1:] == [b"text\n"]


async def test_a_big_batch_is_written_before_its_timer() -> None:
    file = File()
    writer = BatchedLogWriter(file)  # type: ignore[arg-type]
    writer.batch_on(asyncio.get_running_loop())
    line = b"x" * 1000
    for _ in range(FLUSH_BYTES // 1000 + 1):
        writer.info(line)
    assert len(file.writes) == 1


def test_a_line_off_the_loop_is_written_at_once() -> None:
    file = File()
    writer = BatchedLogWriter(file)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    writer.batch_on(loop)  # this thread's loop (not running: its timers never fire)
    writer.info(b"on the loop")  # waits for its batch
    thread = threading.Thread(target=writer.info, args=(b"from a worker",))
    thread.start()
    thread.join()  # another thread's line: written at once, after what waited
    assert file.writes == [b"on the loop\nfrom a worker\n"]
    writer.info(b"again")
    writer.batch_on(None)  # no more batching: what waits is written
    writer.info(b"now")
    assert file.writes[1:] == [b"again\n", b"now\n"]
    loop.close()


def test_lines_waiting_at_exit_are_written() -> None:
    code = (
        "import asyncio, sys\n"
        "from model_runtime.server.observability.logwriter import BatchedLogWriter\n"
        "w = BatchedLogWriter(sys.stdout.buffer)\n"
        "async def main():\n"
        "    w.batch_on(asyncio.get_running_loop())\n"
        "    w.info(b'last words')\n"
        "asyncio.run(main())\n"  # the loop ends before the batch's timer fires
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=20, check=True)
    assert out.stdout == b"last words\n"
