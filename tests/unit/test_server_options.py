"""Daemon options (command line > config file > defaults) and the model repository's names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from model_runtime.errors import (
    ConfigurationError,
    FaultPlanError,
    InputValidationError,
    ModelNotFoundError,
)
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server import build_parser, options_from_args
from model_runtime.server.repository.entries import parse_model_arg
from model_runtime.server.repository.repository import ModelRepository

pytestmark = pytest.mark.timeout(10)


def test_defaults_serve_on_loopback_with_dynamic_batching() -> None:
    opts = options_from_args(build_parser().parse_args([]))
    assert opts.host == "127.0.0.1" and opts.port == 8000
    assert opts.models == [] and opts.model_repository is None
    assert opts.runner.batching_dim == 0 and opts.runner.auto_reset
    assert opts.runner.fault_plan is None
    assert opts.backlog == 2048  # a burst of connections waits in the kernel, not dropped
    assert options_from_args(build_parser().parse_args(["--backlog", "4096"])).backlog == 4096


def test_command_line_overrides_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "serve.toml"
    cfg.write_text(
        '[server]\nport = 9000\nhost = "0.0.0.0"\n'
        "[runner]\nreplication_factor = 3\nmax_retries = 4\n[compile]\nbatch_size = 16\n"
    )
    args = build_parser().parse_args(
        ["--config", str(cfg), "--port", "9100", "--replicas", "2", "--fault-plan", "slow:at=3"]
    )
    opts = options_from_args(args)
    assert (opts.host, opts.port, opts.batch_size) == ("0.0.0.0", 9100, 16)
    assert opts.runner.replication_factor == 2 and opts.runner.max_retries == 4
    assert opts.runner.fault_plan == "slow:at=3"


@pytest.mark.parametrize(
    ("text", "args", "error", "message"),
    [
        ("[runner]\nnope = 1\n", [], ConfigurationError, "unknown field(s) ['nope']"),
        ("[other]\n", [], ConfigurationError, "unknown table(s)"),
        ("not toml ===", [], ConfigurationError, "config file"),
        ("", ["--replicas", "0"], ConfigurationError, "replication_factor"),
        ("", ["--fault-plan", "meteor:at=1"], FaultPlanError, "unknown kind"),
    ],
)
def test_bad_options_are_refused_at_start(
    tmp_path: Path, text: str, args: list[str], error: type[Exception], message: str
) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    with pytest.raises(error) as info:
        options_from_args(build_parser().parse_args(["--config", str(cfg), *args]))
    assert message in str(info.value)


def test_model_arguments() -> None:
    assert parse_model_arg("a/b/resnet.onnx") == ("resnet", Path("a/b/resnet.onnx"))
    assert parse_model_arg("fast=x/model.mrx") == ("fast", Path("x/model.mrx"))
    for bad in ("../x=model.mrx", "model.txt", "a b=model.mrx"):
        with pytest.raises(InputValidationError):
            parse_model_arg(bad)


async def test_repository_refuses_path_tricks(tmp_path: Path) -> None:
    inside = tmp_path / "repo"
    inside.mkdir()
    (inside / "good.mrx").write_bytes(b"")
    (tmp_path / "secret.mrx").write_bytes(b"")
    (inside / "link.mrx").symlink_to(tmp_path / "secret.mrx")
    repo = ModelRepository(ModelRunnerConfig(), directory=inside)
    assert repo.scan() == ["good"]
    # Triton's rules and words for a name to load (ValidateModelName)
    with pytest.raises(InputValidationError, match=r"^Model name cannot be empty"):
        await repo.load(" ")
    for name in ("../secret", "..", "a/b", "/etc/passwd"):
        with pytest.raises(InputValidationError) as info:
            await repo.load(name)
        assert str(info.value) == (
            f"invalid model name '{name}', model name must not contain path traversal characters"
        )
    # Names Triton allows are looked up; no file of the repository can have these.
    for name in (".hidden", ".", "a..b", "x" * 200, "a\\b", "link"):
        with pytest.raises(ModelNotFoundError):
            await repo.load(name)
    with pytest.raises(ModelNotFoundError):
        await repo.unload("secret")


def test_model_control_defaults_are_tritons() -> None:
    opts = options_from_args(build_parser().parse_args([]))
    assert opts.model_control_mode == "none" and opts.load_models == []
    assert opts.strict_readiness is True and opts.repository_poll_secs == 15.0
    opts = options_from_args(
        build_parser().parse_args(
            ["--model-control-mode", "explicit", "--load-model", "a", "--load-model", "b",
             "--no-strict-readiness", "--reload-device-wait", "2"]
        )
    )  # fmt: skip
    assert opts.load_models == ["a", "b"] and opts.strict_readiness is False
    assert opts.reload_device_wait == 2.0


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        ("", ["--load-model", "a"], "--load-model needs --model-control-mode explicit"),
        ("", ["--model-control-mode", "explicit", "--load-model", "*", "--load-model", "a"],
         "give it alone"),
        ("", ["--repository-poll-secs", "5"], "--repository-poll-secs needs"),
        ("", ["--model-control-mode", "poll", "--repository-poll-secs", "0"], "must be > 0"),
        ('[server]\nmodel_control_mode = "sometimes"\n', [], "model control mode must be"),
        ("", ["--reload-device-wait", "-1"], "must be >= 0"),
    ],
)  # fmt: skip
def test_model_control_options_that_would_be_ignored_are_refused(
    tmp_path: Path, text: str, args: list[str], message: str
) -> None:
    cfg = tmp_path / "serve.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        options_from_args(build_parser().parse_args(["--config", str(cfg), *args]))


def test_model_control_from_the_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "serve.toml"
    cfg.write_text(
        '[server]\nmodel_control_mode = "poll"\nrepository_poll_secs = 2.5\n'
        "strict_readiness = false\n"
    )
    opts = options_from_args(build_parser().parse_args(["--config", str(cfg)]))
    assert (opts.model_control_mode, opts.repository_poll_secs) == ("poll", 2.5)
    assert opts.strict_readiness is False


def test_client_shared_memory_is_on_unless_turned_off(tmp_path: Path) -> None:
    assert options_from_args(build_parser().parse_args([])).allow_client_shm
    off = build_parser().parse_args(["--no-allow-client-shm"])
    assert not options_from_args(off).allow_client_shm
    cfg = tmp_path / "c.toml"
    cfg.write_text("[server]\nallow_client_shm = false\n")
    assert not options_from_args(build_parser().parse_args(["--config", str(cfg)])).allow_client_shm
    on = build_parser().parse_args(["--config", str(cfg), "--allow-client-shm"])
    assert options_from_args(on).allow_client_shm


def test_grpc_serves_on_h2corn_where_libnghttp2_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """nghttp2 is the default only where the system library loads; asked for by name on a
    system without it, the daemon refuses to start and says what to install."""
    from model_runtime.server.grpc import nghttp2

    monkeypatch.delenv("MODEL_RUNTIME_GRPC_TRANSPORT", raising=False)
    assert options_from_args(build_parser().parse_args([])).grpc_transport == "nghttp2"
    monkeypatch.setattr(nghttp2, "MISSING", "libnghttp2.so.14 cannot be loaded (test)")
    assert options_from_args(build_parser().parse_args([])).grpc_transport == "native"
    with pytest.raises(ConfigurationError, match="libnghttp2"):
        options_from_args(build_parser().parse_args(["--grpc-transport", "nghttp2"]))


def test_a_system_without_libnghttp2_still_serves_grpc() -> None:
    """The daemon's modules import without the library, and its gRPC default is h2corn."""
    import subprocess
    import sys

    # The binding's ffi (the generated out-of-line module, loaded before the package imports
    # it) with a dlopen that finds no libnghttp2.
    hide = (
        "import importlib.util, os, sys\n"
        "name = 'model_runtime.server.grpc._nghttp2_ffi'\n"
        "root = importlib.util.find_spec('model_runtime').submodule_search_locations[0]\n"
        "path = os.path.join(root, 'server', 'grpc', '_nghttp2_ffi.py')\n"
        "spec = importlib.util.spec_from_file_location(name, path)\n"
        "generated = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(generated)\n"
        "class Hiding:\n"
        "    def __init__(self, ffi): self.ffi = ffi\n"
        "    def __dir__(self): return dir(self.ffi)\n"
        "    def __getattr__(self, attr): return getattr(self.ffi, attr)\n"
        "    def dlopen(self, name, *args):\n"
        "        if 'nghttp2' in str(name):\n"
        "            raise OSError(f'cannot open shared object file {name}')\n"
        "        return self.ffi.dlopen(name, *args)\n"
        "generated.ffi = Hiding(generated.ffi)\n"
        "sys.modules[name] = generated\n"
        "import os\n"
        "os.environ.pop('MODEL_RUNTIME_GRPC_TRANSPORT', None)\n"
        "from model_runtime.server.daemon import serve\n"
        "from model_runtime.server import build_parser, options_from_args\n"
        "print(options_from_args(build_parser().parse_args([])).grpc_transport)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", hide], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["native"]
