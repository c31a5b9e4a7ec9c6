"""Syscalls, epoll wake-ups and HTTP/2 frames per call of the daemon under perf_analyzer, gRPC
and HTTP (the reference), at one concurrency (default 1).

One daemon of the demo model (``benchmarks/grpc_cost.py``'s); for each protocol a warm-up, then
``strace`` attached to every thread of the daemon while perf_analyzer runs one window: with
``-c`` (syscalls per call, the daemon's successes as the divisor) or, with ``--frames``, the
bytes it reads and writes, split into HTTP/2 frames per direction (gRPC only). strace slows
the daemon: read counts, not rates. Needs strace and perf_analyzer (``make perf-analyzer``).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/wire_counts.py [--protocols grpc http]
        [--concurrency 1] [--ms 1500] [--frames]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.grpc_cost import daemon, served  # noqa: E402
from tests import perf_analyzer  # noqa: E402

FRAMES = ("DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING",
          "GOAWAY", "WINDOW_UPDATE", "CONTINUATION")  # fmt: skip
_IO = re.compile(r"^\d+\s+(read|write|recvfrom|sendto)\((\d+), (.*)\) = (\d+)$")


def _load(url: str, protocol: str, c: int, ms: int) -> None:
    try:
        perf_analyzer.run("digits", url, protocol=protocol, concurrency=c, measurement_ms=ms,
                          timeout=300, extra=["-s", "50", "-r", "4"])  # fmt: skip
    except perf_analyzer.PerfAnalyzerError:
        pass  # (no stable window under strace: the counts stand)


def _strace(pid: int, args: list[str], out: Path) -> subprocess.Popen[bytes]:
    argv = ["strace", "-o", str(out), *args]
    for tid in os.listdir(f"/proc/{pid}/task"):
        argv += ["-p", tid]
    proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached
    return proc


def frames_of(trace: Path) -> collections.Counter[tuple[str, str]]:
    """(direction, frame type) counts of the HTTP/2 bytes in an ``strace -xx`` trace."""
    streams: dict[tuple[str, str], bytearray] = collections.defaultdict(bytearray)
    for line in trace.read_text(errors="replace").splitlines():
        m = _IO.match(line)
        if m is None:
            continue
        call, fd, rest, size = m.groups()
        data = b"".join(
            bytes.fromhex(d.replace("\\x", ""))
            for d in re.findall(r'"((?:\\x[0-9a-f]{2})*)"', rest)
        )
        way = "in" if call in ("read", "recvfrom") else "out"
        streams[fd, way] += data[: int(size)]
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for (_, way), buf in streams.items():
        if buf.startswith(b"PRI * HTTP/2.0"):
            buf = buf[24:]
        i = 0
        while i + 9 <= len(buf) and buf[i + 3] < len(FRAMES):
            kind = FRAMES[buf[i + 3]]
            if kind in ("SETTINGS", "PING") and buf[i + 4] & 1:
                kind += "_ACK"
            counts[way, kind] += 1
            i += 9 + int.from_bytes(buf[i : i + 3], "big")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocols", nargs="+", default=["grpc", "http"])
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--ms", type=int, default=1500)
    parser.add_argument("--frames", action="store_true")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="wire-counts-") as tmp,
        daemon(Path(tmp) / "d", "cpu:1x1") as (pid, http, grpc_url),
    ):
        for protocol in args.protocols:
            url = grpc_url if protocol == "grpc" else http.removeprefix("http://")
            _load(url, protocol, args.concurrency, 500)
            trace = Path(tmp) / f"{protocol}.strace"
            how = ["-f", "-e", "trace=read,write,recvfrom,sendto", "-xx", "-s", "1000000"]
            before = served(http)[0]
            proc = _strace(pid, how if args.frames else ["-c", "-f"], trace)
            _load(url, protocol, args.concurrency, args.ms)
            proc.send_signal(signal.SIGINT)
            proc.wait()
            calls = max(1, served(http)[0] - before)
            print(f"== {protocol} c={args.concurrency}: {calls} calls")
            if args.frames:
                for (way, kind), n in sorted(frames_of(trace).items()):
                    print(f"  {way:>3} {kind:<14} {n / calls:6.2f} per call")
                continue
            for line in trace.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 5 and parts[3].isdigit():
                    print(f"  {parts[-1]:<14} {int(parts[3]) / calls:6.2f} per call")


if __name__ == "__main__":
    main()
