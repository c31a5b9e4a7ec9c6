"""One caller's ``execute()``, as the Queue sees it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Request"]


@dataclass(slots=True, eq=False)
class Request:
    """One caller's request, created by the runner after validation.

    ``inputs`` holds every user input with ``samples`` rows along the row axis (the anchor's
    ``batch_dim``, or the configured ``batching_dim``). ``future`` is resolved with
    ``{output name: array of exactly samples rows}``, or with ``outputs`` (the caller's buffers,
    filled) when given, or fails with the batch's error. A done future (cancelled, or answered by
    the runner) tells the queue the caller has gone: its unpacked rows are dropped.
    ``deadline`` and ``t_submit`` are clock times; the queue carries ``deadline`` for the runner.
    """

    inputs: Mapping[str, np.ndarray]
    samples: int
    future: asyncio.Future[dict[str, np.ndarray]]
    outputs: Mapping[str, np.ndarray] | None = None
    deadline: float | None = None
    t_submit: float = 0.0
    #: Bitmask of the replicas that failed this request (it moves on to the others).
    tried: int = 0
    #: Its caller waits for the outputs (awaits them); with ``flush_on_waiting_outputs`` only
    #: such a request's rows make a partial batch flush on timeout.
    waiting: bool = True
    #: Higher is packed first; FIFO among equals (0: the default level).
    priority: int = 0
    # -- queue bookkeeping (private) --------------------------------------------------------
    #: rows assigned to batches so far (the next row to pack)
    _taken: int = field(default=0, init=False, repr=False)
    #: rows whose outputs came back
    _done: int = field(default=0, init=False, repr=False)
    #: counted in its queue's pending figures, from when it is queued (cleared exactly once,
    #: when answered, dropped or moved; a request that was never queued is in no figures)
    _open: bool = field(default=True, init=False, repr=False)
    #: clock time its first rows were packed into a batch
    _t_packed: float = field(default=0.0, init=False, repr=False)
    #: output arrays being assembled, when its rows span several segments or buffers were given
    _result: dict[str, np.ndarray] | None = field(default=None, init=False, repr=False)
