"""Issue 46: what one gRPC call over TLS costs the daemon at c=1, next to plaintext, measured on
the daemon itself rather than by throughput (which this shared 2-core host makes noisy).

Two daemons of this checkout serve the demo model, one plaintext and one ``--grpc-use-ssl``
(as ``grpc_transport.py --compare tls`` starts them). For each, alternated ``--pairs`` times,
perf_analyzer runs at concurrency 1 and the probe reads:

- the daemon's CPU per call: its event-loop thread and the whole process, from
  ``/proc/PID/task/TID/schedstat`` (run time in ns, not tick-sampled), over the calls its
  statistics count; and perf_analyzer's (the client's: its TLS is in the call's latency too,
  its start and handshake spread over the run's calls);
- with ``--strace`` (one more run per side, under ``strace -f``, which slows it): the daemon's
  system calls per call, the sizes of its reads and writes on the connection, so the TLS
  records per call (a record adds 22 bytes to what plaintext writes).

It prints the negotiated TLS version, cipher and ALPN first (a Python client; the server
picks the cipher by its own preference). ::

    python benchmarks/grpc_tls_probe.py [--pairs 3] [--seconds 2] [--strace]
"""

from __future__ import annotations

import argparse
import collections
import re
import resource
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.grpc_transport import MODEL, Daemon, daemon, successes  # noqa: E402
from tests import perf_analyzer  # noqa: E402

SIDES = ("plain", "tls")
SYSCALL = re.compile(r"^\d+\s+[\d:.]+\s+(\w+)\(", re.M)
#: A read or write of the gRPC connection (not the loop's 8-byte eventfd wake-ups).
IO = re.compile(r"^\d+\s+[\d:.]+\s+(read|write)\((\d+), .*\) = (\d+)$", re.M)


def negotiated(d: Daemon, ca: Path) -> tuple[str | None, object, str | None]:
    """TLS version, cipher and ALPN protocol a Python client gets from ``d``."""
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    host, port = d.grpc.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        return tls.version(), tls.cipher(), tls.selected_alpn_protocol()


def run_time_ns(pid: int, tid: int | None = None) -> int:
    """CPU time (ns) of process ``pid``'s threads, or of its thread ``tid`` alone."""
    tasks = [tid] if tid is not None else [int(p.name) for p in Path(f"/proc/{pid}/task").iterdir()]
    total = 0
    for t in tasks:
        try:
            total += int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0])
        except OSError:  # a thread that ended meanwhile
            pass
    return total


def c1(d: Daemon, seconds: float) -> bool:
    """One perf_analyzer run at concurrency 1 (False: no stable measurement)."""
    try:
        perf_analyzer.run(
            MODEL, d.grpc, protocol="grpc", concurrency=1, measurement_ms=int(seconds * 1000),
            timeout=300, extra=["-s", "50", "-r", "6", *d.client_args],
        )  # fmt: skip
    except perf_analyzer.PerfAnalyzerError as exc:
        print(f"{d.transport}: {str(exc).splitlines()[-1]}")
        return False
    return True


def client_seconds() -> float:
    """CPU seconds of this process's ended children (perf_analyzer's runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_per_call(d: Daemon, seconds: float) -> tuple[float, float, float]:
    """CPU µs per call over one c=1 run: the daemon's loop thread, the daemon, the client."""
    loop0, all0, client0, n0 = (run_time_ns(d.pid, d.pid), run_time_ns(d.pid), client_seconds(),
                                successes(d))  # fmt: skip
    c1(d, seconds)  # the calls count even where perf_analyzer found no stable throughput
    loop1, all1, client1, n1 = (run_time_ns(d.pid, d.pid), run_time_ns(d.pid), client_seconds(),
                                successes(d))  # fmt: skip
    calls = max(1, n1 - n0)
    return ((loop1 - loop0) / 1e3 / calls, (all1 - all0) / 1e3 / calls,
            (client1 - client0) * 1e6 / calls)  # fmt: skip


def straced(d: Daemon, seconds: float, out: Path) -> None:
    """System calls per call, and the connection's read and write sizes, over one c=1 run."""
    log = out / f"strace-{d.transport}.txt"
    tracer = subprocess.Popen(
        ["strace", "-f", "-tt", "-o", str(log), "-p", str(d.pid)], stderr=subprocess.DEVNULL
    )
    time.sleep(1.0)
    n0 = successes(d)
    c1(d, seconds)
    calls = max(1, successes(d) - n0)
    tracer.send_signal(signal.SIGINT)
    tracer.wait()
    text = log.read_text()
    counts = collections.Counter(SYSCALL.findall(text))
    sizes: dict[str, collections.Counter[int]] = {"read": collections.Counter(),
                                                  "write": collections.Counter()}  # fmt: skip
    for call, _fd, size in IO.findall(text):
        if int(size) != 8:
            sizes[call][int(size)] += 1
    per_call = {k: round(v / calls, 2) for k, v in counts.most_common(8)}
    print(f"{d.transport}: {calls} calls; system calls per call {per_call}")
    for call, seen in sizes.items():
        print(f"  {call} sizes (bytes: times) {dict(seen.most_common(4))}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="perf_analyzer's window")
    parser.add_argument("--pairs", type=int, default=3, help="alternated runs per side")
    parser.add_argument("--devices", default="cpu:2x1", help="each daemon's devices")
    parser.add_argument("--strace", action="store_true", help="also count system calls")
    args = parser.parse_args()
    if perf_analyzer.command() is None:
        print("grpc_tls_probe: perf_analyzer is not installed (make perf-analyzer); skipped")
        return 0
    with tempfile.TemporaryDirectory(prefix="grpc-tls-probe-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        ds = {s: stack.enter_context(daemon(s, work / s, args.devices)) for s in SIDES}
        print("negotiated (version, cipher, ALPN):", negotiated(ds["tls"], work / "tls/pki/ca.pem"))
        got: dict[str, list[tuple[float, float, float]]] = {s: [] for s in SIDES}
        for i in range(args.pairs):
            for side in SIDES if i % 2 == 0 else SIDES[::-1]:
                got[side].append(cpu_per_call(ds[side], args.seconds))
        for side in SIDES:
            runs = got[side]
            loop, whole, client = ([round(r[k]) for r in runs] for k in (0, 1, 2))
            print(f"{side}: CPU µs per call, daemon loop thread {loop}, daemon {whole}, "
                  f"perf_analyzer {client}")  # fmt: skip
        if args.pairs:
            med = {s: [statistics.median(r[k] for r in got[s]) for k in (0, 1, 2)] for s in SIDES}
            d = [med["tls"][k] - med["plain"][k] for k in (0, 1, 2)]
            print(f"tls - plain, medians, µs per call: daemon loop thread {d[0]:+.0f}, daemon "
                  f"{d[1]:+.0f}, perf_analyzer {d[2]:+.0f}")  # fmt: skip
            pairs = [round(t[0] - p[0]) for p, t in zip(got["plain"], got["tls"], strict=True)]
            print(f"tls - plain, daemon loop thread, each pair: {pairs}")
        if args.strace:
            if shutil.which("strace") is None:
                print("strace is not installed: no system call counts")
            else:
                for side in SIDES:
                    straced(ds[side], args.seconds, work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
