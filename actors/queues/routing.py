"""Outputs back to callers: split a completed batch's rows to its requests, or fail them; stamp
the times of traced requests.

Each function returns what it closed, ``(samples, requests)``, so the queue can keep its
pending figures without a call per request. A request is closed exactly once: when it is
answered, or when it is found gone (its future done) with rows still in a batch.
"""

from __future__ import annotations

from asyncio import InvalidStateError
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter

import numpy as np

from actors.queues.batch import Batch
from actors.queues.pool import Layout, rows_view
from actors.queues.request import Request

__all__ = ["fail_batch", "fail_requests", "route_outputs", "stamp"]

_T_SUBMIT = attrgetter("t_submit")


def _views(
    layout: Layout, out: Mapping[str, np.ndarray], row: int, count: int
) -> dict[str, np.ndarray]:
    res: dict[str, np.ndarray] = {}
    for s in layout.outputs:
        a = out[s.name]
        if s.axis is None:
            res[s.name] = a.copy()
        elif s.axis == 0:
            res[s.name] = a[row : row + count]
        else:
            res[s.name] = np.moveaxis(np.moveaxis(a, s.axis, 0)[row : row + count], 0, s.axis)
    return res


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return (
        a.shape == b.shape
        and a.strides == b.strides
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    )


def _accumulate(
    layout: Layout, req: Request, out: Mapping[str, np.ndarray], start: int, row: int, count: int
) -> bool:
    """Copy one segment's rows into the request's result; True when all its rows are in."""
    res = req._result
    if res is None:
        given = req.outputs or {}
        res = req._result = {}
        for s in layout.outputs:
            buf = given.get(s.name)
            if buf is None and s.axis is not None:
                shape = s.shape_with_rows(req.samples)
                if -1 in shape:  # a dynamic output: its size is this batch's
                    got = out[s.name].shape
                    shape = (*got[: s.axis], req.samples, *got[s.axis + 1 :])
                buf = np.empty(shape, dtype=s.dtype)
            if buf is not None:
                res[s.name] = buf
    for s in layout.outputs:
        if s.axis is not None:
            dst = rows_view(res[s.name], s.axis)[start : start + count]
            src = rows_view(out[s.name], s.axis)[row : row + count]
            if not _same_memory(dst, src):  # the device wrote there itself (outputs_into)
                dst[...] = src
    req._done += count
    if req._done < req.samples:
        return False
    for s in layout.outputs:
        if s.axis is None:
            if s.name in res:
                np.copyto(res[s.name], out[s.name])
            else:
                res[s.name] = out[s.name].copy()
    return True


def route_outputs(
    layout: Layout,
    batch: Batch,
    outputs: Sequence[Mapping[str, np.ndarray]],
    submits: list[float],
    packed: list[float],
) -> tuple[int, int]:
    """Resolve the futures of the requests whose last rows were in ``batch``.

    A request wholly inside one segment, without caller buffers, gets views of ``outputs``;
    others are assembled (into their buffers, or a fresh array). Padding rows go nowhere, or
    to the flush callback's buffers. Appends each answered request's submit and packing times
    to ``submits``/``packed``.

    Raises:
        KeyError, IndexError, ValueError: ``outputs`` does not match the model's outputs.
    """
    if batch.plain is not None:
        return _route_plain(layout, batch, batch.plain, outputs[0], submits, packed)
    fast = layout.fast_output
    # One-row answers are rows of one view with a row axis per row (cheaper per row than a
    # slice each), worth making for a batch of a few requests or more. Indexed, not iterated:
    # an array's iteration ends in a formatted IndexError.
    listed = len(batch.segments) > 2
    row_lists: list[np.ndarray | None] = [None] * layout.I
    closed_samples = closed = 0
    for req, start, k, row, count in batch.segments:
        fut = req.future
        if fut.done():
            if req._open:
                req._open = False
                closed_samples += req.samples
                closed += 1
            continue
        if count == req.samples and req.outputs is None:
            if fast is None:
                fut.set_result(_views(layout, outputs[k], row, count))
            elif count == 1 and listed:
                rows = row_lists[k]
                if rows is None:
                    rows = row_lists[k] = outputs[k][fast][:, None]
                fut.set_result({fast: rows[row]})
            else:
                fut.set_result({fast: outputs[k][fast][row : row + count]})
        elif _accumulate(layout, req, outputs[k], start, row, count):
            assert req._result is not None
            fut.set_result(req._result)
        else:
            continue
        req._open = False
        closed_samples += req.samples
        closed += 1
        submits.append(req.t_submit)
        packed.append(req._t_packed)
    if batch.flush_outputs:
        _route_padding(layout, batch, outputs, batch.flush_outputs)
    return closed_samples, closed


def _route_plain(
    layout: Layout,
    batch: Batch,
    plain: list[Request],
    out: Mapping[str, np.ndarray],
    submits: list[float],
    packed: list[float],
) -> tuple[int, int]:
    """:func:`route_outputs` for a plain batch: request i gets row i. Each of its requests is
    closed here (this batch holds all its rows), the gone ones too."""
    n = len(plain)
    fast = layout.fast_output
    gone: list[Request] = []
    if fast is not None:
        rows = _row_views(out, fast, n)
        for i, req in enumerate(plain):
            try:
                req.future.set_result({fast: rows[i]})
            except InvalidStateError:  # the caller is gone (cancelled, or past its deadline)
                gone.append(req)
    elif layout.row_outputs is not None:  # several outputs, each one slice (not one per row)
        first, *others = layout.row_outputs
        rows = _row_views(out, first, n)
        answers = [{first: rows[i]} for i in range(n)]
        for name in others:
            rows = _row_views(out, name, n)
            for i, answer in enumerate(answers):
                answer[name] = rows[i]
        for req, answer in zip(plain, answers, strict=True):
            try:
                req.future.set_result(answer)
            except InvalidStateError:
                gone.append(req)
    else:
        for i, req in enumerate(plain):
            fut = req.future
            if fut.done():
                gone.append(req)
            else:
                fut.set_result(_views(layout, out, i, 1))
    # The statistics are of answered requests.
    times = [r.t_submit for r in plain if r not in gone] if gone else list(map(_T_SUBMIT, plain))
    submits += times
    packed += [batch.t_packed] * len(times)
    if batch.flush_outputs:
        _route_padding(layout, batch, [out], batch.flush_outputs)
    return n, n


def _row_views(out: Mapping[str, np.ndarray], name: str, n: int) -> np.ndarray:
    """The first ``n`` rows of output ``name`` (row axis 0) with a row axis each: ``rows[i]``
    is row i's view (indexed, not iterated: an array's iteration ends in a formatted
    IndexError, a few thousand instructions a batch).

    Raises:
        KeyError: no output ``name``.
        IndexError: the output has fewer than ``n`` rows.
    """
    rows = out[name][:n, None]
    if len(rows) < n:
        raise IndexError(f"output {name!r} has {len(rows)} rows, the batch {n}")
    return rows


def _route_padding(
    layout: Layout,
    batch: Batch,
    outputs: Sequence[Mapping[str, np.ndarray]],
    targets: Mapping[str, np.ndarray],
) -> None:
    b = layout.B
    for s in layout.outputs:
        dst = targets.get(s.name)
        if dst is None:
            continue
        if s.axis is None:
            np.copyto(dst, outputs[-1][s.name])
            continue
        rows, taken = rows_view(dst, s.axis), 0
        for k in range(batch.valid_rows // b, layout.I):
            first = batch.valid_rows - k * b if k == batch.valid_rows // b else 0
            rows[taken : taken + b - first] = rows_view(outputs[k][s.name], s.axis)[first:]
            taken += b - first


def fail_batch(batch: Batch, error: BaseException) -> tuple[int, int]:
    """Fail every request with rows in ``batch`` that is not answered yet, once."""
    return fail_requests((seg[0], error) for seg in batch.segments)


def fail_requests(failures: Iterable[tuple[Request, BaseException]]) -> tuple[int, int]:
    """Answer each request not answered yet with its error; close each once."""
    closed_samples = closed = 0
    for req, error in failures:
        if not req.future.done():
            req.future.set_exception(error)
        if req._open:
            req._open = False
            closed_samples += req.samples
            closed += 1
    return closed_samples, closed


def stamp(batch: Batch, t_start: float, t_end: float, t_out: float) -> None:
    """Hand the traced requests of ``batch`` its times (only while tracing is on)."""
    requests = batch.plain if batch.plain is not None else [s[0] for s in batch.segments]
    for req in requests:
        trace = req.trace
        if trace is not None:
            trace.computed(req._t_packed, t_start, t_end, t_out)
