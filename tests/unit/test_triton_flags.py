"""tritonserver's command line: Triton's flags with its syntax (``--flag=true|false``), the
command lines of its deployment docs and QA scripts, and what each flag sets."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from model_runtime.errors import ConfigurationError
from model_runtime.server import build_parser, options_from_args
from model_runtime.server.daemon.options import DaemonOptions

pytestmark = pytest.mark.timeout(10)


def parse(line: str) -> DaemonOptions:
    return options_from_args(build_parser().parse_args(shlex.split(line)))


@pytest.fixture
def repos(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    return a, b


@pytest.mark.parametrize(
    "name",
    [
        "strict-readiness",
        "auto-reset",
        "access-log",
        "reuse-port",
        "allow-client-shm",
        "allow-http",
        "allow-grpc",
        "allow-metrics",
        "exit-on-error",
    ],
)
def test_every_boolean_flag_takes_tritons_syntax_and_ours(name: str) -> None:
    def value(line: str) -> object:
        opts = parse(line)
        key = name.replace("-", "_")
        for holder in (opts.triton, opts.runner, opts):  # auto_reset is a runner setting
            if hasattr(holder, key):
                return getattr(holder, key)
        raise AssertionError(key)

    for line, want in [
        (f"--{name}=false", False),
        (f"--{name}=0", False),
        (f"--{name}=true", True),
        (f"--{name}=1", True),
        (f"--{name}", True),
        (f"--no-{name}", False),
        (f"--{name} false", False),
    ]:
        assert value(line) is want, line


def test_a_boolean_flag_with_another_word_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--strict-readiness=maybe"])
    assert "expected true or false, got 'maybe'" in capsys.readouterr().err


def test_a_model_after_a_negated_flag_stays_a_model() -> None:
    args = build_parser().parse_args(["--no-access-log", "m=model.onnx"])
    assert (args.access_log, args.models) == (False, ["m=model.onnx"])


def test_tritons_qa_and_deployment_command_lines_parse(repos: tuple[Path, Path]) -> None:
    a, b = repos
    # L0_lifecycle's SERVER_ARGS, a Kubernetes manifest's args, a docker-compose command.
    lifecycle = parse(
        f"--model-repository={a} --exit-timeout-secs=5 --strict-readiness=false "
        "--exit-on-error=false --model-control-mode=explicit --load-model=*"
    )
    assert (lifecycle.model_repository, lifecycle.grace_period) == (a, 5.0)
    assert lifecycle.strict_readiness is False and lifecycle.triton.exit_on_error is False
    k8s = parse(
        f"--model-store={a} --strict-model-config=false --log-verbose=1 --allow-gpu-metrics=false "
        "--http-port=8000 --grpc-port=8001 --metrics-port=8002 --model-load-thread-count=8"
    )
    assert (k8s.model_repository, k8s.port, k8s.grpc_port) == (a, 8000, 8001)
    assert k8s.triton.auto_complete is True  # strict-model-config=false: completed
    assert (k8s.log_level, k8s.triton.metrics_port, k8s.triton.model_load_thread_count) == (
        "debug",
        8002,
        8,
    )
    assert any("--allow-gpu-metrics" in note for note in k8s.triton.notes)
    compose = parse(
        f"--model-repository={a} --model-repository={b} --allow-grpc=false --allow-metrics=0 "
        "--log-info=false --log-format=ISO8601 "
        "--backend-config=onnxruntime,default-max-batch-size=4 "
        "--backend-config=python,shm-default-byte-size=1048576 --pinned-memory-pool-byte-size=0 "
        "--cuda-memory-pool-byte-size=0:0 --backend-directory=/opt/tritonserver/backends "
        "--metrics-interval-ms=1000 --disable-auto-complete-config"
    )
    assert (compose.model_repository, compose.more_repositories) == (a, [b])
    assert compose.triton.allow_grpc is False and compose.triton.allow_metrics is False
    assert (compose.log_level, compose.log_format) == ("info", "auto")
    assert compose.triton.log_format == "ISO8601"  # reported as given (logging extension)
    assert compose.triton.log_switches == {"info": False}  # INFO lines off, warnings on
    assert compose.batch_size == 4  # onnxruntime's default-max-batch-size
    assert compose.triton.auto_complete is False
    said = "\n".join(compose.triton.notes)
    for flag in (
        "python,shm-default-byte-size",
        "--pinned-memory-pool-byte-size",
        "--cuda-memory-pool-byte-size",
        "--backend-directory",
        "--metrics-interval-ms",
    ):
        assert flag in said


def test_defaults_without_tritons_flags() -> None:
    opts = parse("")
    t = opts.triton
    assert (t.allow_http, t.allow_grpc, t.allow_metrics) == (True, True, True)
    assert (t.metrics_port, t.model_load_thread_count, t.exit_on_error) == (8002, 4, True)
    assert (t.log_file, t.auto_complete, t.notes) == (None, True, [])
    assert (opts.log_level, opts.batch_size) == ("info", 8)


def test_our_own_flags_win_over_tritons_equivalents() -> None:
    opts = parse(
        "--log-level error --log-verbose=1 --batch-size 2 "
        "--backend-config=onnxruntime,default-max-batch-size=4"
    )
    assert (opts.log_level, opts.batch_size) == ("error", 2)
    assert opts.triton.log_switches == {}


def test_the_log_file_and_verbosity(tmp_path: Path) -> None:
    opts = parse(f"--log-file={tmp_path / 'server.log'} --log-verbose=0 --log-warning=false")
    assert opts.triton.log_file == tmp_path / "server.log"
    assert opts.log_level == "info"  # warnings off, as Triton: info and errors stay on
    assert opts.triton.log_switches == {"warning": False, "verbose": 0}


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("--backend-config=onnxruntime", "expected BACKEND,KEY=VALUE"),
        ("--backend-config=tvm,x=1", "no backend 'tvm'"),
        ("--backend-config=onnxruntime,bogus=1", "onnxruntime has no setting 'bogus'"),
        ("--backend-config=onnxruntime,default-max-batch-size=0", "a batch size >= 1"),
        ("--model-load-thread-count=0", "--model-load-thread-count must be >= 1"),
        ("--metrics-port=70000", "--metrics-port must be in 0..65535"),
        ("--log-verbose=-1", "--log-verbose must be >= 0"),
        ("--trace-config=mode=zipkin", "mode is triton or opentelemetry"),
        ("--trace-config=level=ALL", "level is OFF, TIMESTAMPS or TENSORS"),
        ("--trace-config=rate=x", "rate=x: expected an integer"),
        ("--trace-config=count=-2", "count=-2: expected -1.."),
        ("--trace-config=triton,url=x", "triton mode has no setting 'url'"),
        ("--trace-config=opentelemetry,resource=x", "resource is KEY=VALUE"),
        ("--trace-config=jaeger,url=x", "no trace mode 'jaeger'"),
        (
            "--cache-config=local,size=8192 --cache-config=redis,key=value",
            "multiple cache configurations",
        ),
        (
            "--response-cache-byte-size=12345 --cache-config=local,size=67890",
            "incompatible flags",
        ),
        ("--cache-config=redis,host=localhost", "only the 'local' cache is built in"),
        ("--cache-config=local,size=big", "give a size in bytes"),
        ("--metrics-config=summary_latencies=maybe", "expected true or false"),
        ("--metrics-config=summary_quantiles=1.5:0.1", "each quantile is a number in (0, 1)"),
        ("--metrics-config=bogus=1", "unknown key 'bogus'"),
    ],
)
def test_values_we_cannot_honour_are_refused_at_start(line: str, said: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse(line)
    assert said in str(info.value)


def test_the_cache_and_metrics_configs_of_tritons_qa_command_lines() -> None:
    t = parse("--cache-config local,size=10480").triton
    assert t.cache is not None and (t.cache.implementation, t.cache.size) == ("local", 10480)
    assert parse("--response-cache-byte-size=8192").triton.cache.size == 8192  # type: ignore[union-attr]
    assert parse("--cache-config=local,size=0").triton.cache is None
    assert parse("").triton.cache is None
    config = parse(
        "--metrics-config summary_latencies=true --metrics-config counter_latencies=false "
        "--metrics-config summary_quantiles=0.1:0.0.1,0.7:0.01,0.75:0.01"
    ).triton.metrics_config
    assert (config.summary_latencies, config.counter_latencies) == (True, False)
    assert (config.histogram_latencies, config.quantiles) == (False, (0.1, 0.7, 0.75))


def test_a_gpu_backends_setting_is_said_not_to_apply() -> None:
    opts = parse("--backend-config=tensorrt,coalesce-request-input=true")
    assert opts.triton.notes == [
        "--backend-config tensorrt,coalesce-request-input=true: the tensorrt backend is not "
        "served here"
    ]


def test_serve_help_groups_tritons_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "tritonserver's flags" in out
    group = out.index("tritonserver's flags:")
    for flag in ("--allow-http", "--model-load-thread-count", "--backend-config"):
        assert out.index(f"\n  {flag}") > group, flag


def test_trace_config_as_tritons_docs_write_it() -> None:
    opts = parse(
        "--trace-config triton,file=/tmp/trace.json --trace-config triton,log-frequency=50 "
        "--trace-config rate=100 --trace-config level=TIMESTAMPS --trace-config level=TENSORS "
        "--trace-config count=100"
    )
    trace = opts.triton.trace
    assert (trace.file, trace.log_frequency, trace.rate, trace.count) == (
        "/tmp/trace.json",
        50,
        100,
        100,
    )
    assert trace.level == ("TIMESTAMPS", "TENSORS") and trace.mode == "triton"
    otel = parse(
        "--trace-config mode=opentelemetry "
        "--trace-config opentelemetry,url=http://c:4318/v1/traces "
        "--trace-config opentelemetry,resource=service.name=triton "
        "--trace-config opentelemetry,resource=service.version=1"
    ).triton.trace
    assert otel.mode == "opentelemetry" and otel.url == "http://c:4318/v1/traces"
    assert otel.resource == {"service.name": "triton", "service.version": "1"}
    assert parse("").triton.trace.level == ()  # Triton's default: tracing OFF
    older = parse("--trace-file=/tmp/t.json --trace-level=TIMESTAMPS --trace-rate=5").triton.trace
    assert (older.file, older.level, older.rate) == ("/tmp/t.json", ("TIMESTAMPS",), 5)


@pytest.mark.parametrize(
    ("line", "switches"),
    [  # qa/L0_logging's command lines
        ("--log-error=false", {"error": False}),
        ("--log-info=false --log-verbose=1", {"info": False, "verbose": 1}),
        ("--log-warn=false", {"warning": False}),
    ],
)
def test_log_flags_switch_each_severity(line: str, switches: dict[str, int]) -> None:
    assert parse(line).triton.log_switches == switches
