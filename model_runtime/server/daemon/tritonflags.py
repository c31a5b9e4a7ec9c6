"""tritonserver's command line as ``model-runtime serve`` takes it: Triton's flags with their
syntax and meaning, so a deployment's ``tritonserver ...`` arguments start the daemon.

Booleans take Triton's ``--flag=true|false`` (also ``1|0``, ``yes|no``, ``on|off``) as well as
our ``--flag`` and ``--no-flag`` (:func:`add_bool`). Flags that only concern GPUs, or settings
that are computed differently here, are accepted and said once, at start, not to apply
(:attr:`TritonFlags.notes`); a value we cannot honour is a
:class:`~model_runtime.errors.ConfigurationError`. Aliases of our own flags (``--http-port``,
``--model-store``, ``--exit-timeout-secs``, ``--http-max-input-size``) live in
:mod:`.options`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model_runtime.errors import ConfigurationError
from model_runtime.server.inference.cache import CacheSettings, parse_cache_config
from model_runtime.server.observability.families import MetricsConfig, parse_metrics_config
from model_runtime.server.observability.trace_config import TraceConfig, parse_trace_config

__all__ = [
    "ACCEPTED",
    "TritonFlags",
    "add_bool",
    "add_triton_arguments",
    "read_triton_flags",
    "truth",
]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

#: ``--backend-config BACKEND,KEY=VALUE`` settings we know, and why each changes nothing here.
_BACKEND_CONFIG: Mapping[str, Mapping[str, str]] = {
    "onnxruntime": {
        "default-max-batch-size": "",  # honoured: TritonFlags.default_max_batch_size
        "enable-global-threadpool": "each device has its own threads (--devices cpu:NxT)",
        "intra_op_thread_count": "each device has its own threads (--devices cpu:NxT)",
        "inter_op_thread_count": "a device runs one program at a time, sequentially",
    },
    "python": {
        "shm-default-byte-size": "python models exchange tensors by their own shared memory",
        "shm-growth-byte-size": "python models exchange tensors by their own shared memory",
        "shm-region-prefix-name": "python models exchange tensors by their own shared memory",
        "stub-timeout-seconds": "an instance process's start is bounded by our own timeout",
    },
}
_GPU_BACKENDS = ("tensorrt", "pytorch", "tensorflow", "openvino", "dali", "fil")

_GPU = "only concerns GPUs, and this server runs on CPUs"

#: Flags (with a value) accepted as changing nothing here, and why.
ACCEPTED: Mapping[str, str] = {
    "pinned-memory-pool-byte-size": _GPU,
    "cuda-memory-pool-byte-size": _GPU,
    "cuda-virtual-address-size": _GPU,
    "min-supported-compute-capability": _GPU,
    "metrics-interval-ms": "metrics are computed when they are scraped",
    "backend-directory": "the backends (onnxruntime, python) are built in",
    "repoagent-directory": "repository agents are not run",
    "http-thread-count": "HTTP is served on the event loop",
    "cache-directory": "the 'local' cache is built in",
}

#: Triton's deprecated trace flags -> the ``--trace-config`` setting each is.
_DEPRECATED_TRACE = {
    "trace-file": "triton,file",
    "trace-level": "level",
    "trace-rate": "rate",
    "trace-count": "count",
    "trace-log-frequency": "triton,log-frequency",
}

#: Triton's metrics port (``--metrics-port 0``: a free one, as ``--port 0``).
DEFAULT_METRICS_PORT = 8002


def truth(value: str) -> bool:
    """A Triton-style boolean flag value.

    Raises:
        argparse.ArgumentTypeError: not a boolean word.
    """
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(
        f"expected true or false, got {value!r} (write --flag=true or --flag=false)"
    )


def add_bool(add: Callable[..., Any], name: str, help: str) -> None:
    """Add the boolean ``--NAME`` (alone: true; ``--NAME=true|false``, Triton's syntax) and
    ``--no-NAME`` (false) to a parser or group through its ``add_argument`` (``add``); the
    value is None when neither is given."""
    dest = name.replace("-", "_")
    add(f"--{name}", dest=dest, nargs="?", const=True, default=None, type=truth,
        metavar="BOOL", help=help)  # fmt: skip
    add(f"--no-{name}", dest=dest, action="store_const", const=False, help=argparse.SUPPRESS)


@dataclass(slots=True)
class TritonFlags:
    """What Triton's flags set beyond our own options.

    ``allow_http`` / ``allow_grpc``: the listeners start; ``allow_metrics``: metrics are
    served (``/metrics`` on the HTTP port, and the metrics listener); ``metrics_port``: that
    listener's port (0: a free one); ``allow_cpu_metrics``: ``nv_cpu_*`` are served;
    ``metrics_config``: ``--metrics-config``; ``cache``: the response cache
    (``--cache-config``, None: none); ``exit_on_error``: a model that fails at start stops
    the daemon (Triton's default: true); ``model_load_thread_count``: models loading at once
    at start;
    ``log_file``: where the log goes (None: stderr); ``auto_complete``: configs are completed
    from the model (off: ``--disable-auto-complete-config``); ``notes``: flags accepted that
    change nothing here, with the reason.
    """

    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    metrics_port: int = DEFAULT_METRICS_PORT
    allow_cpu_metrics: bool = True
    metrics_config: MetricsConfig = field(default_factory=MetricsConfig)
    cache: CacheSettings | None = None
    exit_on_error: bool = True
    model_load_thread_count: int = 4
    log_file: Path | None = None
    log_level: str | None = None
    #: ``--log-info``/``--log-warning``/``--log-error`` given (severity -> on) and
    #: ``--log-verbose`` (``verbose`` -> level): the logging extension's settings at start.
    log_switches: dict[str, int] = field(default_factory=dict)
    #: ``--log-format default|ISO8601`` (Triton's names, reported by the logging extension)
    log_format: str | None = None
    auto_complete: bool = True
    #: ``--backend-config onnxruntime,default-max-batch-size=N``: the batch of a model that
    #: does not give one (our ``--batch-size``, which wins when given).
    default_max_batch_size: int | None = None
    #: ``--trace-config``: the trace settings at start (Triton's defaults: tracing OFF).
    trace: TraceConfig = field(default_factory=TraceConfig)
    notes: list[str] = field(default_factory=list)


def add_triton_arguments(parser: argparse.ArgumentParser) -> None:
    """Add Triton's own flags, in a group of ``serve --help``."""
    group = parser.add_argument_group(
        "tritonserver's flags",
        "Triton's command line, with its meaning (booleans also as --flag=true|false)",
    )
    a = group.add_argument
    add_bool(a, "allow-http", "serve HTTP (default true)")
    add_bool(a, "allow-grpc", "serve gRPC (default true)")
    add_bool(a, "allow-metrics", "serve Prometheus metrics (default true)")
    a("--metrics-port", type=int, metavar="PORT",
      help=f"the metrics listener's port, /metrics on --host ({DEFAULT_METRICS_PORT}; "
      "0: a free one); /metrics is on the HTTP port as well")  # fmt: skip
    add_bool(a, "allow-cpu-metrics", "serve nv_cpu_* metrics (default true)")
    a("--metrics-config", action="append", metavar="KEY=VALUE",
      help="summary_latencies=true, histogram_latencies=true, counter_latencies=false, "
      "summary_quantiles=Q:E,... (repeatable)")  # fmt: skip
    a(
        "--cache-config",
        action="append",
        metavar="local,size=BYTES",
        help="the response cache, for models whose config enables it (response_cache)",
    )
    a(
        "--response-cache-byte-size",
        type=int,
        metavar="BYTES",
        help="Triton's older --cache-config local,size=BYTES",
    )
    add_bool(a, "exit-on-error",
             "stop the daemon when a model fails to load at start (default true, as "
             "Triton's; false: the others serve)")  # fmt: skip
    a("--model-load-thread-count", type=int, metavar="N",
      help="models loading at once at start (default 4)")  # fmt: skip
    a("--log-verbose", type=int, metavar="LEVEL", help="> 0: debug logs")
    add_bool(a, "log-info", "info logs (default true)")
    add_bool(a, "log-warning", "warning logs (default true)")
    add_bool(a, "log-error", "error logs (default true)")
    a("--log-file", metavar="FILE", help="write the log to FILE (appended) instead of stderr")
    a("--backend-config", action="append", metavar="BACKEND,KEY=VALUE",
      help="a backend's setting (repeatable); those that change nothing here are said so "
      "at start")  # fmt: skip
    add_bool(a, "disable-auto-complete-config",
             "models' configs are not completed from the model: each config.pbtxt gives "
             "max_batch_size, input and output")  # fmt: skip
    add_bool(a, "strict-model-config", "Triton's older name of --disable-auto-complete-config")
    a("--trace-config", action="append", metavar="[MODE,]SETTING=VALUE",
      help="request tracing (repeatable): level=TIMESTAMPS, rate=N, count=N, "
      "mode=triton|opentelemetry, triton,file=PATH, triton,log-frequency=N, "
      "opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE")  # fmt: skip
    for old, new in _DEPRECATED_TRACE.items():
        a(f"--{old}", action="append", metavar="VALUE", help=f"Triton's older --trace-config {new}")
    add_bool(a, "allow-gpu-metrics", f"accepted: {_GPU}")
    for name, why in ACCEPTED.items():
        a(f"--{name}", action="append", metavar="VALUE", help=f"accepted: {why}")


def read_triton_flags(args: argparse.Namespace) -> TritonFlags:
    """Triton's flags from the parsed command line.

    Raises:
        ConfigurationError: a value out of range, or a backend setting we do not know.
    """
    flags = TritonFlags()

    def given(name: str) -> Any:
        return getattr(args, name, None)

    older = [
        f"{new}={value}"
        for old, new in _DEPRECATED_TRACE.items()
        for value in given(old.replace("-", "_")) or []
    ]
    flags.trace = parse_trace_config(older + (given("trace_config") or []))
    for name in ("allow_http", "allow_grpc", "allow_metrics", "allow_cpu_metrics", "exit_on_error"):
        if given(name) is not None:
            setattr(flags, name, bool(given(name)))
    if given("metrics_port") is not None:
        if not 0 <= given("metrics_port") <= 65535:
            raise ConfigurationError(
                f"--metrics-port must be in 0..65535, got {given('metrics_port')}"
            )
        flags.metrics_port = given("metrics_port")
    if given("model_load_thread_count") is not None:
        if given("model_load_thread_count") < 1:
            raise ConfigurationError(
                f"--model-load-thread-count must be >= 1, got {given('model_load_thread_count')}"
            )
        flags.model_load_thread_count = given("model_load_thread_count")
    flags.metrics_config = parse_metrics_config(given("metrics_config") or [])
    byte_size = given("response_cache_byte_size")
    if byte_size is not None and byte_size < 0:
        raise ConfigurationError(f"--response-cache-byte-size must be >= 0, got {byte_size}")
    flags.cache = parse_cache_config(given("cache_config") or [], byte_size)
    if flags.cache is not None and flags.cache.size == 0:
        flags.cache = None  # Triton's size 0: no cache
    if given("log_file"):
        flags.log_file = Path(given("log_file"))
    flags.log_level = _log_level(args)
    for name in ("info", "warning", "error"):
        if given(f"log_{name}") is not None:
            flags.log_switches[name] = bool(given(f"log_{name}"))
    if given("log_verbose") is not None:
        if given("log_verbose") < 0:
            raise ConfigurationError(f"--log-verbose must be >= 0, got {given('log_verbose')}")
        flags.log_switches["verbose"] = int(given("log_verbose"))
    if given("disable_auto_complete_config") or given("strict_model_config"):
        flags.auto_complete = False
    if given("allow_gpu_metrics") is not None:
        flags.notes.append(f"--allow-gpu-metrics: {_GPU}")
    for name, why in ACCEPTED.items():
        if given(name.replace("-", "_")):
            flags.notes.append(f"--{name}: {why}")
    for setting in given("backend_config") or []:
        note = _backend_config(setting)
        if setting.startswith("onnxruntime,default-max-batch-size="):
            value = setting.partition("=")[2]
            if not value.isdigit() or int(value) < 1:
                raise ConfigurationError(f"--backend-config {setting!r}: give a batch size >= 1")
            flags.default_max_batch_size = int(value)
        else:
            flags.notes.append(note)
    return flags


def _log_level(args: argparse.Namespace) -> str | None:
    """The log level Triton's log flags start from (None: they do not say): debug with
    ``--log-verbose`` > 0, else info; the severities they turn on or off one by one
    (``--log-info=false --log-verbose=1``, ``--log-error=false``) are
    :attr:`TritonFlags.log_switches`, applied over it."""
    if (getattr(args, "log_verbose", None) or 0) > 0:
        return "debug"
    given = [getattr(args, n, None) for n in ("log_info", "log_warning", "log_error")]
    if any(v is not None for v in given) or getattr(args, "log_verbose", None) == 0:
        return "info"
    return None


def _backend_config(setting: str) -> str:
    """The note for one ``--backend-config`` value.

    Raises:
        ConfigurationError: malformed, or a setting of a backend we serve that we do not know.
    """
    backend, _, rest = setting.partition(",")
    key, eq, _ = rest.partition("=")
    if not backend or not eq or not key:
        raise ConfigurationError(
            f"--backend-config {setting!r}: expected BACKEND,KEY=VALUE (e.g. "
            "onnxruntime,default-max-batch-size=4)"
        )
    if backend in _GPU_BACKENDS:
        return f"--backend-config {setting}: the {backend} backend is not served here"
    known = _BACKEND_CONFIG.get(backend)
    if known is None:
        raise ConfigurationError(
            f"--backend-config {setting!r}: no backend {backend!r} (served: "
            f"{', '.join(_BACKEND_CONFIG)})"
        )
    if key not in known:
        raise ConfigurationError(
            f"--backend-config {setting!r}: {backend} has no setting {key!r} we know "
            f"({', '.join(sorted(known))})"
        )
    return f"--backend-config {setting}: {known[key]}"
