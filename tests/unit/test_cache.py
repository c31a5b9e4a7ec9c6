"""The executable cache: hits skip compilation, keys follow options, files are safe to delete,
MODEL_RUNTIME_FLAGS enables it, and concurrent processes produce exactly one valid file."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from model_runtime.compiler import CompileOptions, cache_key, compile_model
from model_runtime.compiler.source import load_source
from model_runtime.errors import ConfigurationError
from model_runtime.executable import Executable
from model_runtime.flags import get_flags, parse_flags
from tests.models import make_add_double, make_mlp, save

REPO = Path(__file__).resolve().parents[2]


def _events(logs: list[dict[str, object]]) -> list[object]:
    return [entry["event"] for entry in logs]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return save(make_add_double(), tmp_path / "ad.onnx")


def test_second_compile_is_a_hit(model: Path, tmp_path: Path) -> None:
    options = CompileOptions(batch_size=2, executable_cache_path=str(tmp_path / "cache"))
    with capture_logs() as first:
        path = compile_model(model, options=options)
    assert _events(first) == ["compiled executable"]
    assert path.parent == tmp_path / "cache" and path.suffix == ".mrx"
    mtime = path.stat().st_mtime_ns
    with capture_logs() as second:
        again = compile_model(model, options=options)
    assert again == path
    assert _events(second) == ["executable cache hit"]
    assert second[0]["path"] == str(path)
    assert path.stat().st_mtime_ns == mtime
    assert sorted(p.suffix for p in path.parent.iterdir()) == [".lock", ".mrx"]


def test_hit_is_copied_to_the_output_path(model: Path, tmp_path: Path) -> None:
    options = CompileOptions(batch_size=2, executable_cache_path=str(tmp_path / "cache"))
    compile_model(model, options=options)
    with capture_logs() as logs:
        out = compile_model(model, tmp_path / "copy.mrx", options)
    assert _events(logs) == ["executable cache hit"]
    assert out == tmp_path / "copy.mrx"
    assert Executable.load(out).metadata.batch_size == 2


def test_key_follows_model_and_options_not_cache_dir() -> None:
    base = CompileOptions(batch_size=2)
    key = cache_key("a" * 64, base)
    assert key == cache_key("a" * 64, CompileOptions(batch_size=2, executable_cache_path="/x"))
    assert key != cache_key("b" * 64, base)
    for other in (
        CompileOptions(batch_size=4),
        CompileOptions(batch_size=2, optimization_level="basic"),
        CompileOptions(batch_size=2, target="ipu-model"),
        CompileOptions(batch_size=2, device_iterations=3),
        CompileOptions(batch_size=2, model_name="other"),
    ):
        assert cache_key("a" * 64, other) != key


def test_different_options_make_different_files(model: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    a = compile_model(model, options=CompileOptions(batch_size=2, executable_cache_path=cache))
    b = compile_model(model, options=CompileOptions(batch_size=4, executable_cache_path=cache))
    assert a != b
    assert Executable.load(b).metadata.batch_size == 4


def test_deleting_cached_files_is_safe(model: Path, tmp_path: Path) -> None:
    options = CompileOptions(batch_size=2, executable_cache_path=str(tmp_path / "cache"))
    path = compile_model(model, options=options)
    for f in path.parent.iterdir():
        f.unlink()
    with capture_logs() as logs:
        assert compile_model(model, options=options) == path
    assert _events(logs) == ["compiled executable"]
    Executable.load(path)


def test_corrupt_cached_file_is_recompiled(model: Path, tmp_path: Path) -> None:
    options = CompileOptions(batch_size=2, executable_cache_path=str(tmp_path / "cache"))
    path = compile_model(model, options=options)
    path.write_bytes(path.read_bytes()[:100])
    with capture_logs() as logs:
        compile_model(model, options=options)
    assert _events(logs) == ["discarding invalid cached executable", "compiled executable"]
    Executable.load(path)


def test_model_runtime_flags_enable_the_cache(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "flagged"
    monkeypatch.setenv("MODEL_RUNTIME_FLAGS", f"--executable_cache_path={cache}")
    path = compile_model(model, options=CompileOptions(batch_size=2))
    assert path.parent == cache
    with capture_logs() as logs:
        compile_model(model, options=CompileOptions(batch_size=2))
    assert _events(logs) == ["executable cache hit"]


def test_flags_parse() -> None:
    assert parse_flags("").executable_cache_path is None
    assert parse_flags("--executable_cache_path=/tmp/c").executable_cache_path == "/tmp/c"
    assert parse_flags("--executable_cache_path '/tmp/a b'").executable_cache_path == "/tmp/a b"
    assert get_flags({"MODEL_RUNTIME_FLAGS": "--executable_cache_path=d"}).executable_cache_path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("--no_such_flag=1", "unknown flag --no_such_flag"),
        ("--executable_cache_path", "--executable_cache_path needs a value"),
        ("executable_cache_path=/x", "expected a --flag"),
        ("--executable_cache_path='unterminated", "does not parse"),
    ],
)
def test_bad_flags_name_the_flag(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_flags(text)


def test_unknown_flag_in_environment_fails_compile(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_RUNTIME_FLAGS", "--cache_path=/tmp/x")
    with pytest.raises(ConfigurationError, match="unknown flag --cache_path"):
        compile_model(model, tmp_path / "out.mrx")


def test_two_processes_compiling_at_once_make_one_file(tmp_path: Path) -> None:
    model = save(make_mlp(), tmp_path / "mlp.onnx")
    cache = tmp_path / "cache"
    options = CompileOptions(batch_size=4, executable_cache_path=str(cache))
    key = cache_key(load_source(model).sha256, options)
    cache.mkdir()
    # Hold the lock ourselves, start both compilers, and let go only once both are waiting:
    # they are then racing for the same compile, deterministically, with no sleeps.
    lock_fd = os.open(cache / f"{key}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    cmd = [sys.executable, "-m", "model_runtime.cli", "compile", str(model), "--batch-size", "4"]
    cmd += ["--cache", str(cache)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MODEL_RUNTIME_FLAGS", None)
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    try:
        logs: list[list[dict[str, object]]] = [[], []]
        for proc, lines in zip(procs, logs, strict=True):
            assert proc.stderr is not None
            for line in proc.stderr:  # blocks until the process logs that it waits
                lines.append(json.loads(line))
                if lines[-1]["event"] == "waiting for executable cache lock":
                    break
            else:
                pytest.fail(f"compiler exited without waiting: {lines}")
    finally:
        os.close(lock_fd)
    results = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], results
    for (_, rest), lines in zip(results, logs, strict=True):
        lines.extend(json.loads(line) for line in rest.splitlines() if line.startswith("{"))
    finals = sorted(str(lines[-1]["event"]) for lines in logs)
    assert finals == ["compiled executable", "executable cache hit"]
    outputs = {out.strip() for out, _ in results}
    assert outputs == {str(cache / f"{key}.mrx")}
    assert sorted(p.name for p in cache.iterdir()) == [f"{key}.lock", f"{key}.mrx"]
    Executable.load(cache / f"{key}.mrx")
