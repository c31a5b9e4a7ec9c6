"""The instance process: runs one instance of a python model for the daemon (Triton's stub).

Started as ``python .../stub.py SOCKET_FD SHM_FD RING_BYTES`` by :mod:`.instance`, with a
connected stream socket and the shared-memory file of :mod:`.arena`. It needs numpy and this
package's child-side modules, nothing of the daemon, so a model's own interpreter can run it.

The main thread runs the model and reads the socket itself, with no thread between a request
and ``execute`` (a hop between threads costs ~100 us of GIL hand-over per request): a sync
``execute`` runs one batch at a time; an ``async def execute`` runs on an event loop, a task per
batch, many at once. Whoever waits for the daemon's answer (a BLS call, a call of the API; on
any thread) reads the socket while it waits, under one "pump" lock: answers resolve their
waiters at once, and frames for the model are queued for the main thread. Frames are written
under one lock, from any thread (a decoupled model sends from threads of its own). When the
socket reaches EOF the daemon is gone, and the process exits at once.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a script: no daemon package imported
    import pathlib
    import sys
    import types

    _root = pathlib.Path(__file__).resolve().parent.parent
    del sys.path[0]  # the backend's own directory is no place for a model's imports
    if "model_runtime" not in sys.modules:
        _pkg = types.ModuleType("model_runtime")
        _pkg.__path__ = [str(_root)]
        sys.modules["model_runtime"] = _pkg
    try:
        import numpy  # noqa: F401
    except ImportError as _exc:  # a model's own interpreter without numpy: say so, and end
        import json
        import socket
        import struct

        _text = f"the instance's python ({sys.executable}) cannot import numpy: {_exc}"
        _head = json.dumps({"t": "init_err", "stage": "start", "m": _text, "h": 0}).encode()
        socket.socket(fileno=int(sys.argv[1])).sendall(struct.pack("<II", len(_head), 0) + _head)
        sys.exit(1)

import asyncio
import collections
import itertools
import os
import select
import socket
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

from model_runtime.python_backend import pb_bridge, pb_utils
from model_runtime.python_backend.arena import ChildArena
from model_runtime.python_backend.stacking import check_rows, row_of
from model_runtime.python_backend.stub_batches import merge, take_cancelled
from model_runtime.python_backend.stub_model import ModelHost
from model_runtime.python_backend.stub_process import PumpedFuture, die_with_parent
from model_runtime.python_backend.stub_responses import encode_responses
from model_runtime.python_backend.wire import (
    FRAME,
    Encoder,
    decode_tensors,
    parse_header,
)

__all__ = ["Stub", "main"]

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
#: seconds the ends of batches run one after another may be held to go in one frame
HOLD_S = 0.0005
#: bytes one read of the socket takes at most
_RECV_BYTES = 1 << 20
#: segments one sendmsg takes (Linux's UIO_MAXIOV)
_IOV_MAX = 1024
#: cancellations kept before those of finished requests are dropped (see _forget_finished_cancels)
_CANCELLED_KEPT = 1024


class Stub:
    """The instance process's end of the wire, and the :class:`~.pb_bridge.Bridge` of the API."""

    def __init__(self, sock: socket.socket, arena: ChildArena) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._inbox = bytearray()
        self._view = memoryview(bytearray(_RECV_BYTES))
        self._arena = arena
        self._lock = threading.Lock()  # writing
        self._pump = threading.Lock()  # reading
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[Any] | pb_utils.ResponseIterator] = {}
        self._cancelled: set[int] = set()
        self._deferred: collections.deque[dict[str, Any]] = collections.deque()
        self.loop = asyncio.new_event_loop()
        self.host = ModelHost(self)
        self._async = False
        #: ends of batches (responses, batch id) held back while the main thread runs more
        self._held: list[tuple[list[tuple[int, Any, int]], list[int], int]] = []
        self._holding = False
        self._main = threading.get_ident()

    # -- writing ----------------------------------------------------------------------------

    def _sendall(self, segments: list[bytes | memoryview]) -> None:
        """Write a frame's segments: one ``sendmsg`` when the socket takes them all."""
        views = [memoryview(part).cast("B") for part in segments if len(part)]
        while views:
            try:
                sent = self._sock.sendmsg(views[:_IOV_MAX])
            except BlockingIOError:
                select.select([], [self._sock], [])
                continue
            except OSError:
                os._exit(0)  # the daemon is gone
            while sent:
                n = len(views[0])
                if sent < n:
                    views[0] = views[0][sent:]
                    break
                sent -= n
                del views[0]

    def write(self, header: dict[str, Any], build: Any = None) -> None:
        """Send one frame (after the held ends of batches); ``build(encoder, header)`` places
        tensors under the same lock."""
        with self._lock:
            if self._held:
                self._flush()
            self._write(header, build)

    def _write(self, header: dict[str, Any], build: Any, fast: bool = False) -> None:
        enc = Encoder(self._arena)
        if build is not None:
            build(enc, header)
        self._sendall(enc.finish(header, self._arena.sender.head, fast=fast))

    def respond(
        self, items: list[tuple[int, Any, int]], done: list[int] | None = None, ran: int = 0
    ) -> None:
        """Send responses ``(key, response, flags)`` (and the end of batch ``done``, whose
        execute had batch size ``ran``). The end of a batch that the main thread ran while more
        batches wait for it is held, and sent with theirs in one frame (:meth:`flush`, or
        before any other frame)."""
        if done is not None and self._holding and threading.get_ident() == self._main:
            with self._lock:
                self._held.append((items, done, ran))
            return
        with self._lock:
            if self._held:
                self._flush()
            self._write(self._responses(items, done or [], [ran] if ran else []), self._build, True)

    def flush(self) -> None:
        """Send the ends of batches held back (one frame)."""
        with self._lock:
            if self._held:
                self._flush()

    def _flush(self) -> None:
        items = [item for held, _, _ in self._held for item in held]
        done = [d for _, ds, _ in self._held for d in ds]
        ran = [n for _, _, n in self._held if n]
        self._held.clear()
        self._write(self._responses(items, done, ran), self._build, True)

    def _responses(
        self, items: list[tuple[int, Any, int]], done: list[int], ran: list[int]
    ) -> dict[str, Any]:
        header: dict[str, Any] = {"t": "resp", "_items": items}
        if done:
            header["done"] = done
        if ran:
            header["x"] = ran  # the batch size of each execute that ended
        return header

    def _build(self, enc: Encoder, header: dict[str, Any]) -> None:
        items = header.pop("_items")
        header["items"], together = encode_responses(enc, items, self.host.requested)
        if together is not None:
            header["S"] = together
        cancelled = self._cancelled
        open_ = self.host.requested
        for key, _, flags in items:
            if flags & _FINAL:
                open_.pop(key, None)  # closed: no more responses
                if cancelled:
                    cancelled.discard(key)

    # -- the Bridge of triton_python_backend_utils -------------------------------------------

    def send(self, key: int, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        if not self.host.is_open(key):
            raise pb_bridge.TritonModelException("that request has had its final response")
        self.respond([(key, response, flags)])

    def cancelled(self, key: int) -> bool:
        if not self._pump.locked():
            self.pump(0.0)  # a cancellation may be waiting in the socket
        return key in self._cancelled

    def _bls(self, request: pb_utils.InferenceRequest, k: int, decoupled: bool) -> None:
        def build(enc: Encoder, header: dict[str, Any]) -> None:
            header["T"] = enc.tensors((t.name(), t.as_numpy()) for t in request.inputs())

        header = {
            "t": "bls", "k": k, "m": request.model_name(), "v": request.model_version(),
            "o": request.requested_output_names(), "rq": request.request_id(),
            "c": request.correlation_id(), "f": request.flags(), "to": request.timeout(),
            "p": request.parameters(), "d": decoupled,
        }  # fmt: skip
        self.write(header, build)

    def bls(self, request: pb_utils.InferenceRequest) -> Future[pb_utils.InferenceResponse]:
        k = next(self._ids)
        future: Future[Any] = Future()
        self._pending[k] = future
        self._bls(request, k, False)
        return PumpedFuture(self, future)

    def bls_stream(self, request: pb_utils.InferenceRequest) -> pb_utils.ResponseIterator:
        k = next(self._ids)
        stream = pb_utils.ResponseIterator(self.pump)
        stream.cancel_hook = lambda: self.write({"t": "bls_cancel", "k": k})
        self._pending[k] = stream
        self._bls(request, k, True)
        return stream

    def call(self, op: str, args: dict[str, Any]) -> Any:
        k = next(self._ids)
        future: Future[Any] = Future()
        self._pending[k] = future
        self.write({"t": "call", "k": k, "op": op, "a": args})
        return PumpedFuture(self, future).result()

    def log(self, level: str, message: str) -> None:
        self.write({"t": "log", "l": level, "m": message})

    def metric(self, op: dict[str, Any]) -> None:
        self.write({"t": "metric", **op})

    # -- reading -----------------------------------------------------------------------------

    def pump(self, timeout: float | None, *, idle: bool = False) -> None:
        """Read what the daemon sent (waiting up to ``timeout`` for the first byte, None: for
        ever) and dispatch it. Any thread; a thread that finds another pumping just waits.
        ``idle``: the main thread with nothing to do (it waits less while frames that another
        thread read are queued for it, or while another thread waits for an answer)."""
        if not self._pump.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return
        try:
            if idle and (self._deferred or self._pending):
                timeout = 0.0 if self._deferred else 0.02
            ready, _, _ = select.select([self._sock], [], [], timeout)
            if ready:
                for header, payload in self._read():
                    self._dispatch(header, payload)
        finally:
            self._pump.release()

    def _read(self) -> list[tuple[dict[str, Any], bytes]]:
        inbox = self._inbox
        view = self._view
        while True:
            try:
                # into one buffer kept for it: recv(n) allocates n bytes each call (~27 us at
                # 1 MiB, where a frame is a few hundred bytes)
                n = self._sock.recv_into(view)
            except BlockingIOError:
                break
            except OSError:
                n = 0
            if not n:
                os._exit(0)  # EOF: the daemon is gone, and so are we
            inbox += view[:n]
            if n < len(view):
                break
        frames = []
        pos = 0
        while len(inbox) - pos >= FRAME.size:
            hlen, plen = FRAME.unpack_from(inbox, pos)
            end = pos + FRAME.size + hlen + plen
            if len(inbox) < end:
                break
            start = pos + FRAME.size
            frames.append(
                (parse_header(inbox[start : start + hlen]), bytes(inbox[start + hlen : end]))
            )
            pos = end
        del inbox[:pos]
        return frames

    def _tensors(self, header: dict[str, Any], payload: bytes) -> list[pb_utils.Tensor]:
        descs = header.get("T", [])
        named = decode_tensors(descs, payload, self._arena)
        # the datatype the daemon named (checked by decode_tensors), not found again
        return [
            pb_utils.Tensor(n, a, None if d[1].startswith("TYPE_") else d[1])
            for (n, a), d in zip(named, descs, strict=True)
        ]

    def _unstack(self, descs: Any, items: list[dict[str, Any]], payload: bytes) -> None:
        """Each request of ``items`` (a batch's, or a frame's) sent stacked gets its row of
        the stacked tensors ``descs``."""
        named = decode_tensors(descs, payload, self._arena)
        check_rows(named, len(items))
        given = pb_utils.Tensor.given
        types = [d[1].removeprefix("TYPE_") for d in descs]
        stacked = [(n, a, t) for (n, a), t in zip(named, types, strict=True)]
        for i, item in enumerate(items):
            item["T"] = [given(name, row_of(array, i), dt) for name, array, dt in stacked]

    def _dispatch(self, header: dict[str, Any], payload: bytes) -> None:
        kind = header["t"]
        if kind == "exec":  # batches, each its own execute
            model = header.get("m", "")
            if "S" in header:  # every request of the frame stacked together
                self._unstack(header["S"], [i for b in header["B"] for i in b["r"]], payload)
            for batch in header["B"]:
                if "S" in batch:
                    self._unstack(batch.pop("S"), batch["r"], payload)
                elif "S" not in header:
                    for item in batch["r"]:
                        item["T"] = self._tensors(item, payload)
                batch["t"], batch["m"] = "exec", model
                self._queue_for_model(batch)
            self._arena.consumed(header.get("h", 0))
            return
        if kind == "bls_r":
            header["T"] = self._tensors(header, payload)
        self._arena.consumed(header.get("h", 0))
        if kind == "bls_r":
            self._answer_bls(header)
        elif kind == "call_r":
            future = self._pending.pop(header["k"])
            assert isinstance(future, Future)
            if header.get("e"):
                future.set_exception(pb_bridge.TritonModelException(header["e"]))
            else:
                future.set_result(header.get("v"))
        elif kind == "cancel":
            self._cancelled.update(header["k"])
            if len(self._cancelled) > _CANCELLED_KEPT:
                self._forget_finished_cancels()
        else:
            self._queue_for_model(header)

    def _forget_finished_cancels(self) -> None:
        """Drop the cancellations of requests already finished: a cancel that crossed its
        request's final response on the wire would otherwise stay in the set for good."""
        live = set(self.host.requested)
        for waiting in self._deferred:
            live.update(item["k"] for item in waiting.get("r", ()))
        self._cancelled &= live

    def _queue_for_model(self, header: dict[str, Any]) -> None:
        if self._async:
            self.loop.call_soon_threadsafe(self._handle, header)
        else:
            self._deferred.append(header)

    def _answer_bls(self, header: dict[str, Any]) -> None:
        k = header["k"]
        waiter = self._pending.get(k)
        if waiter is None:
            return  # a call that ended already
        response = None
        if header.get("e") or header.get("T"):
            error = None
            if header.get("e"):
                code, message = header["e"]
                names = pb_utils.TritonError.CODE_NAMES
                number = names.index(code) if code in names else pb_utils.TritonError.INTERNAL
                error = pb_utils.TritonError(message, number)
            response = pb_utils.InferenceResponse(header["T"], error, header.get("p"))
        if isinstance(waiter, Future):
            del self._pending[k]
            waiter.set_result(response or pb_utils.InferenceResponse([]))
            return
        if response is not None:
            waiter.put(response)
        if header.get("fin"):
            del self._pending[k]
            waiter.put(None)

    # -- the main thread ---------------------------------------------------------------------

    def _handle(self, header: dict[str, Any]) -> None:
        if self._cancelled and header["t"] == "exec" and not self._uncancelled(header):
            return
        coro = self.host.handle(header)
        if coro is None:
            return
        if self._async:
            self.loop.create_task(coro)
        else:
            self.loop.run_until_complete(coro)

    def _uncancelled(self, header: dict[str, Any]) -> bool:
        """Answer the requests of exec ``header`` cancelled before their execute (CANCELLED);
        whether any is left to run."""
        dropped = take_cancelled(header, self._cancelled)
        if not dropped:
            return True
        error = pb_utils.TritonError(
            "the request was cancelled before the model ran it", pb_utils.TritonError.CANCELLED
        )
        kept = bool(header["r"])
        self.respond(
            [(k, pb_utils.InferenceResponse(error=error), _FINAL) for k in dropped],
            None if kept else header.get("bs") or [header["b"]],
        )
        return kept

    def _drain(self) -> None:
        """Run the batches that came, holding the ends of those that finish in quick
        succession to send them in one frame: held ends leave before the next batch runs
        unless it (taken to run as long as the last) would still end within ``HOLD_S`` of
        the first of them."""
        deferred = self._deferred
        self._holding = not self._async
        started = time.perf_counter()
        try:
            while deferred:
                header = deferred.popleft()
                if header["t"] == "exec" and self.host.merge_rows:
                    merge(header, deferred, self.host.merge_rows)
                began = time.perf_counter()
                self._handle(header)
                if header.get("a"):
                    self.flush()  # a request that was in a crash: its answer leaves at once
                if not self._async and self.host.is_async:
                    self._async = True  # the model's execute is async: the loop takes over
                    return
                now = time.perf_counter()
                if 2 * now - began - started > HOLD_S:  # (now - started) + (now - began)
                    self.flush()
                    self.pump(0.0)  # cancellations that came meanwhile, before the next runs
                    started = time.perf_counter()
                if not deferred:
                    self.pump(0.0)  # frames that came meanwhile join this round
        finally:
            self._holding = False
            self.flush()

    def serve(self) -> None:
        """Serve until the model is finalized: sync models here, async ones on the loop."""
        while not self.host.finished and not self._async:
            self.pump(None, idle=True)
            self._drain()
        if self.host.finished:
            return
        asyncio.set_event_loop(self.loop)
        self.loop.add_reader(self._sock, self._readable)
        self.loop.call_soon(self._drain)
        self.host.on_finished = self.loop.stop
        self.loop.run_forever()

    def _readable(self) -> None:
        self.pump(0.0)


def main(argv: list[str]) -> int:
    """Run an instance until the daemon finalizes it or goes away."""
    sock_fd, shm_fd, ring_bytes = (int(a) for a in argv[:3])
    die_with_parent()
    stub = Stub(socket.socket(fileno=sock_fd), ChildArena(shm_fd, ring_bytes))
    sys.modules["triton_python_backend_utils"] = pb_utils
    pb_bridge.install(stub)
    stub.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
