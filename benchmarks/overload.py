"""Overload at the real daemon (issue 19): does it shed early and fast with its defaults, and
recover at once?

Starts the daemon (a subprocess, default configuration: ``model-runtime serve`` options, the
admission delay 1 s) serving an MLP (``--mlp``, default 784-3072-3072-10: the device, not the
event loop, is the limit) compiled at batch 32, and drives it with
``benchmarks/loadgen.py``: raw HTTP/1.1 keep-alive connections (one request in flight each, no
pipelining), prebuilt single-sample JSON requests (8 distinct inputs), every 200 checked against
onnxruntime's logits, spread over ``--processes`` worker processes (uvloop):

1. closed loop, 32 clients: capacity C (requests/s) and its p50/p99;
2. open loop at 3xC for 30 s (send times fixed in advance; latency and the 10 s client timeout
   counted from the scheduled send): client timeouts, connection resets, 200s, refusals (503),
   p50/p99 of each, goodput (correct 200s/s) / C, the daemon's RSS growth, and the generator's
   own lateness (written - scheduled) and CPU;
3. at once after it, open loop at 0.5xC for 10 s: seconds until p99 is back to normal (2x the
   closed-loop p99, per 0.5 s of scheduled sends, and staying there);
4. 8 closed-loop clients alone, then beside 3,000 idle keep-alive connections: throughput.

``--multiples 3,2,1.5`` (the default) runs steps 2-3 once per multiple of C, in one run
(on this 2-core machine the daemon's loop saturates first, see the results). ``--seconds S``
sets the overload phase (default 30); the others scale with it. Results:
``benchmarks/results/overload.json`` and ``overload.md``. Run: ``make bench-overload``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from test_daemon_support import running  # noqa: E402

from benchmarks.loadgen import (  # noqa: E402
    OK,
    REFUSED,
    RESET,
    TIMEOUT,
    TIMEOUT_KIND,
    UNSENT,
    WRONG,
    Record,
    request_bytes,
    schedule,
)
from benchmarks.loadgen_pool import Client  # noqa: E402
from benchmarks.overload_report import LATE, markdown  # noqa: E402
from model_runtime.server.security.fdlimit import raise_open_file_limit  # noqa: E402
from tests.models import make_mlp, save  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CLOSED_CLIENTS = 32
IDLE_CONNECTIONS = 3000
ACTIVE_CLIENTS = 8
BUCKET = 0.5
INPUTS = 8
#: The open-loop pool: sized to rate x expected latency (an admitted request waits about the
#: daemon's 1 s admission delay, a refusal a few ms), capped below the daemon's default
#: connection limit (4,096, whose last sixteenth closes idle connections).
QUEUE_DELAY = 1.0
POOL_CAP = 3500
#: The model (issue 46): big enough that the device, not the event loop, limits C.
MLP = "784-3072-3072-10"


def samples(model: Path, port: int) -> tuple[list[bytes], list[np.ndarray]]:
    x = np.random.default_rng(1).standard_normal((INPUTS, 784)).astype(np.float32)
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    logits = ref.run(None, {"x": x})[0]
    requests = [
        request_bytes(
            "127.0.0.1",
            port,
            "/v2/models/mlp/infer",
            orjson.dumps(
                {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 784], "data": r}]}
            ),
        )
        for r in x.tolist()
    ]
    return requests, list(logits)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat)."""
    f = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]
    return (sum(f) - idle) / os.sysconf("SC_CLK_TCK"), sum(f) / os.sysconf("SC_CLK_TCK")


def ms(a: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(a, q)) * 1e3, 2) if len(a) else None


def summary(rec: Record, seconds: float) -> dict[str, Any]:
    """Outcomes, latencies (from the scheduled send) and goodput of one phase."""
    ok, ref = rec.latency(OK), rec.latency(REFUSED)
    late = rec.lateness()
    return {
        "requests": len(rec.kind),
        "ok": rec.count(OK),
        "wrong": rec.count(WRONG),
        "refused": rec.count(REFUSED),
        "other_status": int(np.count_nonzero(rec.kind == 4)),
        "timeout": rec.count(TIMEOUT_KIND),
        "reset": rec.count(RESET),
        "unsent": rec.count(UNSENT),
        "p50_ok_ms": ms(ok, 50),
        "p99_ok_ms": ms(ok, 99),
        "max_ok_ms": ms(ok, 100),
        "p50_refused_ms": ms(ref, 50),
        "p99_refused_ms": ms(ref, 99),
        "goodput_rps": round(rec.count(OK) / seconds, 1),
        "lateness_p50_ms": ms(late, 50),
        "lateness_p99_ms": ms(late, 99),
        "lateness_max_ms": ms(late, 100),
        "late": int(np.count_nonzero(late > LATE)),
        "late_fraction": round(float(np.mean(late > LATE)), 4) if len(late) else None,
        "waited_for_connection": int(np.count_nonzero(rec.waited)),
        # Late without having waited for a connection: the generator's own lag (its CPU).
        "late_own": int(np.count_nonzero(((rec.sent - rec.sched) > LATE) & ~rec.waited)),
    }


def recovery_seconds(rec: Record, normal_ms: float, allow_refusals: bool) -> float | None:
    """Seconds from the start of the phase to the start of the first 0.5 s bucket (by
    scheduled send) from which every bucket's requests all got a correct 200 (or a refusal,
    ``allow_refusals``) and the p99 of its 200s is within ``normal_ms`` (None: never)."""
    if not len(rec.sched):
        return None
    t0 = rec.sched[0]
    bucket = ((rec.sched - t0) / BUCKET).astype(int)
    allowed = (OK, REFUSED) if allow_refusals else (OK,)
    good = {}
    for b in range(int(bucket.max()) + 1):
        m = bucket == b
        lat = rec.done[m & (rec.kind == OK)] - rec.sched[m & (rec.kind == OK)]
        good[b] = bool(
            np.isin(rec.kind[m], allowed).all()
            and len(lat)
            and np.percentile(lat, 99) * 1e3 <= normal_ms
        )
    last_bad = max((b for b, ok in good.items() if not ok), default=-1)
    if last_bad == max(good):
        return None
    return (last_bad + 1) * BUCKET


def pool_size(capacity: float, rate: float, closed_p99_s: float) -> int:
    """Connections for an open loop at ``rate``: Little's law with admitted requests (about
    ``capacity`` per second) held ~QUEUE_DELAY + p99 and the rest refused within ~20 ms."""
    need = capacity * (QUEUE_DELAY + closed_p99_s) + max(0.0, rate - capacity) * 0.02
    return int(min(POOL_CAP, max(64, 1.25 * need)))


def overload_phase(
    client: Client,
    pid: int,
    capacity: float,
    closed_p99_ms: float,
    multiple: float,
    seconds: float,
    half_seconds: float,
) -> dict[str, Any]:
    rate, half_rate = multiple * capacity, 0.5 * capacity
    pool = client.pool(pool_size(capacity, rate, closed_p99_ms / 1e3))
    load0 = os.getloadavg()
    t0 = time.monotonic() + 1.0
    sched = schedule(t0, [(rate, seconds), (half_rate, half_seconds)])
    client.start_open_loop(sched)
    workers = [p.pid for p in client.procs]
    while time.monotonic() < t0:
        time.sleep(0.005)
    rss0 = rss_peak = rss_mb(pid)
    cpu0, gen0, mach0 = cpu_seconds(pid), sum(cpu_seconds(w) for w in workers), machine_busy()
    marks: dict[str, Any] = {}
    while not client.ready():
        now = time.monotonic()
        rss_peak = max(rss_peak, rss_mb(pid))
        if "over" not in marks and now >= t0 + seconds:
            marks["over"] = (
                cpu_seconds(pid),
                sum(cpu_seconds(w) for w in workers),
                machine_busy(),
                rss_mb(pid),
                rss_peak,
                os.getloadavg(),
            )
        if "half" not in marks and now >= t0 + seconds + half_seconds:
            marks["half"] = (cpu_seconds(pid), sum(cpu_seconds(w) for w in workers))
        time.sleep(0.1)
    rec = client.finish_open_loop()
    cpu1, gen1, mach1, rss1, peak1, load1 = marks["over"]
    over = rec.select(rec.sched < t0 + seconds)
    half = rec.select(rec.sched >= t0 + seconds)
    closed_p99 = closed_p99_ms or 1.0
    o = summary(over, seconds)
    busy = (mach1[0] - mach0[0]) / seconds
    o |= {
        "multiple": multiple,
        "rate_rps": round(rate, 1),
        "seconds": seconds,
        "connections": pool,
        "goodput_ratio": round(o["ok"] / seconds / capacity, 3),
        "p99_ok_vs_closed_p99": round((o["p99_ok_ms"] or 0) / closed_p99, 2),
        "p99_refused_vs_closed_p99": round((o["p99_refused_ms"] or 0) / closed_p99, 2),
        "daemon_cpu_cores": round((cpu1 - cpu0) / seconds, 2),
        "generator_cpu_cores": round((gen1 - gen0) / seconds, 2),
        "machine_busy_cores": round(busy, 2),
        "other_cpu_cores": round(busy - (cpu1 - cpu0 + gen1 - gen0) / seconds, 2),
        "machine_cores": os.cpu_count(),
        "load_average_before": [round(v, 2) for v in load0],
        "load_average_after": [round(v, 2) for v in load1],
        "rss_before_mb": round(rss0, 1),
        "rss_after_mb": round(rss1, 1),
        "rss_peak_mb": round(peak1, 1),
        "rss_growth_mb": round(peak1 - rss0, 1),
        "json_checks_all_phases": rec.json_checks,
        "connect_errors": rec.connect_errors,
        "reconnects": rec.reconnects,
    }
    # The generator kept up when at most 1 % of the sends were late by its own lag; sends late
    # because every connection held an unanswered request measure the server, not the client.
    o["generator_kept_up"] = bool(o["late_own"] <= 0.01 * max(1, o["requests"]))
    o["pool_exhausted"] = o["waited_for_connection"] > 0.01 * max(1, o["requests"])
    normal = 2 * closed_p99_ms
    h = summary(half, half_seconds) | {
        "rate_rps": round(half_rate, 1),
        "seconds": half_seconds,
        "normal_p99_ms": round(normal, 2),
        "seconds_to_normal_p99": recovery_seconds(half, normal, allow_refusals=False),
        "seconds_to_normal_p99_refusals_allowed": recovery_seconds(
            half, normal, allow_refusals=True
        ),
    }
    if "half" in marks:
        h["generator_cpu_cores"] = round((marks["half"][1] - gen1) / half_seconds, 2)
        h["daemon_cpu_cores"] = round((marks["half"][0] - cpu1) / half_seconds, 2)
    # p99 of the 200s per second (by scheduled send): where in the overload its tail is (the
    # onset, or all along), and the 0.5xC phase's recovery curve.
    o["per_second"] = _per_second(over, t0, seconds)
    h["per_second"] = _per_second(half, t0 + seconds, half_seconds)
    return {"overload": o, "after_half": h}


def _per_second(rec: Any, start: float, seconds: float) -> list[dict[str, Any]]:
    curve = []
    for k in range(int(seconds)):
        sel = rec.select((rec.sched >= start + k) & (rec.sched < start + k + 1))
        curve.append(
            {
                "second": k,
                "p99_ok_ms": ms(sel.latency(OK), 99),
                "not_ok": int(np.count_nonzero(sel.kind != OK)),
            }
        )
    return curve


def idle_scenario(client: Client, seconds: float) -> dict[str, Any]:
    client.pool(ACTIVE_CLIENTS)
    alone = client.closed_loop(ACTIVE_CLIENTS, seconds)
    held = client.hold(IDLE_CONNECTIONS)
    beside = client.closed_loop(ACTIVE_CLIENTS, seconds)
    after = client.unhold()
    a = alone.count(OK) / seconds
    b = beside.count(OK) / seconds
    return {
        "idle_connections_opened": held["opened"],
        "idle_connections_failed": held["failed"],
        "idle_connections_open_after": after["still_open"],
        "active_clients": ACTIVE_CLIENTS,
        "rps_alone": round(a, 1),
        "rps_beside_idle": round(b, 1),
        "ratio": round(b / a, 3) if a else None,
        "p99_alone_ms": ms(alone.latency(OK), 99),
        "p99_beside_idle_ms": ms(beside.latency(OK), 99),
        "errors_beside_idle": len(beside.kind) - beside.count(OK),
    }


def run(
    client: Client, pid: int, seconds: float, multiples: list[float], processes: int
) -> dict[str, Any]:
    half_seconds = max(3.0, seconds / 3)
    closed_seconds = max(3.0, seconds / 3)
    client.pool(CLOSED_CLIENTS)
    client.closed_loop(CLOSED_CLIENTS, 2.0)  # warm up
    load = os.getloadavg()
    gen0 = sum(cpu_seconds(p.pid) for p in client.procs)
    cpu0 = cpu_seconds(pid)
    closed = client.closed_loop(CLOSED_CLIENTS, closed_seconds)
    capacity = closed.count(OK) / closed_seconds
    c = summary(closed, closed_seconds)
    for k in (
        "lateness_p50_ms",
        "lateness_p99_ms",
        "lateness_max_ms",
        "late",
        "late_fraction",
        "late_own",
    ):
        c.pop(k)
    c |= {
        "clients": CLOSED_CLIENTS,
        "seconds": closed_seconds,
        "generator_cpu_cores": round(
            (sum(cpu_seconds(p.pid) for p in client.procs) - gen0) / closed_seconds, 2
        ),
        "daemon_cpu_cores": round((cpu_seconds(pid) - cpu0) / closed_seconds, 2),
        "load_average_before": [round(v, 2) for v in load],
    }
    result: dict[str, Any] = {
        "generator": {
            "processes": processes,
            "inputs": INPUTS,
            "checked_fraction": 1.0,
            "pipelining": False,
            "client_timeout_s": TIMEOUT,
            "late_threshold_ms": LATE * 1e3,
        },
        "closed_loop": c,
        "capacity_rps": round(capacity, 1),
        "phases": [],
    }
    for i, m in enumerate(multiples):
        if i:
            client.pool(CLOSED_CLIENTS)
            time.sleep(3.0)
        result["phases"].append(
            overload_phase(client, pid, capacity, c["p99_ok_ms"] or 0.0, m, seconds, half_seconds)
        )
    result["idle_keepalive"] = idle_scenario(client, max(3.0, seconds / 6))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="overload phase (30)")
    parser.add_argument(
        "--multiples",
        default="3,2,1.5",
        help="overload rates as multiples of C, comma-separated (3,2,1.5)",
    )
    parser.add_argument("--processes", type=int, default=2, help="generator processes (2)")
    parser.add_argument("--mlp", default=MLP, help=f"the MLP's layer sizes, dash-separated ({MLP})")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument(
        "--daemon-args",
        default="",
        help="extra daemon options, to compare with the defaults (e.g. '--admission-delay 0.1')",
    )
    args = parser.parse_args(argv)
    multiples = [float(m) for m in args.multiples.split(",")]
    raise_open_file_limit()  # the client holds thousands of sockets too
    with tempfile.TemporaryDirectory(prefix="mr-overload-") as tmp:
        work = Path(tmp)
        sizes = tuple(int(n) for n in args.mlp.split("-"))
        if sizes[0] != 784:
            parser.error("--mlp: the first layer takes the 784 pixels of a sample")
        model = save(make_mlp(sizes=sizes), work / "mlp.onnx")
        extra = args.daemon_args.split()
        with running(work, f"mlp={model}", "--batch-size", "32", *extra) as daemon:
            requests, expected = samples(model, daemon.port)
            client = Client("127.0.0.1", daemon.port, requests, expected, args.processes)
            try:
                result = run(client, daemon.proc.pid, args.seconds, multiples, args.processes)
            finally:
                client.close()
            events = daemon.events()
        result["daemon_log"] = {
            "requests_refused_summaries": sum(
                1 for e in events if e.get("event") == "requests_refused"
            ),
            "warnings": sum(1 for e in events if e.get("level") == "warning"),
            "errors": sum(1 for e in events if e.get("level") == "error"),
        }
        for e in events:
            if e.get("level") in ("warning", "error"):
                key = f"{e.get('level')}:{e.get('event')}"
                result["daemon_log"][key] = result["daemon_log"].get(key, 0) + 1
    command = "make bench-overload" + (
        f" OVERLOAD_SECONDS={args.seconds:g}" if args.seconds != 30 else ""
    )
    if args.multiples != "3,2,1.5" or args.processes != 2 or args.mlp != MLP:
        command = (
            f".venv/bin/python benchmarks/overload.py --seconds {args.seconds:g} "
            f"--multiples {args.multiples} --processes {args.processes} --mlp {args.mlp}"
        )
    if args.daemon_args:
        command += f" --daemon-args '{args.daemon_args}'"
    result["command"] = command
    result["mlp"] = args.mlp
    result["daemon_args"] = args.daemon_args
    result["daemon_args_note"] = f" and {args.daemon_args}" if args.daemon_args else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overload.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result, command)
    (args.out / "overload.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
