"""What ``model-runtime inspect FILE.mrx [--json]`` prints: a summary of an executable.

:func:`summarize` returns a JSON-able dict (the ``--json`` output); :func:`format_summary` renders
the same facts as plain-text tables for a terminal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from model_runtime.executable.codec import metadata_to_json
from model_runtime.executable.container import Executable
from model_runtime.executable.strings import string_tensor_names

__all__ = ["format_summary", "summarize"]


def _file_size(path: Any) -> int | None:
    try:
        return int(path.stat().st_size)
    except OSError:  # the file was replaced or deleted after load: the data is still mapped
        return None


def summarize(exe: Executable) -> dict[str, Any]:
    """Everything a user wants to know about ``exe``, as a JSON-able dict.

    Raises:
        Nothing for a loaded or built executable (a file deleted since load reports size null).
    """
    m = exe.metadata
    payloads = {p.payload for p in m.programs if p.payload}
    tensors = {name: exe.tensor(name) for name in exe.tensor_names}
    # The stored document is the base (one encoding of the metadata); sizes are added to it.
    doc: dict[str, Any] = json.loads(metadata_to_json(m, include_hash=True))
    for entry, a in zip(doc["anchors"], m.anchors, strict=True):
        entry["size_bytes"] = a.tensor_info.size_in_bytes
        if a.has_data and a.dtype.kind == "O":  # a string constant: what its tensors hold
            entry["size_bytes"] = sum(int(tensors[t].nbytes) for t in string_tensor_names(a.name))
    for entry in doc["programs"]:
        payload = entry["payload"]
        entry["payload_bytes"] = int(tensors[payload].nbytes) if payload in tensors else None
    return {
        **doc,
        "tensors": [
            {
                "name": name,
                "dtype": t.dtype.name,
                "shape": list(t.shape),
                "bytes": int(t.nbytes),
                "kind": "payload" if name in payloads else "data",
            }
            for name, t in sorted(tensors.items())
        ],
        "total_tensor_bytes": exe.total_tensor_bytes(),
        "files": [{"path": str(p), "bytes": _file_size(p)} for p in exe.sources],
    }


def _bytes(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    ]
    lines.insert(1, "  " + "  ".join("-" * w for w in widths))
    return [line.rstrip() for line in lines]


def format_summary(exe: Executable) -> str:
    """The summary of ``exe`` as aligned plain-text tables (``model-runtime inspect``).

    Raises:
        Nothing for a loaded or built executable.
    """
    s = summarize(exe)
    t = s["target"]
    target = f"{t['device_kind']} x{t['num_devices']}"
    if t["device_kind"] != "cpu":
        target += f" (version {t['version']}, tiles/ipu {t['tiles_per_ipu'] or 'default'})"
    out = [
        f"Executable {s['model_name']!r} (format {s['format_version']})",
        f"  package hash        {s['package_hash'] or '(unsealed)'}",
        f"  target              {target}",
        f"  batch size          {s['batch_size']}",
        f"  batch sizes run     {s['options'].get('batch_sizes', s['batch_size'])}",
        f"  device iterations   {s['device_iterations']}",
        f"  replication factor  {s['replication_factor']}",
        "",
        "Anchors",
    ]
    out += _table(
        ("name", "role", "type", "dtype", "shape", "batch_dim", "programs", "data", "bytes"),
        [
            (
                a["name"] if a["handle"] == a["name"] else f"{a['name']} ({a['handle']})",
                a["role"],
                a["type"],
                a["dtype"],
                "[" + ", ".join(map(str, a["shape"])) + "]",
                a["batch_dim"],
                ",".join(map(str, a["programs"])) or "-",
                "yes" if a["has_data"] else "no",
                _bytes(a["size_bytes"]),
            )
            for a in s["anchors"]
        ],
    )
    flow = s["program_flow"]
    stage = {pid: k for k in ("save", "main", "load") for pid in flow[k]}
    out += ["", "Programs"]
    out += _table(
        ("id", "name", "kind", "in flow", "payload", "bytes"),
        [
            (
                p["id"],
                p["name"],
                p["kind"],
                stage.get(p["id"], "-"),
                p["payload"],
                _bytes(p["payload_bytes"]) if p["payload_bytes"] is not None else None,
            )
            for p in s["programs"]
        ],
    )
    out.append("  flow: " + "; ".join(f"{k} {flow[k] or '[]'}" for k in ("load", "main", "save")))
    if s["output_to_variable"]:
        out += ["", "Output -> variable"]
        out += _table(("output", "variable"), sorted(s["output_to_variable"].items()))
    if s["custom_ops"]:
        out += ["", "Custom ops"]
        out += _table(
            ("library", "op", "hashable", "library hash"),
            [
                (c["library"], c["op"], c["is_hashable"], c["library_hash"][:16])
                for c in s["custom_ops"]
            ],
        )
    if s["options"]:
        out += ["", "Options"]
        out += _table(("option", "value"), sorted(s["options"].items()))
    out += ["", "Tensors"]
    out += _table(
        ("name", "kind", "dtype", "shape", "bytes"),
        [
            (
                x["name"],
                x["kind"],
                x["dtype"],
                "[" + ", ".join(map(str, x["shape"])) + "]",
                _bytes(x["bytes"]),
            )
            for x in s["tensors"]
        ],
    )
    out.append(f"  total {_bytes(s['total_tensor_bytes'])}")
    if s["files"]:
        out += ["", "Files"]
        out += _table(("path", "bytes"), [(f["path"], _bytes(f["bytes"])) for f in s["files"]])
    return "\n".join(out) + "\n"
