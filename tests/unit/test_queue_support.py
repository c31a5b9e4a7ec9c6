"""Shared helpers for the Queue actor tests: a model, a fake session, request helpers.

The fake session reads ``queue.ready`` and answers with outputs that are a function of each
input row only, and every test input row is unique, so a row routed to the wrong caller (or a
padding row that reaches one) shows up as a wrong value.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np

from actors.actor import ActorRef
from actors.clock import FakeClock
from actors.queues.actor import Queue
from actors.queues.batch import Batch
from actors.queues.config import QueueConfig
from actors.queues.messages import Complete, Enqueue, QueueMessage
from actors.queues.request import Request
from model_runtime.executable.model import (
    Anchor,
    AnchorRole,
    AnchorType,
    ExecutableMetadata,
    Program,
    ProgramFlow,
    ProgramKind,
    Target,
    TensorInfo,
)

F = 3  # features per row
F32 = np.dtype(np.float32)


def metadata(
    batch: int,
    iterations: int = 1,
    *,
    axis: int = 0,
    two_outputs: bool = False,
    buckets: tuple[int, ...] = (),
) -> ExecutableMetadata:
    """A model with input ``x`` (rows x F) and output ``y`` = 2x+1 (and ``s`` = row sums);
    ``buckets``: the batch sizes its program runs (batch-size buckets)."""

    def shape(b: int) -> tuple[int, ...]:
        return (b, F) if axis == 0 else (F, b)

    def anchor(name: str, type_: AnchorType, role: AnchorRole, shp: tuple[int, ...]) -> Anchor:
        bdim = axis if len(shp) == 2 else 0
        return Anchor(name, name, TensorInfo(shp, F32), type_, role, (1,), batch_dim=bdim)

    anchors = [
        anchor("x", AnchorType.INPUT, AnchorRole.USER_INPUT, shape(batch)),
        anchor("y", AnchorType.OUTPUT, AnchorRole.USER_OUTPUT, shape(batch)),
    ]
    if two_outputs:
        anchors.append(anchor("s", AnchorType.OUTPUT, AnchorRole.USER_OUTPUT, (batch,)))
        anchors.append(
            Anchor(
                "step",
                "step",
                TensorInfo((1,), F32),
                AnchorType.OUTPUT,
                AnchorRole.USER_OUTPUT,
                (1,),
            )
        )
    return ExecutableMetadata(
        model_name="q",
        target=Target(),
        batch_size=batch,
        anchors=tuple(anchors),
        programs=(Program(1, "main", ProgramKind.MAIN),),
        program_flow=ProgramFlow(main=(1,)),
        device_iterations=iterations,
        options={"batch_sizes": ",".join(map(str, buckets))} if buckets else {},
    )


def model(inputs: Mapping[str, np.ndarray], axis: int = 0) -> dict[str, np.ndarray]:
    """The reference: y = 2x + 1, s = sum over features, step = [42]."""
    x = inputs["x"]
    return {
        "y": x * 2 + 1,
        "s": x.sum(axis=1 - axis).astype(np.float32),
        "step": np.array([42.0], dtype=np.float32),
    }


_serial = iter(range(1, 10**9))


def rows(n: int, axis: int = 0) -> np.ndarray:
    """``n`` unique rows (no row of any call equals another's, none is all zeros)."""
    base = next(_serial) * 1000.0
    x = (base + np.arange(n * F, dtype=np.float64).reshape(n, F)).astype(np.float32)
    return np.ascontiguousarray(x.T) if axis else x


def request(x: np.ndarray, samples: int, *, clock: FakeClock | None = None, **kw: Any) -> Request:
    fut: asyncio.Future[dict[str, np.ndarray]] = asyncio.get_running_loop().create_future()
    t = clock.monotonic() if clock is not None else 0.0
    return Request({"x": x}, samples, fut, t_submit=t, **kw)


@dataclass
class FakeSession:
    """Reads ready batches and completes them (``hold``: keep them until released)."""

    queue: Queue
    ref: ActorRef[QueueMessage]
    clock: FakeClock | None = None
    axis: int = 0
    hold: bool = False
    compute_time: float = 0.0
    seen: list[Batch] = field(default_factory=list)
    held: list[Batch] = field(default_factory=list)
    produced: list[list[dict[str, np.ndarray]]] = field(default_factory=list)
    transform: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] | None = None

    def outputs(self, batch: Batch) -> list[dict[str, np.ndarray]]:
        fn = self.transform or (lambda i: model(i, self.axis))
        outs = [dict(fn(it)) for it in batch.inputs]
        self.produced.append(outs)
        return outs

    def complete(self, batch: Batch) -> None:
        t0 = self.clock.monotonic() if self.clock else 0.0
        self.ref.tell(Complete(batch, self.outputs(batch), t0, t0 + self.compute_time))

    def release(self) -> None:
        held, self.held = self.held, []
        for b in held:
            self.complete(b)

    async def run(self) -> None:
        async for batch in self.queue.ready:
            self.seen.append(batch)
            if self.hold:
                self.held.append(batch)
            else:
                self.complete(batch)


@asynccontextmanager
async def running(
    queue: Queue, *, session: bool = True, **kw: Any
) -> AsyncIterator[tuple[ActorRef[QueueMessage], FakeSession]]:
    """Run ``queue`` (and a fake session) for the body of the ``async with``."""
    async with anyio.create_task_group() as tg:
        ref: ActorRef[QueueMessage] = await tg.start(queue.run)
        fake = FakeSession(
            queue, ref, clock=queue.clock if isinstance(queue.clock, FakeClock) else None, **kw
        )
        if session:
            tg.start_soon(fake.run)
        try:
            yield ref, fake
        finally:
            tg.cancel_scope.cancel()


def make_queue(meta: ExecutableMetadata, clock: FakeClock | None = None, **cfg: Any) -> Queue:
    return Queue(meta, QueueConfig(**cfg), clock=clock or FakeClock())


def submit(ref: ActorRef[QueueMessage], req: Request) -> Request:
    ref.tell(Enqueue(req))
    return req


def expected(x: np.ndarray, axis: int = 0) -> dict[str, np.ndarray]:
    return model({"x": x}, axis)


async def settle() -> None:
    """Let every task run until all are blocked.

    ``wait_all_tasks_blocked`` alone sleeps 0.1 s whenever a task is still runnable; a few
    checkpoints first make that the rare case (it still guarantees the outcome).
    """
    for _ in range(30):
        await anyio.lowlevel.checkpoint()
    await anyio.wait_all_tasks_blocked()
