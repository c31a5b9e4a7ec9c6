"""Where rows live: the row axis of each anchor, and the ring memory pool of batch buffers.

Every batched anchor is handled along its *row axis*: the configured ``batching_dim`` when
set, else the anchor's ``batch_dim``; the anchor's shape holds B there. Anchors without a
``batch_dim`` are unbatched: a batch takes their value from the last request packed into each
iteration, and each caller gets a copy of the output's value.

String anchors (``bytes``) are numpy object arrays: their batch buffers are object arrays too
(rows are references to the callers' ``bytes``, copied like any row), padded with copies of the
batch's first row (a graph that parses its strings would fail on ``b""``), and
the device never writes them in place (no output views into callers' buffers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from actors.queues.batch import Segment
from actors.queues.config import FlushCallback, QueueConfig
from actors.queues.request import Request
from model_runtime.errors import ConfigurationError
from model_runtime.executable.model import Anchor, ExecutableMetadata

__all__ = ["Layout", "RingPool", "Spec", "rows_view"]

_INPUTS = attrgetter("inputs")
_DTYPE = attrgetter("dtype")


@dataclass(frozen=True, slots=True)
class Spec:
    """One user input or output: name, row axis (None: unbatched), shape and dtype."""

    name: str
    axis: int | None
    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def pad(self) -> Any:
        """The value padding rows hold: 0, or ``b""`` for strings (where the pool copies the
        batch's first row instead when it has one)."""
        return b"" if self.dtype.kind == "O" else 0

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        """A padding-filled array of this anchor's dtype."""
        if self.dtype.kind == "O":
            return np.full(shape, b"", dtype=self.dtype)
        return np.zeros(shape, dtype=self.dtype)

    def shape_with_rows(self, rows: int) -> tuple[int, ...]:
        """The anchor's shape with ``rows`` along the row axis."""
        if self.axis is None:
            return self.shape
        return (*self.shape[: self.axis], rows, *self.shape[self.axis + 1 :])


def rows_view(array: np.ndarray, axis: int | None) -> np.ndarray:
    """``array`` with its row axis first (a view; ``array`` itself when the axis is 0)."""
    if not axis:
        return array
    return np.moveaxis(array, axis, 0)


def _spec(
    anchor: Anchor, batch: int, batching_dim: int | None, rows: tuple[int, ...] | None = None
) -> Spec:
    """``anchor``'s spec; ``rows``: the shape of one request's rows (without the row axis; an
    unbatched anchor's whole shape) to use instead of its dynamic dimensions."""
    if anchor.batch_dim is None:
        return Spec(anchor.name, None, anchor.shape if rows is None else rows, anchor.dtype)
    axis = anchor.batch_dim if batching_dim is None else batching_dim
    if axis >= len(anchor.shape) or anchor.shape[axis] != batch:
        raise ConfigurationError(
            f"anchor {anchor.name!r} of shape {anchor.shape} does not hold the batch size "
            f"{batch} along axis {axis} (batching_dim={batching_dim})"
        )
    shape = anchor.shape if rows is None else (*rows[:axis], batch, *rows[axis:])
    return Spec(anchor.name, axis, shape, anchor.dtype)


class Layout:
    """Batch geometry of one executable under one config."""

    __slots__ = (
        "B",
        "I",
        "buckets",
        "capacity",
        "fast_output",
        "inputs",
        "into_outputs",
        "outputs",
        "row_outputs",
        "simple_inputs",
    )

    def __init__(
        self,
        metadata: ExecutableMetadata,
        config: QueueConfig,
        shapes: Sequence[tuple[int, ...]] | None = None,
    ) -> None:
        """Derive the row axes. ``shapes``: per user input, the shape of a request's rows
        (without the row axis) -- one shape of a model with dynamic dimensions, whose own
        layout holds ``-1`` there (see :mod:`actors.queues.shapes`).

        Raises:
            ConfigurationError: the model has no user input, or an anchor does not hold the
                batch size along its row axis.
        """
        self.B = metadata.batch_size
        self.I = metadata.device_iterations
        self.capacity = self.B * self.I
        dim = config.batching_dim
        anchors = metadata.user_inputs
        rows = shapes if shapes is not None else [None] * len(anchors)
        self.inputs = tuple(_spec(a, self.B, dim, r) for a, r in zip(anchors, rows, strict=True))
        self.outputs = tuple(_spec(a, self.B, dim) for a in metadata.execute_outputs)
        if not self.inputs:
            raise ConfigurationError(f"model {metadata.model_name!r} has no user input to queue")
        self.simple_inputs = all(s.axis == 0 for s in self.inputs)
        #: Batch sizes a partial batch may run at (smallest first, B last): the executable's
        #: buckets when every row axis is 0, one iteration and no flush callback (whose data
        #: fills a whole batch); else B alone, the seed's fixed batch.
        self.buckets: tuple[int, ...] = (self.B,)
        if (
            self.I == 1
            and config.flush_callback is None
            and all(s.axis == 0 for s in (*self.inputs, *self.outputs))
        ):
            self.buckets = metadata.run_sizes
        #: outputs the device may write into callers' buffers: row axis 0, not strings, fixed
        self.into_outputs = tuple(
            s for s in self.outputs if s.axis == 0 and s.dtype.kind != "O" and -1 not in s.shape
        )
        #: the output's name when it is the only one and has row axis 0 (the fast split path)
        self.fast_output = (
            self.outputs[0].name if len(self.outputs) == 1 and self.outputs[0].axis == 0 else None
        )
        #: the outputs' names when every output has row axis 0 (a plain batch's answers are
        #: then one slice per output); None: some output has another axis, or none
        self.row_outputs: tuple[str, ...] | None = (
            tuple(s.name for s in self.outputs)
            if self.outputs and all(s.axis == 0 for s in self.outputs)
            else None
        )

    def bucket(self, rows: int) -> int:
        """The smallest batch size that holds ``rows`` rows."""
        for size in self.buckets:
            if size >= rows:
                return size
        return self.B

    def zero_copy(
        self, inputs: Any, start: int, rows: int | None = None
    ) -> tuple[dict[str, np.ndarray], ...] | None:
        """Views of rows ``[start, start + I*B)`` of ``inputs`` as batch inputs (or of
        ``rows`` rows, one iteration: a bucket), if no copy is needed (row axis 0,
        C-contiguous, the anchor's dtype); else ``None``."""
        if not self.simple_inputs:
            return None
        b = self.B if rows is None else rows
        whole = start == 0 and self.I == 1  # the arrays themselves, if they are b rows each
        for s in self.inputs:
            a = inputs[s.name]
            if not a.flags.c_contiguous or a.dtype != s.dtype:
                return None
            whole = whole and a.shape[0] == b
        if whole and type(inputs) is dict and len(inputs) == len(self.inputs):
            return (inputs,)
        return tuple(
            {s.name: inputs[s.name][start + k * b : start + (k + 1) * b] for s in self.inputs}
            for k in range(self.I)
        )

    def zero_copy_outputs(
        self, outputs: Any, start: int, rows: int | None = None
    ) -> tuple[dict[str, np.ndarray], ...] | None:
        """Views of rows ``[start, start + I*B)`` of the caller's output buffers that the
        device can write into directly (row axis 0, C-contiguous, writeable, the anchor's
        dtype); ``None`` when no given buffer qualifies."""
        if not outputs:
            return None
        usable = [
            s
            for s in self.into_outputs
            if (a := outputs.get(s.name)) is not None
            and a.flags.c_contiguous
            and a.flags.writeable
            and a.dtype == s.dtype
        ]
        if not usable:
            return None
        b = self.B if rows is None else rows
        return tuple(
            {s.name: outputs[s.name][start + k * b : start + (k + 1) * b] for s in usable}
            for k in range(self.I)
        )


def _records(buffer: np.ndarray, spec: Spec) -> np.ndarray | None:
    """``buffer`` (C-contiguous, rows on axis 0) as one void record per row, or None when its
    rows are not plain numbers."""
    if spec.axis != 0 or spec.dtype.kind == "O" or not buffer.flags.c_contiguous:
        return None
    rows = buffer.shape[0]
    row_bytes = buffer.nbytes // rows if rows else 0
    if not row_bytes:
        return None
    return buffer.reshape(rows, -1).view(np.dtype((np.void, row_bytes)))


#: Rows joined in one bytes object up to this size (CPython's ``bytes.join`` holds the GIL up
#: to 1 MiB); bigger batches are copied record by record.
_JOIN_BYTES = 1 << 20


def _copy_records(arrays: list[np.ndarray], out: np.ndarray, dtype: np.dtype[Any]) -> bool:
    """Copy each one-row array (of exactly ``dtype``) into its row of ``out`` (records, see
    :func:`_records`), the GIL held throughout: numpy lets go of the GIL to copy more than 500
    elements, and a device's worker thread returning from its run then takes it and the event
    loop waits. False (nothing written): some array is not a row of ``dtype`` whose bytes are
    one record; the caller copies them as numbers."""
    dtypes = set(map(_DTYPE, arrays))
    if len(dtypes) != 1 or dtypes.pop() is not dtype:
        return False
    n = len(arrays)
    size = out.dtype.itemsize * n
    try:
        if size <= _JOIN_BYTES:  # one joined copy, then one memcpy: the cheapest in CPU
            data = b"".join(arrays)  # type: ignore[arg-type]  # (ndarrays are buffers)
            if len(data) != size:
                return False
            flat: Any = out.reshape(-1).view(np.uint8)
            memoryview(flat)[:] = data  # a memcpy, the GIL held
            return True
        void = out.dtype
        if arrays[0].ndim > 2:  # rows of several axes: one axis of the row's bytes first
            views = [a.reshape(1, -1).view(void) for a in arrays]
        else:
            views = [a.view(void) for a in arrays]
        np.concatenate(views, out=out.reshape(n, *views[0].shape[1:]))
    except (ValueError, TypeError, BufferError):
        return False
    return True


class RingPool:
    """A fixed ring of batch buffers, allocated once; ``take``/``give`` pass indices."""

    __slots__ = ("buffers", "free", "layout", "records")

    def __init__(self, layout: Layout, size: int) -> None:
        self.layout = layout
        self.buffers = [
            tuple({s.name: s.zeros(s.shape) for s in layout.inputs} for _ in range(layout.I))
            for _ in range(size)
        ]
        self.free = list(range(size - 1, -1, -1))
        #: Per buffer, each numeric row-axis-0 input of its first iteration seen as one record
        #: (a numpy void) per row: what :meth:`_fill_plain` copies whole rows into.
        self.records = [
            {s.name: r for s in layout.inputs if (r := _records(buf[0][s.name], s)) is not None}
            for buf in self.buffers
        ]

    def fill(
        self,
        index: int,
        per_iteration: Sequence[list[Segment]],
        valid_rows: int,
        flush_callback: FlushCallback | None,
        size: int | None = None,
        plain: list[Request] | None = None,
    ) -> dict[str, np.ndarray] | None:
        """Copy the segments' rows (or a plain batch's: ``Batch.plain``) into buffer ``index``
        and fill the padding rows (up to the bucket ``size`` when given: one iteration, row
        axis 0, no flush callback).

        Returns the flush callback's output buffers, if it gave any.

        Raises:
            Exception: whatever ``flush_callback`` raised, or a shape/dtype error from the
                data it supplied.
        """
        layout = self.layout
        buf = self.buffers[index]
        b = layout.B
        if plain is not None:
            self._fill_plain(buf[0], plain, self.records[index])
            per_iteration = ()
        for k, segs in enumerate(per_iteration):
            dst = buf[k]
            rows = min(b, max(0, valid_rows - k * b))
            for s in layout.inputs:
                name, axis = s.name, s.axis
                if axis is None:
                    if segs:
                        np.copyto(dst[name], segs[-1][0].inputs[name])
                    continue
                if axis == 0:
                    views = [
                        r.inputs[name] if c == r.samples else r.inputs[name][i : i + c]
                        for r, i, _, _, c in segs
                    ]
                else:
                    views = [
                        np.moveaxis(r.inputs[name], axis, 0)[i : i + c] for r, i, _, _, c in segs
                    ]
                out = rows_view(dst[name], axis)
                if rows == b:
                    np.concatenate(views, out=out)
                elif rows:
                    np.concatenate(views, out=out[:rows])
        if size is not None and size < layout.capacity:
            for s in layout.inputs:  # a bucket's padding only (Layout.buckets' conditions)
                a = buf[0][s.name]
                a[valid_rows:size] = a[0] if s.dtype.kind == "O" else s.pad
            return None
        if valid_rows == layout.capacity:
            return None
        return self._pad(buf, valid_rows, flush_callback)

    def _fill_plain(
        self,
        dst: dict[str, np.ndarray],
        requests: list[Request],
        records: dict[str, np.ndarray],
    ) -> None:
        """Row i of ``dst`` from the one row of ``requests[i]`` (no Python step per row for
        row axis 0; a numeric row copied as one record, see :func:`_copy_records`)."""
        rows = len(requests)
        inputs = list(map(_INPUTS, requests))
        for s in self.layout.inputs:
            name, axis = s.name, s.axis
            if axis is None:
                np.copyto(dst[name], inputs[-1][name])
                continue
            views = list(map(itemgetter(name), inputs))
            record = records.get(name)
            if record is not None and _copy_records(views, record[:rows], s.dtype):
                continue
            if axis:
                views = [np.moveaxis(v, axis, 0) for v in views]
            out = rows_view(dst[name], axis)
            np.concatenate(views, out=out if rows == len(out) else out[:rows])

    def _pad(
        self,
        buf: tuple[dict[str, np.ndarray], ...],
        valid_rows: int,
        flush_callback: FlushCallback | None,
    ) -> dict[str, np.ndarray] | None:
        layout = self.layout
        b, pad = layout.B, layout.capacity - valid_rows
        data: dict[str, np.ndarray] | None = None
        outputs: dict[str, np.ndarray] = {}
        if flush_callback is not None:
            data = {
                s.name: s.zeros(s.shape_with_rows(pad)) for s in layout.inputs if s.axis is not None
            }
            flush_callback(layout.inputs[0].name, data, outputs)
        for s in layout.inputs:
            if s.axis is None:
                continue
            src = None if data is None else rows_view(np.asarray(data[s.name]), s.axis)
            if src is not None and src.shape[0] != pad:
                raise ValueError(f"flush data for {s.name!r} has {src.shape[0]} rows, not {pad}")
            taken = 0
            for k in range(valid_rows // b, layout.I):
                first = valid_rows - k * b if k == valid_rows // b else 0
                dst = rows_view(buf[k][s.name], s.axis)[first:]
                if src is None and s.dtype.kind == "O":
                    # A copy of the batch's first row, not b"": a graph that parses its
                    # strings (a Cast to a number) would fail the whole batch on an empty one.
                    dst[...] = rows_view(buf[0][s.name], s.axis)[0]
                elif src is None:
                    dst[...] = s.pad
                else:
                    dst[...] = src[taken : taken + b - first]
                taken += b - first
        return outputs or None
