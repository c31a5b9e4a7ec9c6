"""``model-runtime inspect``: the summary of an executable, as JSON and as text tables."""

from __future__ import annotations

import json
from pathlib import Path

from model_runtime.executable import Executable
from model_runtime.executable.summary import format_summary, summarize
from model_runtime.executable.testing import MAIN_PAYLOAD, tiny_executable


def test_summary_reports_what_inspect_shows(tmp_path: Path) -> None:
    built = tiny_executable(batch_size=3)
    prog, weights = built.save_split(tmp_path / "p.mrx", tmp_path / "w.mrx")
    s = summarize(Executable.load([prog, weights]))
    assert json.loads(json.dumps(s)) == s  # --json prints it as is
    assert s["package_hash"] == built.package_hash
    assert (s["batch_size"], s["device_iterations"], s["replication_factor"]) == (3, 1, 1)
    assert s["target"]["device_kind"] == "cpu"
    x = next(a for a in s["anchors"] if a["name"] == "x")
    assert x == {
        "name": "x", "handle": "x", "role": "user_input", "type": "INPUT", "shape": [3, 4],
        "dtype": "float32", "programs": [1], "batch_dim": 0, "is_per_replica": False,
        "has_data": False, "size_bytes": 48,
    }  # fmt: skip
    assert [p["kind"] for p in s["programs"]] == ["load", "main", "save"]
    main = s["programs"][1]
    assert main["payload"] == MAIN_PAYLOAD and main["payload_bytes"] > 100
    assert s["program_flow"] == {"load": [0], "main": [1], "save": [2]}
    assert s["output_to_variable"] == {"counter_out": "counter"}
    assert {t["name"]: t["bytes"] for t in s["tensors"]}["W"] == 48
    assert s["total_tensor_bytes"] == sum(t["bytes"] for t in s["tensors"])
    assert [f["path"] for f in s["files"]] == [str(prog), str(weights)]
    assert [f["bytes"] for f in s["files"]] == [prog.stat().st_size, weights.stat().st_size]


def test_text_summary_is_an_aligned_table(tmp_path: Path) -> None:
    path = tiny_executable().save(tmp_path / "m.mrx")
    exe = Executable.load(path)
    text = format_summary(exe)
    assert exe.package_hash in text and str(path) in text
    lines = text.splitlines()
    header = lines.index("Anchors") + 1
    columns = lines[header].split()
    assert columns[:5] == ["name", "role", "type", "dtype", "shape"]
    rows = lines[header + 2 : header + 8]
    assert [r.split()[0] for r in rows] == ["x", "y", "W", "b", "counter", "counter_out"]
    # Columns line up: every row puts its role under the "role" heading.
    role_at = lines[header].index("role")
    assert all(r[role_at:].split()[0] in {"user_input", "user_output", "weight", "variable"}
               for r in rows)  # fmt: skip


def test_summary_survives_a_deleted_file(tmp_path: Path) -> None:
    path = tiny_executable().save(tmp_path / "m.mrx")
    exe = Executable.load(path)
    path.unlink()
    assert summarize(exe)["files"] == [{"path": str(path), "bytes": None}]
    assert "?" in format_summary(exe)
