"""The floor under the daemon's HTTP path: the least a Python server on uvloop does per infer
request of the demo model (binary or JSON), to compare with :mod:`http_cost`'s figures.

One ``asyncio.Protocol`` per connection: it finds the head's end and its two lengths, takes the
request's row from the body (``np.frombuffer``, no copy; a JSON body: ``orjson.loads`` and
``np.array`` of its ``data``), gathers the rows of every request read in one loop iteration into
one batch for a worker thread (onnxruntime, as the daemon's device threads), and writes each
answer as a prebuilt head and its outputs' bytes (every output, as the daemon answers). No
admission, no validation, no statistics, no timeouts, no access log: what is left is what any
Python path pays (the transport's callbacks, the hop to the worker and back, the bytes in and
out), so ``http_cost``'s figure minus this one is what our pipeline adds, and this one is what a
compiled protocol path (C or Rust parsing and writing, batches handed over in C) could still
take off.

    .venv/bin/python benchmarks/http_floor.py --port 8000   # serves until SIGINT/SIGTERM
    .venv/bin/python benchmarks/http_floor.py --measure [--callgrind] [--requests 3000]
        [--mode binary|json] [--runner] [--clients 16]

``--measure`` prints the loop's CPU (or instructions) per request and the requests per batch.
``--runner``: the rows go to the data plane's ``ModelRunner`` (the daemon's runner config: its
queue, batching, session and device actors) instead of the list and worker thread above, each
answered from its future's done callback: the floor plus what the data plane costs, so the
daemon's figure minus this one is what its HTTP front end and the plane's REST side add.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import http_cost

_OK = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n"
    b"Inference-Header-Content-Length: %d\r\n\r\n"
)
_OK_JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
_READY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
_COUNTS = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"


class _Batcher:
    """Rows of one loop iteration, run as one batch by a worker thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, model: Path) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.loop = loop
        self._frame([o.name for o in self.session.get_outputs()])
        self.rows: list[np.ndarray] = []
        self.conns: list[_Conn] = []
        self.json: list[bool] = []
        self.batches = self.answered = 0
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._work, daemon=True).start()

    def _frame(self, outputs: list[str]) -> None:
        """The answer's JSON header for ``outputs`` (every one of the model's, as the daemon
        answers them: FP32, 10 per row, as binary data)."""
        self.outputs = outputs
        tensors = b",".join(
            b'{"name":"%s","datatype":"FP32","shape":[1,10],"parameters":{"binary_data_size":40}}'
            % name.encode()
            for name in outputs
        )
        self.header = b'{"model_name":"digits","model_version":"1","outputs":[%s]}' % tensors

    def add(self, conn: _Conn, row: np.ndarray, json: bool = False) -> None:
        if not self.rows:
            self.loop.call_soon(self._seal)
        self.rows.append(row)
        self.conns.append(conn)
        self.json.append(json)

    def _seal(self) -> None:
        rows, conns, json = self.rows, self.conns, self.json
        self.rows, self.conns, self.json = [], [], []
        self.batches += 1
        self.jobs.put((np.stack(rows), conns, json))

    def _work(self) -> None:
        while True:
            x, conns, json = self.jobs.get()
            ys = self.session.run(None, {self.input: x})
            self.loop.call_soon_threadsafe(self._answer, ys, conns, json)

    def _answer(self, ys: list[np.ndarray], conns: list[_Conn], json: list[bool]) -> None:
        header = self.header
        head = _OK % (len(header) + 40 * len(ys), len(header)) + header
        self.answered += len(conns)
        for i, conn in enumerate(conns):
            if json[i]:
                tensors = [
                    {"name": name, "datatype": "FP32", "shape": [1, 10], "data": y[i]}
                    for name, y in zip(self.outputs, ys, strict=True)
                ]
                doc = {"model_name": "digits", "model_version": "1", "outputs": tensors}
                body = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
                conn.transport.write(_OK_JSON % len(body) + body)
            else:
                conn.transport.write(b"".join([head, *(y[i].tobytes() for y in ys)]))


class _RunnerBatcher(_Batcher):
    """Rows queued one by one on a :class:`ModelRunner`, each answered when its future is."""

    def __init__(self, loop: asyncio.AbstractEventLoop, runner: Any) -> None:
        self.runner = runner
        self.loop = loop
        self._frame(_output_names())
        self.answered = 0

    @property
    def batches(self) -> int:  # type: ignore[override]
        return sum(sum(s.runs_by_size.values()) for s in self.runner.replica_states())

    def add(self, conn: _Conn, row: np.ndarray, json: bool = False) -> None:
        pending = self.runner.execute_async({http_cost.INPUT: row.reshape(1, -1)})
        future = pending if isinstance(pending, asyncio.Future) else asyncio.ensure_future(pending)
        future.add_done_callback(lambda f: self._one(conn, json, f.result()))

    def _one(self, conn: _Conn, json: bool, outputs: dict[str, np.ndarray]) -> None:
        self._answer([outputs[name] for name in self.outputs], [conn], [json])


def _output_names() -> list[str]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(http_cost.MODEL), providers=["CPUExecutionProvider"])
    return [o.name for o in session.get_outputs()]


class _Conn(asyncio.Protocol):
    def __init__(self, batcher: _Batcher) -> None:
        self.batcher = batcher
        self.buf = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos = 0
        while True:
            end = buf.find(b"\r\n\r\n", pos)
            if end < 0:
                break
            at = buf.find(b"\r\nContent-Length: ", pos, end)
            length = int(buf[at + 18 : buf.find(b"\r", at + 2, end + 2)]) if at >= 0 else 0
            start = end + 4
            if len(buf) < start + length:
                break
            at = buf.find(b"\r\nInference-Header-Content-Length: ", pos, end)
            if buf.startswith(b"GET /counts", pos):
                counts = b"%d %d" % (self.batcher.batches, self.batcher.answered)
                self.transport.write(_COUNTS % (len(counts), counts))
            elif buf.startswith(b"GET", pos):
                self.transport.write(_READY)
            elif at < 0:  # JSON: the data array of the one input, as floats
                doc = orjson.loads(buf[start : start + length])
                row = np.array(doc["inputs"][0]["data"], np.float32)
                self.batcher.add(self, row, True)
            else:
                json_length = int(buf[at + 35 : buf.find(b"\r", at + 2, end + 2)])
                count = (length - json_length) // 4
                row = np.frombuffer(buf, np.float32, count, start + json_length)
                self.batcher.add(self, row)
            pos = start + length
        self.buf = buf[pos:]


async def _serve(port: int, runner: bool = False) -> None:
    loop = asyncio.get_running_loop()
    if not runner:
        await _listen(loop, port, _Batcher(loop, http_cost.MODEL))
        return
    from model_runtime.compiler import CompileOptions, compile_model
    from model_runtime.runner import ModelRunner
    from model_runtime.server.daemon.options import DaemonOptions

    opts = DaemonOptions()  # the daemon's batch size and runner config
    cache = os.environ.get("MODEL_RUNTIME_DIR", tempfile.gettempdir())
    options = CompileOptions(batch_size=opts.batch_size, executable_cache_path=cache)
    exe = compile_model(http_cost.MODEL, options=options)
    async with ModelRunner(exe, opts.runner) as model:
        await _listen(loop, port, _RunnerBatcher(loop, model))


async def _listen(loop: asyncio.AbstractEventLoop, port: int, batcher: _Batcher) -> None:
    server = await loop.create_server(lambda: _Conn(batcher), "127.0.0.1", port)
    stop = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set_result, None)
    await stop
    server.close()


def _measure(args: argparse.Namespace) -> None:
    """Serve under callgrind (or not), drive it as http_cost does, print the figures."""
    port = http_cost._free_port()
    with tempfile.TemporaryDirectory(prefix="http-floor-") as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [sys.executable, __file__, "--port", str(port), *(["--runner"] * args.runner)]
        if args.callgrind:
            cmd[:0] = [
                "valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                f"--callgrind-out-file={out}",
            ]  # fmt: skip
        env = {**os.environ, "MODEL_RUNTIME_DIR": tmp}  # (the runner's device locks)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("the floor server did not start") from None
                    time.sleep(0.2)
            mode = args.mode
            client = [sys.executable, http_cost.CLIENTS, str(port), mode]
            client.append(str(args.clients))
            subprocess.run([*client, str(args.warmup)], check=True, capture_output=True)
            control = ["callgrind_control", "-i"]
            if args.callgrind:
                subprocess.run([*control, "on", str(proc.pid)], check=True, capture_output=True)
            batches0, _ = _counts(port)
            loop0 = http_cost._cpu(proc.pid, proc.pid)
            subprocess.run([*client, str(args.requests)], check=True, capture_output=True)
            loop1 = http_cost._cpu(proc.pid, proc.pid)
            batches1, _ = _counts(port)
            if args.callgrind:
                subprocess.run([*control, "off", str(proc.pid)], check=True, capture_output=True)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        if args.callgrind:
            text = Path(f"{out}-01").read_text(errors="replace")
            found = re.search(r"^totals: (\d+)", text, re.M)
            per = int(found.group(1)) / args.requests if found else 0
            figure = f"{per:9.0f} instructions/req (callgrind)"
        else:
            figure = f"{(loop1 - loop0) / args.requests * 1e6:6.1f} us/req"
        per_batch = args.requests / max(batches1 - batches0, 1)
        what = "floor+runner" if args.runner else "floor"
        print(f"{what} {mode} c={args.clients}: loop {figure}  {per_batch:5.1f} req/batch")


def _counts(port: int) -> tuple[int, int]:
    """The floor server's batches and answers so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/counts", timeout=30) as r:
        batches, answered = r.read().split()
    return int(batches), int(answered)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int)
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--mode", choices=["binary", "json"], default="binary")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--runner", action="store_true", help="batch on the data plane's runner")
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--warmup", type=int, default=1000)
    args = parser.parse_args()
    if args.measure:
        _measure(args)
        return
    import uvloop

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    uvloop.run(_serve(args.port, args.runner))


if __name__ == "__main__":
    main()
