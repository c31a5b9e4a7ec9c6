"""The model-runtime command: compile, inspect, run, serve; errors without tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from model_runtime.cli import main
from model_runtime.executable import Executable
from tests.models import make_add_double, make_counter, save

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    # main() configures structlog for the process; leave the next test a clean slate.
    yield
    structlog.reset_defaults()


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return save(make_add_double(), tmp_path / "ad.onnx")


def test_compile_inspect_run(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ad.mrx"
    assert main(["compile", str(model), "-o", str(out), "--batch-size", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert Executable.load(out).metadata.batch_size == 3

    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ad" in text and "sum" in text

    assert main(["inspect", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert json.dumps(doc).count('"double"') >= 1

    assert main(["run", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("sum: float32[3, 4]") for line in lines)
    assert any(line.startswith("double: float32[3, 4]") for line in lines)


def test_compile_with_variable_and_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = save(make_counter(), tmp_path / "counter.onnx")
    argv = ["compile", str(model), "--batch-size", "2", "--variable", "count"]
    argv += ["--variable-update", "count_next=count", "--cache", str(tmp_path / "c")]
    argv += ["--target", "ipu-model", "--optimization-level", "basic"]
    assert main(argv) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.parent == tmp_path / "c"
    m = Executable.load(path).metadata
    assert [a.name for a in m.variables] == ["count"]
    assert m.target.device_kind == "ipu-model"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compile", "{model}", "--batch-size", "-1"], "batch_size must be a positive integer"),
        (["compile", "{model}", "--batch-size", "2", "--target", "tpu"], "unknown target 'tpu'"),
        (["compile", "{model}", "--batch-size", "2", "--variable", "w"], "variable 'w' is not"),
        (["compile", "{model}", "--batch-size", "2", "--variable-update", "x"], "OUTPUT=VARIABLE"),
        (["compile", "{tmp}/absent.onnx", "--batch-size", "2"], "cannot read model"),
        (["inspect", "{model}"], ""),
        (["run", "{tmp}/absent.mrx"], ""),
    ],
)
def test_errors_print_one_line_and_exit_2(
    argv: list[str],
    message: str,
    model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [a.format(model=model, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert "Traceback" not in err


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["compile"])
    assert info.value.code == 2


def test_help_says_serve_speaks_http_and_grpc(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    assert "Open Inference Protocol v2 (HTTP and gRPC)" in out


def test_the_docs_document_admission_and_its_benchmark() -> None:
    page = (REPO / "docs" / "daemon.md").read_text()
    section = page.split("## Admission and overload", 1)[1].split("\n## ", 1)[0]
    assert "`--admission-delay`" in section and "0 turns that" in section
    assert "`make bench-overload`" in section


def test_demo_runs_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "demo: compiling" in out
    assert "predictions [" in out and "for 2 samples" in out


def test_console_script_entry_point(model: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MODEL_RUNTIME_FLAGS", None)
    done = subprocess.run(
        [sys.executable, "-m", "model_runtime.cli", "compile", str(model), "--batch-size", "-1"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr


def test_python_dash_m_and_version_work() -> None:
    import subprocess
    import sys

    from model_runtime import __version__

    done = subprocess.run(
        [sys.executable, "-m", "model_runtime", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"model-runtime {__version__}"
    helped = subprocess.run(
        [sys.executable, "-m", "model_runtime", "compile", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helped.returncode == 0
    text = " ".join(helped.stdout.split())
    for documented in (
        "rows per main-program run",
        "batches one main run consumes",
        "cpu or ipu-model",
        "graph optimisation applied offline",
        "the inputs' batch axis",
    ):
        assert documented in text, documented
