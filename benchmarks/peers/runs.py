"""What the side-by-side benchmarks measure a server with: perf_analyzer runs and CPU time.

``triton_peer.py``, ``python_models.py``, ``ensembles.py`` and ``front_end_split.py`` run the
same perf_analyzer (``tests/perf_analyzer.py``) the same way against ours and NVIDIA's Triton,
and read the same ``/proc`` counters around each run; they are here once.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.peers import servers
from benchmarks.peers.triton_server import Running
from tests import perf_analyzer

__all__ = [
    "busy_processes",
    "group_cpu_s",
    "host_busy_s",
    "pa_version",
    "perf_analyzer_run",
    "process_cpu_s",
    "warm",
]

#: Requests perf_analyzer sends at c=16 to warm a server and model up, not recorded.
WARMUP_REQUESTS = 2000
_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the live processes of process group ``pgid``."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def host_busy_s() -> float:
    """CPU seconds this machine has been busy (all cores, /proc/stat), since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICK


def busy_processes(seconds: float = 1.0, threshold: float = 5.0) -> list[dict[str, Any]]:
    """Processes of this machine using more than ``threshold`` % of a core over ``seconds``
    (other test runs, builds): the host was not quiet if any are listed."""

    def sample() -> dict[int, tuple[int, bytes]]:
        out = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    stat = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
                    cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes()
                except OSError:
                    continue
                out[int(entry.name)] = (int(stat[11]) + int(stat[12]), cmd)
        return out

    a = sample()
    time.sleep(seconds)
    b = sample()
    busy = []
    for pid, (ticks, cmd) in b.items():
        pct = 100 * (ticks - a.get(pid, (ticks, b""))[0]) / _TICK / seconds
        if pct > threshold and pid != os.getpid():
            text = cmd.replace(b"\0", b" ").decode(errors="replace").strip()[:160]
            busy.append({"pid": pid, "cpu_pct": round(pct), "cmd": text})
    return busy


def perf_analyzer_run(
    srv: Running, model: str, protocol: str, c: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One perf_analyzer run at ``model`` (batch 1, random data), tried again once (same flags)
    if it fails: its figures, or the last error. ``args``: ``seconds`` (the measurement
    interval), ``stability`` (%), ``max_trials``. On two cores shared with the tool, a run can
    miss the stability rule."""
    url = srv.http if protocol == "http" else srv.grpc
    failed: dict[str, Any] = {}
    for attempt in (1, 2):
        try:
            r = perf_analyzer.run(
                model,
                url,
                protocol=protocol,
                concurrency=c,
                measurement_ms=int(args.seconds * 1000),
                extra=["-s", str(args.stability), "-r", str(args.max_trials)],
                # A run takes 3..max-trials windows; against Triton's HTTP at c=64 perf_analyzer
                # was seen pausing 4-24 s between windows (then > 150 s in all): bounded here.
                timeout=20 + 5 * args.seconds * args.max_trials,
            )
        except perf_analyzer.PerfAnalyzerError as exc:
            err, out = exc.stderr.strip(), exc.stdout.strip()
            said = err.splitlines()[0] if err else f"its output ends: {out.splitlines()[-1:]}"
            status = "" if exc.returncode is None else f" (exit {exc.returncode})"
            failed = {
                "per_s": None,
                "error": f"perf_analyzer {exc.reason}{status}: {said}",
                "output": str(exc)[-3000:],
                "command": list(exc.argv),
                "attempts": attempt,
            }
            continue
        return {
            "per_s": r.throughput,
            "p50_us": r.p50_us,
            "p99_us": r.p99_us,
            "command": list(r.argv),
            "attempts": attempt,
            "first_error": failed.get("error"),
            "first_output": failed.get("output"),
            "server_side": {k: r.row.get(k) for k in ("Server Queue", "Server Compute Infer")},
        }
    return failed


def pa_version() -> str:
    """perf_analyzer's ``--version`` and the wheel it came from ("not installed" without it)."""
    prefix = perf_analyzer.command()
    if prefix is None:
        return "not installed"
    out = subprocess.run(
        [*prefix, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=60,
    )  # fmt: skip
    return f"{out.stdout.strip()} (perf-analyzer wheel {wheel_version()})"


def wheel_version() -> str:
    """The perf-analyzer wheel's version under ``.venv-peers/perf_analyzer`` ("?" if unknown)."""
    home = servers.PEER_VENVS / "perf_analyzer" / "wheel"
    found = sorted(home.glob("perf_analyzer-*.dist-info"))
    return found[-1].name.split("-")[1].removesuffix(".dist") if found else "?"


def warm(srv: Running, model: str, protocol: str) -> None:
    """``WARMUP_REQUESTS`` requests to ``model`` at c=16 from perf_analyzer, not recorded."""
    url = srv.http if protocol == "http" else srv.grpc
    try:
        perf_analyzer.run(
            model, url, protocol=protocol, concurrency=16, measurement_ms=500,
            extra=["--request-count", str(WARMUP_REQUESTS)], timeout=60,
        )  # fmt: skip
    except perf_analyzer.PerfAnalyzerError:
        pass  # a warm-up only: the measured runs say what fails
