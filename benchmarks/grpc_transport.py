"""Issue 46: the daemon's gRPC on its two transports, ``--grpc-transport native`` (h2corn)
against ``aio`` (grpcio's asyncio server), and the default transport (nghttp2) over TLS
(``--grpc-use-ssl``) against it in plaintext, driven by perf_analyzer over gRPC.

Each compared side is a daemon of this checkout serving the demo model (devices and device
locks of its own); for each concurrency the two are measured one after the other, ``--pairs``
times, alternating which goes first, so that a busy host costs both alike. Per run: perf_analyzer's
throughput and p99, the daemon's CPU per inference (``/proc/PID/stat`` user + system time
over the successes its statistics count) and perf_analyzer's (its process's CPU over the same
successes: a client's TLS is in it). Prints a table of medians with the ratio of the second to
the first, each pair's ratio (the runs of one pair are back to back), and writes
``benchmarks/results/grpc_transport.json`` (``grpc_tls.json`` for ``--compare tls``).

    python benchmarks/grpc_transport.py [--compare transports|tls] [--seconds 2] [--pairs 2]
        [--concurrency 1 16 64]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.peers import servers  # noqa: E402
from model_runtime.demo import DEMO_ONNX_PATH  # noqa: E402
from tests import perf_analyzer  # noqa: E402
from tests.pki import write_pki  # noqa: E402

MODEL = "digits"
#: What ``--compare`` sets against what: the two sides, first the reference.
COMPARISONS = {"transports": ("aio", "native"), "tls": ("plain", "tls")}


@dataclass
class Daemon:
    transport: str  #: the side's name: aio, native, plain, tls
    pid: int
    http: str
    grpc: str
    client_args: tuple[str, ...] = ()  #: perf_analyzer's extra arguments for this side


def side_args(side: str, workdir: Path) -> tuple[list[str], tuple[str, ...]]:
    """The daemon's and perf_analyzer's extra arguments for ``side``."""
    if side in ("aio", "native"):
        return ["--grpc-transport", side], ()
    if side == "plain":
        return [], ()
    pki = write_pki(workdir / "pki")
    daemon_args = ["--grpc-use-ssl", "--grpc-server-cert",
                   str(pki["server"]), "--grpc-server-key", str(pki["server_key"])]  # fmt: skip
    return daemon_args, (
        "--ssl-grpc-use-ssl", "--ssl-grpc-root-certifications-file", str(pki["ca"]),
    )  # fmt: skip


@contextmanager
def daemon(side: str, workdir: Path, devices: str) -> Iterator[Daemon]:
    """This checkout's daemon serving the demo model, its gRPC as ``side`` has it."""
    http_port, grpc_port = servers.free_port(), servers.free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    daemon_args, client_args = side_args(side, workdir)
    shutil.copy(DEMO_ONNX_PATH, workdir / f"{MODEL}.onnx")
    cmd = [
        sys.executable, "-m", "model_runtime.server", "--port", str(http_port),
        "--grpc-port", str(grpc_port), "--metrics-port", "0", "--no-access-log",
        "--log-format", "json", *daemon_args,
        "--executable-cache", str(workdir / "cache"), f"{MODEL}={workdir / f'{MODEL}.onnx'}",
    ]  # fmt: skip
    env = {"MODEL_RUNTIME_DEVICES": devices, "MODEL_RUNTIME_DIR": str(workdir / "run"),
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    base = f"http://127.0.0.1:{http_port}"
    ready = f"{base}/v2/models/{MODEL}/ready"
    with servers.serve(f"daemon ({side})", cmd, env, ready, workdir / "daemon.log") as proc:
        yield Daemon(side, proc.pid, base, f"127.0.0.1:{grpc_port}", client_args)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def successes(d: Daemon) -> int:
    with urllib.request.urlopen(f"{d.http}/v2/models/{MODEL}/stats", timeout=10) as resp:
        doc = json.load(resp)
    return int(doc["model_stats"][0]["inference_stats"]["success"]["count"])


def client_seconds() -> float:
    """CPU seconds of this process's ended children (perf_analyzer's runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(d: Daemon, concurrency: int, seconds: float) -> dict[str, float] | None:
    """One perf_analyzer run (None: it found no stable measurement on this busy host)."""
    cpu0, n0, client0 = cpu_seconds(d.pid), successes(d), client_seconds()
    try:
        r = perf_analyzer.run(
            MODEL, d.grpc, protocol="grpc", concurrency=concurrency,
            measurement_ms=int(seconds * 1000), timeout=300,
            extra=["-s", "50", "-r", "6", *d.client_args],
        )  # fmt: skip
    except perf_analyzer.PerfAnalyzerError as exc:
        print(f"{d.transport} c={concurrency}: {str(exc).splitlines()[0]}")
        print("\n".join(str(exc).splitlines()[-4:]))
        return None
    cpu1, n1, client1 = cpu_seconds(d.pid), successes(d), client_seconds()
    calls = max(1, n1 - n0)
    return {
        "throughput": r.throughput,
        "p99_us": r.p99_us,
        "cpu_us_per_infer": (cpu1 - cpu0) * 1e6 / calls,
        "client_us_per_infer": (client1 - client0) * 1e6 / calls,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="perf_analyzer's window")
    parser.add_argument("--pairs", type=int, default=2, help="alternated runs per point")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--devices", default="cpu:2x1", help="each daemon's devices")
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="transports")
    args = parser.parse_args()
    sides = COMPARISONS[args.compare]
    first, second = sides
    if perf_analyzer.command() is None:
        print("grpc_transport: perf_analyzer is not installed (make perf-analyzer); skipped")
        return 0
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    #: Each pair's ratio (second / first throughput) per concurrency, where both sides ran.
    pairs: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="grpc-transport-") as tmp, ExitStack() as stack:
        daemons = {t: stack.enter_context(daemon(t, Path(tmp) / t, args.devices)) for t in sides}
        for c in args.concurrency:
            for i in range(args.pairs):
                order = sides if i % 2 == 0 else sides[::-1]
                pair = {}
                for t in order:
                    got = measure(daemons[t], c, args.seconds)
                    if got is not None:
                        runs.setdefault((t, c), []).append(got)
                        pair[t] = got["throughput"]
                if len(pair) == 2:
                    pairs.setdefault(c, []).append(pair[second] / pair[first])
    rows = []
    a, b = first[:6], second[:6]
    print(f"{'c':>3} {a + '/s':>9} {b + '/s':>9} {'ratio':>6} {a + ' p99':>10} {b + ' p99':>10} "
          f"{a + ' us/inf':>13} {b + ' us/inf':>13} {'client us/inf':>14}  pairs")  # fmt: skip
    for c in args.concurrency:
        if not all((t, c) in runs for t in sides):
            print(f"{c:>3} no stable measurement for both sides")
            continue
        med = {
            t: {k: statistics.median(r[k] for r in runs[(t, c)]) for k in runs[(t, c)][0]}
            for t in sides
        }
        ratio = med[second]["throughput"] / med[first]["throughput"]
        each = [round(r, 2) for r in pairs.get(c, [])]
        rows.append({"concurrency": c, "median": med, "ratio": ratio, "pairs": each,
                     "runs": {t: runs[(t, c)] for t in sides}})  # fmt: skip
        client = "/".join(f"{med[t]['client_us_per_infer']:.0f}" for t in sides)
        print(f"{c:>3} {med[first]['throughput']:>9.0f} {med[second]['throughput']:>9.0f} "
              f"{ratio:>6.2f} {med[first]['p99_us']:>10.0f} {med[second]['p99_us']:>10.0f} "
              f"{med[first]['cpu_us_per_infer']:>13.0f} "
              f"{med[second]['cpu_us_per_infer']:>13.0f} {client:>14}  {each}")  # fmt: skip
    name = "grpc_transport" if args.compare == "transports" else f"grpc_{args.compare}"
    out = REPO / "benchmarks" / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print(f"wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
