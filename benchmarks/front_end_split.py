"""Issue 31: would a second front-end process pay on this host? The ceiling of any split.

Three servers on loopback, each serving the MLP 784-512-512-10 as ``benchmarks/triton_peer.py``
makes and serves it:

* one: the daemon as ``triton_peer.py`` runs it (``MODEL_RUNTIME_DEVICES=cpu:1x1``);
* two: two such daemons, each with a cpu:1x1 device and the model of its own, both bound to the
  same HTTP and gRPC ports with ``--reuse-port``, so the kernel spreads the connections over
  them. This is what any split of the front end over two processes could reach at best: nothing
  crosses between the processes, and each has a batcher and a device of its own;
* triton: NVIDIA's Triton with the python backend, as ``triton_peer.py`` sets it up.

perf_analyzer drives each with the same flags as in ``triton_peer.py``; at each point
(protocol x concurrency) the runs alternate one, two, triton, ``--pairs`` times. Printed and
written to ``benchmarks/results/front_end_split.json``: each run, the medians, two/one and
two/triton. ``make bench`` runs it with 2 s windows; ``benchmarks/RESULTS.md`` shows its table.

    .venv/bin/python benchmarks/front_end_split.py [--clients 16] [--pairs 2]
        [--protocols http grpc] [--seconds 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import triton_peer
from benchmarks.peers import runs, servers, triton_server
from benchmarks.peers.triton_server import Running
from tests.models import make_mlp, save

RESULTS = Path(__file__).parent / "results" / "front_end_split.json"
SERVERS = ("one", "two", "triton")


@contextmanager
def two_daemons(model: Path, workdir: Path, devices: str) -> Iterator[Running]:
    """Two daemons sharing one HTTP and one gRPC port (``--reuse-port``); the first's handle
    (its ports are both's)."""
    ports = (servers.free_port(), servers.free_port())
    with ExitStack() as stack:
        first = stack.enter_context(
            triton_peer.ours(
                model, workdir / "a", devices, ports=ports, options=("--reuse-port=true",)
            )
        )
        stack.enter_context(
            triton_peer.ours(
                model, workdir / "b", devices, ports=ports, options=("--reuse-port=true",)
            )
        )
        # Its readiness was asked through the shared port, which the first may have answered:
        # wait for its own log to say its model is loaded.
        log, deadline = workdir / "b" / "daemon.log", time.monotonic() + 120
        while b'"model_loaded"' not in log.read_bytes():
            if time.monotonic() > deadline:
                raise servers.PeerUnavailable(f"the second daemon did not load its model: {log}")
            time.sleep(0.1)
        yield first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="perf_analyzer window (s)")
    parser.add_argument("--pairs", type=int, default=2, help="alternations per point")
    parser.add_argument("--clients", type=int, nargs="+", default=[16])
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    parser.add_argument("--stability", type=int, default=20, help="perf_analyzer -s (%%)")
    parser.add_argument("--max-trials", type=int, default=6, help="perf_analyzer -r")
    parser.add_argument("--devices", default="cpu:1x1", help="each daemon's devices")
    args = parser.parse_args()
    started = time.monotonic()
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": len(os.sched_getaffinity(0)),
        "host_busy_before": runs.busy_processes(),
        "runs": [],
        "rows": [],
    }
    with tempfile.TemporaryDirectory(prefix="mr-split-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        model = save(make_mlp(), work / "mlp.onnx")
        live = {
            "one": stack.enter_context(triton_peer.ours(model, work / "one", args.devices)),
            "two": stack.enter_context(two_daemons(model, work / "two", args.devices)),
            "triton": stack.enter_context(
                triton_server.triton(
                    model, triton_peer.MODEL_NAME, work / "triton", threads=1,
                    max_batch_size=triton_peer.BATCH, max_queue_delay_us=0,
                    io=(triton_peer.INPUT, triton_peer.WIDTH, triton_peer.OUTPUT,
                        triton_peer.CLASSES),
                )
            ),
        }  # fmt: skip
        for protocol in args.protocols:
            for srv in live.values():
                runs.warm(srv, triton_peer.MODEL_NAME, protocol)
            for c in args.clients:
                for pair in range(args.pairs):
                    for name in SERVERS:
                        r = runs.perf_analyzer_run(
                            live[name], triton_peer.MODEL_NAME, protocol, c, args
                        )
                        run = {"server": name, "protocol": protocol, "clients": c, "pair": pair}
                        doc["runs"].append(run | r)
                        figure = "FAILED" if r.get("per_s") is None else f"{r['per_s']:.0f}/s"
                        print(
                            f"  {protocol:<4} c={c:<3} pair {pair} {name:<6} {figure}", flush=True
                        )
    doc["rows"] = summarize(doc["runs"])
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"{'proto':<5} {'C':>3} {'one/s':>8} {'two/s':>8} {'triton/s':>9} {'two/one':>8} "
          f"{'two/triton':>10} {'one/triton':>10}")  # fmt: skip
    for row in doc["rows"]:
        print(
            f"{row['protocol']:<5} {row['clients']:>3} {_f(row['one'], '8.0f')} "
            f"{_f(row['two'], '8.0f')} {_f(row['triton'], '9.0f')} "
            f"{_f(row['two_over_one'], '8.2f')} {_f(row['two_over_triton'], '10.2f')} "
            f"{_f(row['one_over_triton'], '10.2f')}"
        )
    print(f"wrote {RESULTS} ({doc['elapsed_s']:.0f} s)")


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (protocol, clients): each server's median throughput and the ratios."""
    rows = []
    for protocol, c in dict.fromkeys((r["protocol"], r["clients"]) for r in runs):
        at = [r for r in runs if (r["protocol"], r["clients"]) == (protocol, c)]
        row: dict[str, Any] = {"protocol": protocol, "clients": c}
        for name in SERVERS:
            got = [r["per_s"] for r in at if r["server"] == name and r.get("per_s")]
            row[name] = statistics.median(got) if got else None
        one, two, triton = row["one"], row["two"], row["triton"]
        row["two_over_one"] = two / one if one and two else None
        row["two_over_triton"] = two / triton if two and triton else None
        row["one_over_triton"] = one / triton if one and triton else None
        rows.append(row)
    return rows


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


if __name__ == "__main__":
    main()
