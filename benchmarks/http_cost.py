"""The daemon's HTTP cost per request: event-loop CPU and process CPU, binary and JSON infer.

Serves the demo model (``model_runtime/demo/digits_mlp.onnx``, one row per request) with the
daemon's defaults (no access log, as the other benchmarks), drives it from a separate process
with C keep-alive connections (raw HTTP/1.1, prebuilt requests, each connection sending its next
request once its answer is in), and reads the daemon's CPU from ``/proc``: the whole process
(``/proc/<pid>/stat``) and its main thread, the event loop (``/proc/<pid>/task/<pid>/stat``),
over N requests after a warm-up. Device threads run onnxruntime; the loop's figure is the front
end's cost. ``--trees A B``: one daemon per tree (``PYTHONPATH``), alternated ``--pairs`` times
in one run, so a reference and a change are measured on the same noisy host side by side.

    .venv/bin/python benchmarks/http_cost.py [--requests 20000] [--clients 16]
        [--modes binary json] [--trees /work/main .] [--pairs 3] [--profile OUT] [--stages]
        [--callgrind [--keep DIR]] [--python | --ensemble]

``--stages``: the event loop's CPU per request in each stage of
:data:`benchmarks.http_cost_hooks.STAGES` (each function wrapped to add up its thread CPU time:
about 1 µs added per call, nested stages counted in their callers too),
cheaper and less distorting than ``--profile``'s cProfile.
``--modes grpc``: ModelInfer over gRPC (grpcio callers, six to a connection) on the same
daemon; ``grpcs``: the same over TLS (the daemon started with ``--grpc-use-ssl``, so a mode of
its own: not with ``grpc`` in one run without ``--callgrind``, which starts a daemon per mode).
``--callgrind``: the daemon runs under valgrind's callgrind (about 40 times slower),
counting only during the measured requests; the figure is the event loop thread's instructions
per request, which other processes on the host do not change (CPU time on a shared host does),
and the requests per batch beside it (the count moves with the batch size). Its event loop's lag
timer ticks 40 times less often (:data:`benchmarks.http_cost_hooks.SLOWED`), as often per
request as outside valgrind.
``--python``: the same input served by a python model (:mod:`benchmarks.http_cost_python`), so
the figure is the front end plus the python backend's daemon side. ``--ensemble``: the ensemble
of ``benchmarks/ensembles.py`` (python pre -> ONNX classifier -> python post), 48 random bytes a
request; its batches are its first step's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.http_cost_hooks import PROFILED, SLOWED, STAGED, STAGES
from benchmarks.http_cost_python import DIGITS, TARGETS, Target

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "model_runtime" / "demo" / "digits_mlp.onnx"
_TICK = os.sysconf("SC_CLK_TCK")
#: How many times slower the daemon runs under callgrind (its lag timer is slowed as much).
CALLGRIND_SLOWDOWN = 40
#: The load generator, run as its own process (:mod:`benchmarks.http_cost_clients`).
CLIENTS = str(Path(__file__).with_name("http_cost_clients.py"))


def _cpu(pid: int, tid: int | None = None) -> float:
    """utime + stime of process ``pid`` (or its thread ``tid``), seconds."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _children_cpu(pid: int) -> float:
    """utime + stime of the running children of ``pid`` (a python model's instances), seconds."""
    total = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split():
            try:
                total += _cpu(int(child))
            except OSError:  # (ended meanwhile)
                pass
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    """The daemon of one tree, serving the demo model on a free port."""

    def __init__(
        self,
        tree: Path,
        workdir: Path,
        profile: Path | None = None,
        stages: bool = False,
        callgrind: bool = False,
        python: bool = False,
        tls: bool = False,
        target: Target = DIGITS,
    ) -> None:
        self.target = target
        self.port, self.grpc_port = _free_port(), _free_port()
        #: The CA file of the daemon's gRPC certificate (``tls``; else "").
        self.ca = ""
        (workdir / "run").mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable]
        self.callgrind: Path | None = None
        if callgrind:
            self.callgrind = workdir / f"callgrind-{self.port}.out"
            cmd[:0] = [
                "valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                "--trace-children=no",
                f"--callgrind-out-file={self.callgrind}",
            ]  # fmt: skip
        self.stages: Path | None = None
        if stages:
            self.stages = workdir / f"stages-{self.port}.json"
            cmd += ["-c", STAGED.format(stages=STAGES, out=str(self.stages))]
        elif callgrind:
            cmd += ["-c", SLOWED.format(slowdown=CALLGRIND_SLOWDOWN)]
        elif profile is None:
            cmd += ["-m", "model_runtime.server"]
        else:  # the event loop's thread, profiled in CPU time (not wall time)
            cmd += ["-c", PROFILED.format(out=str(profile))]
        cmd += [
            "--port", str(self.port), "--grpc-port", str(self.grpc_port),
            "--metrics-port", "0", "--no-access-log", "--log-format", "json",
            "--executable-cache", str(workdir / "cache"),
        ]  # fmt: skip
        if target is not DIGITS:
            cmd += ["--model-repository", str(target.repository(workdir))]
        elif python:
            from benchmarks.http_cost_python import python_repository

            cmd += ["--model-repository", str(python_repository(workdir))]
        else:
            cmd.append(f"{target.name}={MODEL}")
        if tls:
            from tests.pki import write_pki

            pki = write_pki(workdir / f"pki-{self.port}")
            self.ca = str(pki["ca"])
            cmd += ["--grpc-use-ssl", "--grpc-server-cert", str(pki["server"]),
                    "--grpc-server-key", str(pki["server_key"])]  # fmt: skip
        env = {
            **os.environ,
            "PYTHONPATH": str(tree),
            "MODEL_RUNTIME_DIR": str(workdir / "run"),
            "PYTHONUNBUFFERED": "1",
        }
        self.log = open(workdir / f"daemon-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, env=env, cwd=tree, stdout=self.log, stderr=self.log)
        url = f"http://127.0.0.1:{self.port}/v2/models/{target.name}/ready"
        deadline = time.monotonic() + (900 if callgrind else 180)  # (callgrind: ~40x slower)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon of {tree} exited: see {self.log.name}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.proc.kill()  # (not left running, under valgrind or not)
                self.proc.wait()
                raise RuntimeError(f"daemon of {tree} not ready: see {self.log.name}")
            time.sleep(0.2)

    def load(self, mode: str, clients: int, total: int, count: bool = True) -> dict[str, Any]:
        """Drive ``total`` requests; the daemon's CPU over them (``count``: callgrind counts
        them)."""
        pid = self.proc.pid
        port = self.grpc_port if mode in ("grpc", "grpcs") else self.port
        cmd = [sys.executable, CLIENTS, str(port), mode, str(clients), str(total),
               self.target.key, self.ca]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        staged0 = self._staged()
        executions0 = self.executions()
        self._count(count)
        cpu0, loop0, kids0 = _cpu(pid), _cpu(pid, pid), _children_cpu(pid)
        out = subprocess.run(cmd, env=env, capture_output=True, check=True, text=True)
        cpu1, loop1, kids1 = _cpu(pid), _cpu(pid, pid), _children_cpu(pid)
        if count:
            self._count(False)
        staged1 = self._staged()
        batches = self.executions() - executions0
        result = json.loads(out.stdout.splitlines()[-1])
        stages = {
            key: ((ns - staged0[key][0]) / total / 1e3, (n - staged0[key][1]) / total)
            for key, (ns, n) in staged1.items()
        }
        return {
            **result,
            "req_per_s": total / result["seconds"],
            "loop_us": (loop1 - loop0) / total * 1e6,
            "process_us": (cpu1 - cpu0) / total * 1e6,
            "instances_us": (kids1 - kids0) / total * 1e6,
            "stages": stages,
            "batches": batches,
        }

    def executions(self) -> int:
        """The model's executions so far (batches run), from its statistics."""
        url = f"http://127.0.0.1:{self.port}/v2/models/{self.target.stats}/stats"
        with urllib.request.urlopen(url, timeout=60) as r:
            stats = json.loads(r.read())["model_stats"]
        return sum(int(s["execution_count"]) for s in stats)

    def _count(self, on: bool) -> None:
        """Callgrind counts from now (``on``) or stops counting (without ``--callgrind``:
        nothing)."""
        if self.callgrind is not None:
            flag = "on" if on else "off"
            cmd = ["callgrind_control", "-i", flag, str(self.proc.pid)]
            subprocess.run(cmd, check=True, capture_output=True)

    def loop_instructions(self) -> int:
        """Instructions callgrind counted on the event loop's thread (after :meth:`close`)."""
        assert self.callgrind is not None
        text = Path(f"{self.callgrind}-01").read_text(errors="replace")
        found = re.search(r"^totals: (\d+)", text, re.M)  # (its "summary" line says 0)
        return int(found.group(1)) if found else 0

    def _staged(self) -> dict[str, list[int]]:
        """The stages' CPU (ns) and calls so far (none without ``--stages``)."""
        if self.stages is None:
            return {}
        self.stages.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                staged: dict[str, list[int]] = json.loads(self.stages.read_text())
                return staged
            except (OSError, ValueError):  # not written yet, or half written
                time.sleep(0.05)
        raise RuntimeError("the daemon did not write its stages")

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _callgrind(tree: Path, tmp: Path, mode: str, rnd: int, args: Any) -> dict[str, Any]:
    """One daemon of ``tree`` under callgrind, one ``mode``: its loop's instructions per
    request (as ``loop_us``, so the ratios below read them)."""
    daemon = Daemon(
        tree, tmp, callgrind=True, python=args.python, tls=mode == "grpcs", target=args.target
    )
    try:
        daemon.load(mode, args.clients, args.warmup, count=False)
        r = daemon.load(mode, args.clients, args.requests)
    finally:
        daemon.close()
    per_request = daemon.loop_instructions() / args.requests
    if args.keep is not None:  # for callgrind_annotate
        args.keep.mkdir(parents=True, exist_ok=True)
        assert daemon.callgrind is not None
        for part in daemon.callgrind.parent.glob(daemon.callgrind.name + "*"):
            shutil.copy(
                part,
                args.keep / f"{mode}-{rnd}-{tree.name}{part.name[len(daemon.callgrind.name) :]}",
            )
    print(
        f"round {rnd} {tree!s:<22} {mode:<6} c={args.clients} "
        f"loop {per_request:9.0f} instructions/req (callgrind)  "
        f"{args.requests / max(r['batches'], 1):5.1f} req/batch  errors {r['errors']}",
        flush=True,
    )
    return {"round": rnd, "tree": str(tree), "mode": mode, **r, "loop_us": per_request}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--modes", nargs="+", default=["binary", "json"])
    parser.add_argument("--trees", nargs="+", type=Path, default=[ROOT])
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument(
        "--profile", type=Path, help="cProfile the daemon's event loop (CPU time) into this file"
    )
    parser.add_argument(
        "--stages", action="store_true", help="the event loop's CPU per request in each stage"
    )
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="run the daemon under callgrind: the event loop's instructions per request "
        "(one mode per daemon, so each count is that mode's alone)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        help="with --callgrind: copy the callgrind files into this folder "
        "(MODE-ROUND-TREE-THREAD, for callgrind_annotate)",
    )
    parser.add_argument(
        "--python", action="store_true", help="serve the model as a python model (PYTHON_MODEL)"
    )
    parser.add_argument(
        "--ensemble", action="store_true", help="serve benchmarks/ensembles.py's ensemble"
    )
    args = parser.parse_args()
    if not args.callgrind and {"grpc", "grpcs"} <= set(args.modes):
        parser.error("--modes grpc grpcs: one daemon serves both only with --callgrind")
    args.target = TARGETS["ensemble" if args.ensemble else "digits"]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="http-cost-") as tmp:
        for rnd in range(args.pairs):
            for tree in args.trees:
                tree = tree.resolve()
                if args.callgrind:
                    for mode in args.modes:
                        rows.append(_callgrind(tree, Path(tmp), mode, rnd, args))
                    continue
                daemon = Daemon(
                    tree,
                    Path(tmp),
                    args.profile,
                    args.stages,
                    python=args.python,
                    tls="grpcs" in args.modes,
                    target=args.target,
                )
                try:
                    for mode in args.modes:
                        daemon.load(mode, args.clients, args.warmup, count=False)
                        r = daemon.load(mode, args.clients, args.requests)
                        row = {"round": rnd, "tree": str(tree), "mode": mode, **r}
                        rows.append(row)
                        print(
                            f"round {rnd} {tree!s:<22} {mode:<6} c={args.clients} "
                            f"{r['req_per_s']:8.0f} req/s  loop {r['loop_us']:6.1f} us/req  "
                            f"process {r['process_us']:6.1f} us/req  instances "
                            f"{r['instances_us']:6.1f} us/req  {r['batches']} batches  "
                            f"errors {r['errors']}",
                            flush=True,
                        )
                        for key, (us, calls) in r["stages"].items():
                            print(f"    {us:7.1f} us/req  {calls:5.2f} calls/req  {key}")
                finally:
                    daemon.close()
    if len(args.trees) == 2:
        print("ratios (second tree / first), event loop µs per request:")
        for mode in args.modes:
            for rnd in range(args.pairs):
                a, b = (
                    next(
                        r
                        for r in rows
                        if r["round"] == rnd and r["mode"] == mode and r["tree"] == str(t.resolve())
                    )
                    for t in args.trees
                )
                print(
                    f"  {mode:<6} round {rnd}: {a['loop_us']:.1f} -> {b['loop_us']:.1f} "
                    f"({b['loop_us'] / a['loop_us']:.2f}); process {a['process_us']:.1f} -> "
                    f"{b['process_us']:.1f}; req/s {a['req_per_s']:.0f} -> {b['req_per_s']:.0f}"
                )


if __name__ == "__main__":
    main()
