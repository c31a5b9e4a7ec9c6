"""The floor under the daemon's HTTP path: the least a Python server on uvloop does per binary
infer request of the demo model, to compare with :mod:`http_cost`'s figures.

One ``asyncio.Protocol`` per connection: it finds the head's end and its two lengths, takes the
request's row from the body (``np.frombuffer``, no copy), gathers the rows of every request read
in one loop iteration into one batch for a worker thread (onnxruntime, as the daemon's device
threads), and writes each answer as a prebuilt head and the output's bytes. No admission, no
validation, no statistics, no timeouts, no access log: what is left is what any Python path
pays (the transport's callbacks, the hop to the worker and back, the bytes in and out), so
``http_cost``'s figure minus this one is what our pipeline adds, and this one is what a compiled
protocol path (C or Rust parsing and writing, batches handed over in C) could still take off.

    .venv/bin/python benchmarks/http_floor.py --port 8000   # serves until SIGINT/SIGTERM
    .venv/bin/python benchmarks/http_floor.py --measure [--callgrind] [--requests 3000]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import http_cost

_OK = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n"
    b"Inference-Header-Content-Length: %d\r\n\r\n"
)
_READY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


class _Batcher:
    """Rows of one loop iteration, run as one batch by a worker thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, model: Path) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        out = self.session.get_outputs()[0].name
        header = b'{"model_name":"digits","model_version":"1","outputs":[{"name":"%s",' % (
            out.encode()
        )
        header += b'"datatype":"FP32","shape":[1,10],"parameters":{"binary_data_size":40}}]}'
        self.header = header
        self.loop = loop
        self.rows: list[np.ndarray] = []
        self.conns: list[_Conn] = []
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._work, daemon=True).start()

    def add(self, conn: _Conn, row: np.ndarray) -> None:
        if not self.rows:
            self.loop.call_soon(self._seal)
        self.rows.append(row)
        self.conns.append(conn)

    def _seal(self) -> None:
        rows, conns, self.rows, self.conns = self.rows, self.conns, [], []
        self.jobs.put((np.stack(rows), conns))

    def _work(self) -> None:
        while True:
            x, conns = self.jobs.get()
            y = self.session.run(None, {self.input: x})[0]
            self.loop.call_soon_threadsafe(self._answer, y, conns)

    def _answer(self, y: np.ndarray, conns: list[_Conn]) -> None:
        header = self.header
        head = _OK % (len(header) + 40, len(header)) + header
        for i, conn in enumerate(conns):
            conn.transport.write(head + y[i].tobytes())


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
            if buf.startswith(b"GET", pos):
                self.transport.write(_READY)
            else:
                at = buf.find(b"\r\nInference-Header-Content-Length: ", pos, end)
                json_length = int(buf[at + 35 : buf.find(b"\r", at + 2, end + 2)])
                count = (length - json_length) // 4
                row = np.frombuffer(buf, np.float32, count, start + json_length)
                self.batcher.add(self, row)
            pos = start + length
        self.buf = buf[pos:]


async def _serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    batcher = _Batcher(loop, http_cost.MODEL)
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
        cmd = [sys.executable, __file__, "--port", str(port)]
        if args.callgrind:
            cmd[:0] = [
                "valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                f"--callgrind-out-file={out}",
            ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
            client = [sys.executable, http_cost.__file__, "--client", str(port), "binary", "16"]
            subprocess.run([*client, str(args.warmup)], check=True, capture_output=True)
            control = ["callgrind_control", "-i"]
            if args.callgrind:
                subprocess.run([*control, "on", str(proc.pid)], check=True, capture_output=True)
            loop0 = http_cost._cpu(proc.pid, proc.pid)
            subprocess.run([*client, str(args.requests)], check=True, capture_output=True)
            loop1 = http_cost._cpu(proc.pid, proc.pid)
            if args.callgrind:
                subprocess.run([*control, "off", str(proc.pid)], check=True, capture_output=True)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        if args.callgrind:
            text = Path(f"{out}-01").read_text(errors="replace")
            found = re.search(r"^totals: (\d+)", text, re.M)
            per = int(found.group(1)) / args.requests if found else 0
            print(f"floor binary c=16: loop {per:9.0f} instructions/req (callgrind)")
        else:
            print(f"floor binary c=16: loop {(loop1 - loop0) / args.requests * 1e6:6.1f} us/req")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int)
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--warmup", type=int, default=1000)
    args = parser.parse_args()
    if args.measure:
        _measure(args)
        return
    import uvloop

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    uvloop.run(_serve(args.port))


if __name__ == "__main__":
    main()
