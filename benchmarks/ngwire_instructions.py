"""Instructions per unary gRPC call of the nghttp2 transport alone (needs valgrind).

The transport's share of a call's CPU is small beside a noisy host's swings, so this counts
instructions instead: 16 connections of :class:`~model_runtime.server.grpc.h2proto.H2Protocol`
(fake transports, nothing written to a socket) are each fed one ModelInfer call per round as a
gRPC client sends it (a window update and a BDP ping for the last answer, HEADERS of nine
fields indexed in HPACK's dynamic table, one DATA of a 3.2 kB message), taken by a stub fast
path (:class:`~model_runtime.server.grpc.h2callbacks.FastCalls`) that answers a canned message
on the next turn of the loop (``START_HEADERS``, 65 bytes, ``OK``), under
``valgrind --tool=callgrind`` with instrumentation on only for ``--rounds`` rounds after a
warm-up (frames built beforehand). Prints callgrind's instructions per call. About 40 s.

    .venv/bin/python benchmarks/ngwire_instructions.py [--rounds 100]
    .venv/bin/python benchmarks/ngwire_instructions.py --wall   # process CPU µs, no valgrind
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONNECTIONS = 16
PATH = b"/inference.GRPCInferenceService/ModelInfer"
FIELDS = [
    (b":authority", b"127.0.0.1:8001"), (b":path", PATH),
    (b"content-type", b"application/grpc"),
    (b"user-agent", b"grpc-c++/1.67.1 grpc-c/44.0.0 (linux; chttp2)"), (b"te", b"trailers"),
    (b"grpc-accept-encoding", b"identity, deflate, gzip"), (b"accept-encoding", b"identity, gzip"),
]  # fmt: skip
#: The first call's header block (literals indexed into the dynamic table) and the next ones'
#: (POST, http, then each field by its dynamic-table index, newest first).
FIRST = b"\x83\x86" + b"".join(
    b"\x40" + bytes([len(n)]) + n + bytes([len(v)]) + v for n, v in FIELDS
)
LATER = b"\x83\x86" + bytes(0x80 | (62 + len(FIELDS) - 1 - i) for i in range(len(FIELDS)))
MESSAGE = b"\0" + struct.pack(">I", 3200) + b"x" * 3200
ANSWER = b"\0" + struct.pack(">I", 60) + b"y" * 60


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


class _Fast:
    """Takes every ModelInfer call and answers it on the next turn of the loop."""

    path = PATH
    max_wait = 16 << 10

    def __init__(self) -> None:
        from model_runtime.server.grpc.call import OK, START_HEADERS

        self.headers, self.trailers = START_HEADERS, OK  # (imported once, not per call)

    def start(self, conn: Any, stream: Any) -> bool:
        conn.taken(stream)
        stream.ended_call = _nothing
        conn.loop.call_soon(stream.answer, self.headers, ANSWER, self.trailers, False)
        return True


def _nothing() -> None:
    pass


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 5555)

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


async def drive(
    rounds: int,
    callgrind: bool,
    connections: int = CONNECTIONS,
    per_read: int = 1,
    ping: bool = True,
) -> float:
    """Process CPU µs per call over ``rounds`` rounds (0 under callgrind): each round, each of
    ``connections`` connections reads ``per_read`` calls in one read (with a window update
    per call before, and a BDP ping if ``ping``), answered together a turn later."""
    from model_runtime.server.grpc import ngserver  # noqa: F401  (its header arrays)
    from model_runtime.server.grpc.h2proto import H2Protocol, ProtocolLimits

    async def app(*_: Any) -> None:
        raise RuntimeError("every call goes the fast way here")

    limits = ProtocolLimits(
        app, max_streams=256, idle_timeout=75, write_timeout=10, max_connections=1024,
        fast=_Fast(),
    )  # fmt: skip
    settings_ack = frame(4, 0, 0) + frame(4, 1, 0)
    conns = []
    for _ in range(connections):
        conn = H2Protocol(limits)
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        conn.data_received(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings_ack)
        conns.append(conn)
    next_id = 1

    def calls(count: int, first: bool = False) -> list[list[bytes]]:
        nonlocal next_id
        out = []
        for _ in range(count):
            read = b""
            for i in range(1 if first else per_read):
                s, next_id = next_id, next_id + 2
                if not first:  # (the client's window updates for an answer it read)
                    read += frame(8, 0, 0, struct.pack(">I", 200))
                    if ping and i == 0:
                        read += frame(6, 0, 0, b"12345678")
                block = FIRST if first else LATER
                read += frame(1, 4, s, block) + frame(0, 1, s, MESSAGE)
            out.append([read] * connections)
        return out

    async def run(batches: list[list[bytes]]) -> None:
        for batch in batches:
            for conn, data in zip(conns, batch, strict=True):
                conn.data_received(data)
            for _ in range(3):
                await asyncio.sleep(0)

    await run(calls(1, first=True))
    await run(calls(50))
    batches = calls(rounds)
    if callgrind:
        _instrument("on")  # (blocking on purpose: nothing may run meanwhile)
        await run(batches)
        _instrument("off")
        cpu = 0.0
    else:
        began = time.process_time()
        await run(batches)
        cpu = (time.process_time() - began) / (rounds * connections * per_read) * 1e6
    assert all(not conn.streams for conn in conns), "calls left open"
    return cpu


def _instrument(switch: str) -> None:
    """Turn callgrind's instrumentation of this process on or off."""
    command = ["callgrind_control", "-i", switch, str(os.getpid())]
    subprocess.run(command, check=True, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--wall", action="store_true", help="process CPU, no valgrind")
    parser.add_argument(
        "--shape", choices=["one", "perf_analyzer"], default="one",
        help="one: 16 connections, a call a read, a BDP ping each; perf_analyzer: its gRPC "
        "shape at c=16 (3 connections, 3 calls a read, no ping)",
    )  # fmt: skip
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import uvloop

    shape = {"one": (CONNECTIONS, 1, True), "perf_analyzer": (3, 3, False)}[args.shape]
    if args.inner or args.wall:
        cpu = uvloop.run(drive(args.rounds, args.inner, *shape))
        if args.wall:
            print(f"{cpu:.1f} µs of process CPU per call")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={Path(tmp) / 'cg.out'}", sys.executable, __file__, "--inner",
             "--rounds", str(args.rounds), "--shape", args.shape],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    collected = int(re.search(r"Collected : (\d+)", out.stderr).group(1))  # type: ignore[union-attr]
    print(f"{collected / (args.rounds * shape[0] * shape[1]):,.0f} instructions per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
