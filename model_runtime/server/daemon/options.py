"""Daemon options: the ``serve`` command line, the TOML config file, and how they combine.

Precedence: command line > config file > defaults. The config file has three tables::

    [server]   host, port, grpc_port, max_body_size, request_timeout, grace_period,
               model_repository, executable_cache, models (list of "NAME=PATH" or "PATH"),
               model_control_mode, load_model (list), repository_poll_secs, strict_readiness,
               reload_device_wait, allow_client_shm
    [runner]   any scalar ModelRunnerConfig field (replication_factor, timeout, auto_reset,
               max_retries, execution_timeout, fault_plan, batching_dim, ...)
    [compile]  batch_size (for .onnx models compiled on load)
"""

from __future__ import annotations

import argparse
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from model_runtime.errors import ConfigurationError
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.daemon.tritonflags import (
    TritonFlags,
    add_bool,
    add_triton_arguments,
    read_triton_flags,
    truth,
)
from model_runtime.server.grpc import nghttp2
from model_runtime.server.security import tls as security
from model_runtime.server.security.restrict import GROUPS, GRPC_KEY_PREFIX, Restrictions
from model_runtime.server.security.tls import TLSFiles

__all__ = [
    "DaemonOptions",
    "add_serve_arguments",
    "default_cache_dir",
    "options_from_args",
    "tls_files",
]

CONTROL_MODES = ("none", "explicit", "poll")

_RUNNER_FIELDS = {
    f.name
    for f in fields(ModelRunnerConfig)
    if f.name
    not in {
        "frozen_inputs",
        "replica_to_save_programs_outputs",
        "replica_to_device",
        "flush_callback",
    }
}


def default_grpc_transport() -> str:
    """``$MODEL_RUNTIME_GRPC_TRANSPORT``, else nghttp2 where the system has libnghttp2, else
    native (h2corn)."""
    return os.environ.get("MODEL_RUNTIME_GRPC_TRANSPORT") or (
        "nghttp2" if nghttp2.MISSING is None else "native"
    )


def default_cache_dir() -> Path:
    """Where ``.onnx`` models are compiled to unless told otherwise (XDG cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "model-runtime" / "executables"


@dataclass(slots=True)
class DaemonOptions:
    """Everything ``run_daemon`` needs; see :func:`add_serve_arguments` for the meanings."""

    models: list[str] = field(default_factory=list)
    model_repository: Path | None = None
    #: Further repository directories (Triton's repeated ``--model-repository``).
    more_repositories: list[Path] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8000
    #: The gRPC listener's port (on ``host``, like HTTP); 0 picks a free one.
    grpc_port: int = 8001
    #: The gRPC transport: ``nghttp2`` (libnghttp2 on the event loop), ``native`` (h2corn) or
    #: ``aio`` (grpcio's asyncio server); the
    #: environment's ``MODEL_RUNTIME_GRPC_TRANSPORT`` is the default the command line overrides.
    grpc_transport: str = field(default_factory=lambda: default_grpc_transport())
    batch_size: int = 8
    max_body_size: int = 64 << 20
    request_timeout: float | None = 60.0
    header_timeout: float = 10.0
    keepalive_timeout: float = 75.0
    max_connections: int | None = None
    #: The listen backlog: a burst of new connections waits in the kernel instead of being
    #: dropped (the OS caps it at net.core.somaxconn).
    backlog: int = 2048
    #: Bind the HTTP and gRPC ports with SO_REUSEPORT, so that several daemons (each with its
    #: own devices and models) share one port and the kernel spreads connections over them.
    #: They share nothing else: health, metrics, model control, clients' shared-memory regions
    #: and sequences are each daemon's own. Off: a port in use is an error.
    reuse_port: bool = False
    access_log: bool = True
    #: Seconds of work a model may hold at the front end before new requests are refused
    #: unread (admission control); None turns that limit off.
    admission_delay: float | None = 1.0
    grace_period: float = 30.0
    executable_cache: Path | None = None
    log_level: str = "info"
    log_format: str = "auto"
    model_control_mode: str = "none"
    load_models: list[str] = field(default_factory=list)
    repository_poll_secs: float = 15.0
    strict_readiness: bool = True
    reload_device_wait: float = 10.0
    #: Triton's ``--allow-client-shm``: clients may register system shared memory regions
    #: (None: on where ``host`` is loopback, the only place a client can share memory with the
    #: daemon; off elsewhere).
    allow_client_shm: bool | None = None
    #: ``--ray``: serve on the Ray cluster at this address (``auto``; ``local`` starts one)
    #: instead of as a daemon; None: the daemon. See :mod:`model_runtime.ray`.
    ray_address: str | None = None
    #: Ray Serve replicas (each hosts the runtime on ``ray_cpus`` CPUs of its node).
    ray_replicas: int = 1
    ray_cpus: float = 1.0
    #: Triton's restricted API groups per protocol, as its flags give them
    #: (``<group>[,<group>...]:<key>=<value>``, see :mod:`model_runtime.server.security.restrict`).
    http_restricted_api: list[str] = field(default_factory=list)
    grpc_restricted_protocol: list[str] = field(default_factory=list)
    #: Start off loopback with an open repository API (see :mod:`.security`).
    allow_unrestricted_control: bool = False
    #: TLS per listener: ``use_ssl``, ``server_cert``, ``server_key``, ``root_cert``,
    #: ``use_ssl_mutual`` (Triton's gRPC flags; HTTP's in the same style).
    grpc_tls: dict[str, Any] = field(default_factory=dict)
    http_tls: dict[str, Any] = field(default_factory=dict)
    #: Triton's flags beyond ours (listeners, metrics port, start-up loads, log file...).
    triton: TritonFlags = field(default_factory=TritonFlags)
    runner: ModelRunnerConfig = field(
        default_factory=lambda: ModelRunnerConfig(
            batching_dim=0,
            timeout=0.002,
            auto_reset=True,
            run_save_programs=True,
            # No runner budget: the front end's admission refuses an open loop past capacity
            # and never a closed loop (Triton queues those however slow the model); a budget
            # here refused closed-loop clients of a slow model. On Ray, where the front end
            # has no admission, the deployment sets one (model_runtime.ray.deployment).
            latency_budget=None,
        )
    )


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``serve`` options to ``parser`` (every default is None: see precedence)."""
    a = parser.add_argument
    a("models", nargs="*", metavar="MODEL", help="an .mrx or .onnx file, as PATH or NAME=PATH")
    a("--model-repository", "--model-store", action="append", metavar="DIR",
      help="a directory of models (NAME.mrx / NAME.onnx files, Triton model directories); "
      "repeatable")  # fmt: skip
    a("--host", help="address to bind (default 127.0.0.1)")
    a("--port", "--http-port", dest="port", type=int,
      help="HTTP port to bind (default 8000; 0 picks a free one)")  # fmt: skip
    a("--grpc-port", type=int,
      help="gRPC port (Triton's GRPCInferenceService) on --host (8001; 0: a free one)")  # fmt: skip
    a("--grpc-transport", choices=("nghttp2", "native", "aio"),
      help="gRPC's HTTP/2 transport: nghttp2 (the system's libnghttp2 on the event loop; "
      "ModelInfer answered without a task per call), native (h2corn) or aio (grpcio's "
      "asyncio server); default $MODEL_RUNTIME_GRPC_TRANSPORT, else nghttp2 where libnghttp2 "
      "is installed, else native")  # fmt: skip
    a("--replicas", type=int, help="replicas per model (default 1)")
    a("--batch-size", type=int, help="batch size .onnx models are compiled for (default 8)")
    a("--config", metavar="FILE", help="TOML config file ([server], [runner], [compile])")
    a("--fault-plan", help='inject faults, e.g. "recoverable:every=50" (default: none)')
    a("--batch-timeout", type=float, help="seconds before a partial batch flushes (0.002)")
    a("--execution-timeout", type=float, help="seconds a device run may take before a reset")
    add_bool(a, "auto-reset", "reset a failed device and retry (default on)")
    a("--max-retries", type=int, help="retries of a request after device resets")
    a("--request-timeout", type=float, help="seconds per request before 503 (default 60)")
    a("--max-body-size", "--http-max-input-size", dest="max_body_size", type=int,
      help="largest request body in bytes, inflated (default 64 MiB; Triton's flag)")  # fmt: skip
    a("--header-timeout", type=float, help="seconds to receive a request head (default 10)")
    a("--keepalive-timeout", type=float, help="seconds an idle connection stays open (75)")
    a("--max-connections", type=int, help="open connections before 503 (default: from ulimit)")
    a("--backlog", type=int, help="listen backlog for bursts of new connections (2048)")
    add_bool(
        a,
        "reuse-port",
        "bind the HTTP and gRPC ports with SO_REUSEPORT: several daemons share them, "
        "the kernel spreading connections; nothing else is shared (health, metrics, model "
        "control, shared memory, sequences: each daemon's own); default off",
    )
    a("--admission-delay", type=float,
      help="seconds of work a model may hold before new requests are refused unread with 503 "
      "(default 1; 0 turns it off)")  # fmt: skip
    add_bool(a, "access-log", "one INFO log line per request (default on)")
    a("--grace-period", "--exit-timeout-secs", dest="grace_period", type=float,
      help="seconds to drain on SIGTERM (default 30)")  # fmt: skip
    a("--executable-cache", metavar="DIR", help="executable cache for .onnx models")
    a("--log-level", choices=["debug", "info", "warning", "error"], help="default info")
    a("--log-format", choices=["auto", "json", "console", "default", "ISO8601"],
      help="auto: JSON off a terminal (Triton's default and ISO8601: auto, whose "
      "timestamps are ISO 8601)")  # fmt: skip
    a("--model-control-mode", choices=CONTROL_MODES,
      help="none (default): load every model at start, the repository API cannot load or "
      "unload; explicit: the API loads and unloads, --load-model at start; poll: follow the "
      "files (added, changed, removed) every --repository-poll-secs")  # fmt: skip
    a("--load-model", action="append", metavar="NAME",
      help="explicit mode: load NAME at start (repeatable; '*' alone: every model)")  # fmt: skip
    a("--repository-poll-secs", type=float, help="poll mode: seconds between polls (15)")
    add_bool(
        a,
        "strict-readiness",
        "ready only while every model that should be loaded is ready (default on); off: "
        "ready while the server can serve",
    )
    a("--reload-device-wait", type=float,
      help="seconds a reload waits for free devices to load the new version beside the "
      "serving one (default 10)")  # fmt: skip
    add_bool(
        a,
        "allow-client-shm",
        "clients may register system shared memory regions (Triton's extension; default: "
        "on with a loopback --host, off otherwise; the daemon maps the POSIX shared memory "
        "objects they name)",
    )
    a("--http-restricted-api", action="append", metavar="APIS:KEY=VALUE",
      help="Triton's: restrict API groups (comma-separated: " + ", ".join(GROUPS) + ") to "
      "HTTP requests with header KEY: VALUE (repeatable)")  # fmt: skip
    a("--grpc-restricted-protocol", action="append", metavar="PROTOCOLS:KEY=VALUE",
      help="Triton's: restrict groups to gRPC calls with metadata triton-grpc-protocol-KEY: "
      "VALUE (repeatable)")  # fmt: skip
    a("--allow-unrestricted-control", action="store_true", default=None,
      help="start off loopback with a model control mode and the model-repository group "
      "unrestricted (refused without this)")  # fmt: skip
    for proto in ("grpc", "http"):
        a(f"--{proto}-use-ssl", nargs="?", const=True, type=truth, metavar="BOOL",
          help=f"{proto.upper()} over TLS (Triton's style: --{proto}-use-ssl[=true])")  # fmt: skip
        a(f"--{proto}-use-ssl-mutual", nargs="?", const=True, type=truth, metavar="BOOL",
          help="and require client certificates checked against the root certificate")  # fmt: skip
        a(f"--{proto}-server-cert", metavar="PEM", help=f"the {proto} listener's certificate")
        a(f"--{proto}-server-key", metavar="PEM", help=f"the {proto} listener's private key")
        a(f"--{proto}-root-cert", metavar="PEM", help="root certificate for client certificates")
    a("--ray", nargs="?", const="auto", metavar="ADDRESS",
      help="serve as a Ray Serve application on the cluster at ADDRESS, not as a daemon "
      "(default auto: this machine's cluster, else a local one; the 'ray' extra)")  # fmt: skip
    a("--ray-replicas", type=int, help="with --ray: Ray Serve replicas (default 1)")
    a("--ray-cpus", type=float, help="with --ray: CPUs (cpu devices) per Ray replica (default 1)")
    add_triton_arguments(parser)


def _access(opts: DaemonOptions, args: argparse.Namespace) -> None:
    """Restrictions and TLS from the command line, checked now (a bad flag or certificate
    stops the start)."""
    opts.http_restricted_api = list(getattr(args, "http_restricted_api", None) or [])
    opts.grpc_restricted_protocol = list(getattr(args, "grpc_restricted_protocol", None) or [])
    opts.allow_unrestricted_control = bool(getattr(args, "allow_unrestricted_control", None))
    for proto in ("grpc", "http"):
        tls = {
            name: getattr(args, f"{proto}_{name}", None)
            for name in ("use_ssl", "use_ssl_mutual", "server_cert", "server_key", "root_cert")
        }
        setattr(opts, f"{proto}_tls", {k: v for k, v in tls.items() if v is not None})
    if opts.ray_address is not None:
        given = [
            flag
            for flag, on in (
                ("--http-restricted-api", opts.http_restricted_api),
                ("--grpc-restricted-protocol", opts.grpc_restricted_protocol),
                ("--grpc-use-ssl", opts.grpc_tls.get("use_ssl")),
                ("--http-use-ssl", opts.http_tls.get("use_ssl")),
            )
            if on
        ]
        if given:  # Ray Serve's proxy is the listener there: these would hold nowhere
            raise ConfigurationError(
                f"{', '.join(given)}: not with --ray (Ray Serve's proxy listens; secure it there)"
            )
    # Checked now: a bad rule, a missing certificate or one without its key stops the start.
    http = Restrictions.parse(opts.http_restricted_api, kind="api")
    grpc = Restrictions.parse(
        opts.grpc_restricted_protocol, kind="protocol", prefix=GRPC_KEY_PREFIX
    )
    for proto in ("grpc", "http"):
        files = tls_files(opts, proto)
        if files is not None:
            security.ssl_context(files)
    if opts.allow_client_shm is None:
        opts.allow_client_shm = security.is_loopback(opts.host)
    security.check_exposure(
        opts.host,
        opts.model_control_mode,
        http,
        grpc,
        client_shm=opts.allow_client_shm,
        allow_unrestricted=opts.allow_unrestricted_control,
    )


def tls_files(opts: DaemonOptions, protocol: str) -> TLSFiles | None:
    """The TLS files of a listener (None: no TLS).

    Raises:
        ConfigurationError: the flags do not make a TLS setup.
    """
    tls = opts.grpc_tls if protocol == "grpc" else opts.http_tls
    return TLSFiles.from_flags(
        protocol,
        bool(tls.get("use_ssl")),
        tls.get("server_cert"),
        tls.get("server_key"),
        tls.get("root_cert"),
        bool(tls.get("use_ssl_mutual")),
    )


def _load_config(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"config file {path}: {exc}") from exc
    unknown = set(doc) - {"server", "runner", "compile"}
    if unknown:
        raise ConfigurationError(f"config file {path}: unknown table(s) {sorted(unknown)}")
    return doc


def options_from_args(args: argparse.Namespace) -> DaemonOptions:
    """Combine the parsed command line with the config file it names.

    Raises:
        ConfigurationError: the config file cannot be read, or a value is unknown or invalid.
    """
    opts = DaemonOptions()
    doc = _load_config(args.config) if getattr(args, "config", None) else {}
    server = dict(doc.get("server", {}))
    runner = dict(doc.get("runner", {}))
    compile_ = dict(doc.get("compile", {}))
    bad = set(runner) - _RUNNER_FIELDS
    if bad:
        raise ConfigurationError(f"[runner]: unknown field(s) {sorted(bad)}")
    if set(compile_) - {"batch_size"}:
        raise ConfigurationError(f"[compile]: unknown field(s) {sorted(set(compile_))}")

    def pick(cli: str, table: dict[str, Any], key: str) -> Any:
        value = getattr(args, cli, None)
        return table.get(key) if value is None else value

    for name, cli in [
        ("host", "host"),
        ("port", "port"),
        ("grpc_port", "grpc_port"),
        ("grpc_transport", "grpc_transport"),
        ("max_body_size", "max_body_size"),
        ("request_timeout", "request_timeout"),
        ("header_timeout", "header_timeout"),
        ("keepalive_timeout", "keepalive_timeout"),
        ("max_connections", "max_connections"),
        ("backlog", "backlog"),
        ("reuse_port", "reuse_port"),
        ("access_log", "access_log"),
        ("admission_delay", "admission_delay"),
        ("grace_period", "grace_period"),
        ("log_level", "log_level"),
        ("log_format", "log_format"),
        ("model_control_mode", "model_control_mode"),
        ("strict_readiness", "strict_readiness"),
        ("reload_device_wait", "reload_device_wait"),
        ("allow_client_shm", "allow_client_shm"),
    ]:
        value = pick(cli, server, name)
        if value is not None:
            setattr(opts, name, value)
    value = pick("executable_cache", server, "executable_cache")
    if value is not None:
        opts.executable_cache = Path(value)
    repositories = pick("model_repository", server, "model_repository") or []
    repositories = [repositories] if isinstance(repositories, str) else list(repositories)
    if repositories:
        opts.model_repository, *more = (Path(r) for r in repositories)
        opts.more_repositories = list(more)
    _triton(opts, args)
    _ray_options(opts, args)
    opts.models = list(getattr(args, "models", None) or server.get("models", []))
    _model_control(opts, args, server)
    _access(opts, args)
    batch = pick("batch_size", compile_, "batch_size")
    if batch is not None:
        opts.batch_size = int(batch)
    for cli, key in [
        ("replicas", "replication_factor"),
        ("fault_plan", "fault_plan"),
        ("batch_timeout", "timeout"),
        ("execution_timeout", "execution_timeout"),
        ("auto_reset", "auto_reset"),
        ("max_retries", "max_retries"),
    ]:
        value = getattr(args, cli, None)
        if value is not None:
            runner[key] = value
    try:
        for key, value in runner.items():
            setattr(opts.runner, key, value)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"[runner]: {exc}") from exc
    opts.runner.drain_timeout = min(opts.runner.drain_timeout, opts.grace_period)
    opts.runner.validate()
    if isinstance(opts.runner.fault_plan, str):
        from actors.device.faults import FaultPlan

        FaultPlan.parse(opts.runner.fault_plan)  # fail at start, not at the first load
    if opts.batch_size < 1:
        raise ConfigurationError(f"batch size must be >= 1, got {opts.batch_size}")
    if opts.max_body_size < 1:
        raise ConfigurationError(f"max body size must be >= 1, got {opts.max_body_size}")
    if opts.grpc_transport not in ("native", "nghttp2", "aio"):
        raise ConfigurationError(
            f"gRPC transport must be native, nghttp2 or aio, got {opts.grpc_transport!r}"
        )
    if opts.grpc_transport == "nghttp2" and nghttp2.MISSING is not None:
        raise ConfigurationError(f"gRPC transport nghttp2: {nghttp2.MISSING}")
    return opts


def _triton(opts: DaemonOptions, args: argparse.Namespace) -> None:
    """Triton's flags (:mod:`.tritonflags`), and those that set options of ours."""
    opts.triton = read_triton_flags(args)
    if getattr(args, "log_level", None) is not None:  # ours wins over Triton's log flags
        opts.triton.log_switches.clear()
    elif opts.triton.log_level is not None:
        opts.log_level = opts.triton.log_level
    if opts.log_format in ("default", "ISO8601"):  # Triton's; our lines carry ISO 8601 times
        opts.triton.log_format = opts.log_format  # what the logging extension reports
        opts.log_format = "auto"
    if opts.triton.default_max_batch_size is not None and getattr(args, "batch_size", None) is None:
        opts.batch_size = opts.triton.default_max_batch_size


def _ray_options(opts: DaemonOptions, args: argparse.Namespace) -> None:
    """The ``--ray*`` options; the replica and CPU counts are refused without ``--ray``."""
    opts.ray_address = getattr(args, "ray", None)
    for name in ("ray_replicas", "ray_cpus"):
        value = getattr(args, name, None)
        if value is None:
            continue
        if opts.ray_address is None:
            raise ConfigurationError(f"--{name.replace('_', '-')} needs --ray")
        if not value > 0 or (name == "ray_replicas" and value < 1):
            raise ConfigurationError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        setattr(opts, name, value)


def _model_control(opts: DaemonOptions, args: argparse.Namespace, server: dict[str, Any]) -> None:
    """The model control options, each refused where its mode would ignore it."""
    mode = opts.model_control_mode
    if mode not in CONTROL_MODES:
        raise ConfigurationError(f"model control mode must be one of {CONTROL_MODES}, got {mode!r}")
    opts.load_models = list(getattr(args, "load_model", None) or server.get("load_model", []))
    if opts.load_models and mode != "explicit":
        raise ConfigurationError(
            f"--load-model needs --model-control-mode explicit (the mode is {mode!r})"
        )
    if "*" in opts.load_models and len(opts.load_models) > 1:
        raise ConfigurationError("--load-model '*' loads every model: give it alone")
    poll = getattr(args, "repository_poll_secs", None)
    poll = server.get("repository_poll_secs") if poll is None else poll
    if poll is not None:
        if mode != "poll":
            raise ConfigurationError(
                f"--repository-poll-secs needs --model-control-mode poll (the mode is {mode!r})"
            )
        opts.repository_poll_secs = float(poll)
    if not opts.repository_poll_secs > 0:
        raise ConfigurationError(f"repository poll interval must be > 0 s, got {poll}")
    if not opts.reload_device_wait >= 0:
        raise ConfigurationError(
            f"reload device wait must be >= 0 s, got {opts.reload_device_wait}"
        )
