"""``benchmarks/results/overload.md`` from ``overload.json``: the table of ``overload.py``.

``python benchmarks/overload_report.py`` writes the markdown again from the JSON of the last run
(no new measurement).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
#: A request written more than this after its scheduled time counts as late.
LATE = 0.010


def _phase_rows(p: dict[str, Any], capacity: float) -> list[str]:
    o, h = p["overload"], p["after_half"]
    m = o["multiple"]
    return [
        f"| **open loop {m:g}xC = {o['rate_rps']} req/s for {o['seconds']:g} s** | "
        f"{o['requests']} requests over {o['connections']} connections | |",
        f"| generator: lateness p50 / p99 / max | {o['lateness_p50_ms']} / "
        f"{o['lateness_p99_ms']} / {o['lateness_max_ms']} ms; late (> {LATE * 1e3:g} ms) "
        f"{o['late']} = {o['late_fraction']:.2%}, of which waited for a free connection: "
        f"{o['waited_for_connection']}, late by the generator's own lag: {o['late_own']}; "
        f"generator kept up: **{o['generator_kept_up']}**, connection pool exhausted: "
        f"**{o['pool_exhausted']}** | own lag <= 1 % |",
        f"| CPU cores: daemon / generator / others (machine busy) | {o['daemon_cpu_cores']} / "
        f"{o['generator_cpu_cores']} / {o['other_cpu_cores']} ({o['machine_busy_cores']} of "
        f"{o['machine_cores']}); load average before {o['load_average_before'][0]}, after "
        f"{o['load_average_after'][0]} | |",
        f"| client timeouts (10 s from scheduled send; never sent) | {o['timeout']} "
        f"({o['unsent']}) | 0 |",
        f"| connection resets | {o['reset']} | 0 |",
        f"| 200s correct / wrong; other statuses | {o['ok']} / {o['wrong']}; "
        f"{o['other_status']} | |",
        f"| refusals (503) | {o['refused']} | |",
        f"| p50 / p99 / max of 200s | {o['p50_ok_ms']} / {o['p99_ok_ms']} / {o['max_ok_ms']} ms"
        f" (p99 = {o['p99_ok_vs_closed_p99']}x closed p99) | p99 <= 10x |",
        "| its p99 of 200s per second | "
        + ", ".join(f"{s['p99_ok_ms']}" for s in o["per_second"])
        + " ms | |",
        f"| p50 / p99 of refusals | {o['p50_refused_ms']} / {o['p99_refused_ms']} ms "
        f"({o['p99_refused_vs_closed_p99']}x closed p99) | p99 <= 10x |",
        f"| goodput | {o['goodput_rps']} req/s = {o['goodput_ratio']}xC | >= 0.8xC |",
        f"| daemon RSS growth (peak - before) | {o['rss_growth_mb']} MB ({o['rss_before_mb']} "
        f"-> peak {o['rss_peak_mb']}, {o['rss_after_mb']} at the end) | < 200 MB |",
        f"| then 0.5xC = {h['rate_rps']} req/s for {h['seconds']:g} s: p99 of 200s back under "
        f"{h['normal_p99_ms']} ms (2x closed p99), every request a 200, after | "
        f"{h['seconds_to_normal_p99']} s (refusals allowed: "
        f"{h['seconds_to_normal_p99_refusals_allowed']} s; phase p99 {h['p99_ok_ms']} ms, "
        f"timeouts {h['timeout']}, refusals {h['refused']}, generator late "
        f"{h['late_fraction']:.2%}) | <= 5 s |",
        "| 0.5xC p99 of 200s per second | "
        + ", ".join(f"{s['p99_ok_ms']}" for s in h["per_second"])
        + " ms | |",
    ]


def markdown(r: dict[str, Any], command: str) -> str:
    c, i, g = r["closed_loop"], r["idle_keepalive"], r["generator"]
    rows: list[str] = []
    for p in r["phases"]:
        rows += _phase_rows(p, r["capacity_rps"])
    return "\n".join(
        [
            "## Overload (issue 19)",
            "",
            f"`{command}` -- the daemon with its defaults{r['daemon_args_note']}, MLP "
            f"{r.get('mlp', '784-512-512-10')} at batch 32, single-sample JSON requests. "
            "Load generator "
            f"`benchmarks/loadgen.py`: {g['processes']} processes (uvloop), raw HTTP/1.1 "
            "keep-alive connections with one request in flight each (no pipelining), "
            f"{g['inputs']} prebuilt inputs, {g['checked_fraction']:.0%} of the 200s checked "
            "(byte-equal to a body already verified, else parsed and compared with "
            "onnxruntime's logits). Open loop: send times fixed in advance, latency and the "
            "10 s timeout counted from the scheduled send. Client and daemon share the "
            "2-core machine with other users (load average and CPU below).",
            "",
            "| figure | value | goal |",
            "| --- | --- | --- |",
            f"| closed-loop capacity C ({c['clients']} clients, {c['seconds']:g} s) | "
            f"{r['capacity_rps']} req/s, p50 {c['p50_ok_ms']} ms, p99 {c['p99_ok_ms']} ms "
            f"(errors {c['requests'] - c['ok']}; CPU cores daemon {c['daemon_cpu_cores']}, "
            f"generator {c['generator_cpu_cores']}; load average "
            f"{c['load_average_before'][0]}) | |",
            *rows,
            f"| {i['active_clients']} active clients, alone / beside "
            f"{i['idle_connections_opened']} idle keep-alive connections | {i['rps_alone']} / "
            f"{i['rps_beside_idle']} req/s = {i['ratio']} (p99 {i['p99_alone_ms']} / "
            f"{i['p99_beside_idle_ms']} ms; idle still open after: "
            f"{i['idle_connections_open_after']}, failed to open: "
            f"{i['idle_connections_failed']}) | >= 0.5 |",
            "",
        ]
    )


def rewrite_markdown(out: Path = RESULTS) -> None:
    """Write ``overload.md`` again from ``overload.json`` (same run, no new measurement)."""
    result = json.loads((out / "overload.json").read_text())
    result.setdefault("daemon_args_note", "")
    (out / "overload.md").write_text(markdown(result, result["command"]))


if __name__ == "__main__":
    rewrite_markdown()
