"""One caller's ``execute()``, as the Queue sees it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np

__all__ = ["Request"]


class Request:
    """One caller's request, created by the runner after validation.

    ``inputs`` holds every user input with ``samples`` rows along the row axis (the anchor's
    ``batch_dim``, or the configured ``batching_dim``). ``future`` is resolved with
    ``{output name: array of exactly samples rows}``, or with ``outputs`` (the caller's buffers,
    filled) when given, or fails with the batch's error. A done future (cancelled, or answered by
    the runner) tells the queue the caller has gone: its unpacked rows are dropped.
    ``deadline`` and ``t_submit`` are clock times; the queue carries ``deadline`` for the runner.

    One is made per ``execute()``, on the event loop's hot path, so it is not a dataclass: the
    fields every request sets are slots, written by ``__init__``; the others are class-level
    defaults, written on the instance (into its ``__dict__``, made then) only by the requests
    that change them. (A slots dataclass writes all fourteen: about 900 instructions more per
    request, under callgrind.)
    """

    __slots__ = ("__dict__", "future", "inputs", "priority", "samples", "t_submit")

    inputs: Mapping[str, np.ndarray]
    samples: int
    future: asyncio.Future[dict[str, np.ndarray]]
    t_submit: float
    #: Higher is packed first; FIFO among equals (0: the default level).
    priority: int
    outputs: Mapping[str, np.ndarray] | None = None
    deadline: float | None = None
    #: Bitmask of the replicas that failed this request (it moves on to the others).
    tried: int = 0
    #: Its caller waits for the outputs (awaits them); with ``flush_on_waiting_outputs`` only
    #: such a request's rows make a partial batch flush on timeout.
    waiting: bool = True
    # -- queue bookkeeping (private) --------------------------------------------------------
    #: rows assigned to batches so far (the next row to pack)
    _taken: int = 0
    #: rows whose outputs came back
    _done: int = 0
    #: counted in its queue's pending figures, from when it is queued (cleared exactly once,
    #: when answered, dropped or moved; a request that was never queued is in no figures)
    _open: bool = True
    #: clock time its first rows were packed into a batch
    _t_packed: float = 0.0
    #: output arrays being assembled, when its rows span several segments or buffers were given
    _result: dict[str, np.ndarray] | None = None
    #: the shape of its rows, per input, once a queue of a dynamic model has asked
    #: (:mod:`actors.queues.shapes`)
    _shape: tuple[tuple[int, ...], ...] | None = None

    def __init__(
        self,
        inputs: Mapping[str, np.ndarray],
        samples: int,
        future: asyncio.Future[dict[str, np.ndarray]],
        t_submit: float = 0.0,
        priority: int = 0,
        outputs: Mapping[str, np.ndarray] | None = None,
        deadline: float | None = None,
        tried: int = 0,
        waiting: bool = True,
    ) -> None:
        self.inputs = inputs
        self.samples = samples
        self.future = future
        self.t_submit = t_submit
        self.priority = priority
        if outputs is not None:
            self.outputs = outputs
        if deadline is not None:
            self.deadline = deadline
        if tried:
            self.tried = tried
        if not waiting:
            self.waiting = waiting

    def __repr__(self) -> str:
        return (
            f"Request(samples={self.samples}, priority={self.priority}, "
            f"t_submit={self.t_submit}, deadline={self.deadline}, taken={self._taken}, "
            f"done={self._done})"
        )
