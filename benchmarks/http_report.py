"""RESULTS.md's part for ``benchmarks/http_throughput.py`` (issue 13): the daemon against
MLServer and KServe's Python server over HTTP, JSON and binary, with the same load generator.
``benchmarks/report.py`` calls :func:`section` and :func:`headline` with
``http_throughput.json`` (or None when it is missing). Plain data in and out."""

from __future__ import annotations

from typing import Any

SOURCE = "http_throughput"


def _fmt(v: float | None, digits: int = 2) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def _row(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join("" if c is None else str(c) for c in r) + " |" for r in rows]


def headline(doc: dict[str, Any] | None) -> list[str]:
    """The README's lines: the daemon over each peer, per mode, at each client count."""
    http = (doc or {}).get("rows", [])
    lines: list[str] = []
    for peer in ("mlserver", "kserve"):
        parts = []
        for mode in ("json", "binary"):
            clients, ratios = [], []
            for c in sorted({r["clients"] for r in http if r.get("mode") == mode}):
                d = _row(http, server="daemon", mode=mode, clients=c)
                p = _row(http, server=peer, mode=mode, clients=c)
                if d and p and p["req_per_s"]:
                    clients.append(str(c))
                    ratios.append(f"{d['req_per_s'] / p['req_per_s']:.2f}x")
            if ratios:
                parts.append(f"{mode} at {'/'.join(clients)} clients {' / '.join(ratios)}")
        if parts:
            lines.append(f"- HTTP daemon / {peer} (req/s): {'; '.join(parts)}")
    return lines


def section(doc: dict[str, Any] | None) -> list[str]:
    """The HTTP section: each server's figures and the daemon's ratio over it."""
    if not doc:
        return []
    http = doc
    out = [
        "## HTTP: the daemon vs MLServer vs KServe's Python server",
        "",
        f"`benchmarks/http_throughput.py`: {http.get('model')}; single-sample v2 requests "
        f"from one load generator ({http.get('client_processes')} process), C keep-alive "
        "clients sending prebuilt HTTP/1.1 requests on raw asyncio streams, one at a time, "
        f"{http.get('seconds')} s per point; every answer checked against "
        "onnxruntime (errors = wrong or failed answers).",
        "",
    ]
    for name, s in http.get("servers", {}).items():
        out.append(f"- {name} {s.get('version')}: {s.get('setup')}")
    for s in http.get("skipped", []):
        out.append(f"- {s['server']} {s['mode']}: not measured: {s['why'].splitlines()[0]}")
    out += [""]
    daemon = {
        (r.get("mode"), r.get("clients")): r.get("req_per_s")
        for r in http.get("rows", [])
        if r.get("server") == "daemon"
    }
    table = []
    for r in http.get("rows", []):
        d = daemon.get((r.get("mode"), r.get("clients")))
        rps = r.get("req_per_s")
        ratio = d / rps if d and rps and r.get("server") != "daemon" else None
        table.append(
            [r.get("server"), r.get("mode"), r.get("clients"), _fmt(rps, 0),
             _fmt(r.get("p50_ms")), _fmt(r.get("p99_ms")), r.get("errors"), _fmt(ratio)]
        )  # fmt: skip
    out += _table(
        ["server", "mode", "clients", "req/s", "p50 ms", "p99 ms", "errors", "daemon/this"],
        table,
    )
    out += [""]

    return out
