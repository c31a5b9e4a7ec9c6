"""The daemon's lifecycle: configure logs, start the HTTP and gRPC servers, load models, drain
on signal.

Models load at start ``--model-load-thread-count`` at a time; one that fails is UNAVAILABLE
(the repository index says why) and the others serve, unless ``--exit-on-error``: then the
daemon stops with status 1. ``--model-control-mode`` (Triton's: none, explicit, poll) decides which
load at start and whether the repository API or the files drive loads afterwards.

Order on SIGTERM/SIGINT: new requests get 503 at once (gRPC: UNAVAILABLE; readiness turns
false), in-flight requests of both protocols finish (up to the grace period), every runner
closes (finishes its queue, runs save programs, detaches), then the listeners close and the
process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import structlog

from model_runtime.errors import ConfigurationError, ModelRuntimeError
from model_runtime.server.daemon.heap import GEN0_THRESHOLD, settle_heap
from model_runtime.server.daemon.listeners import SupervisedListener
from model_runtime.server.daemon.logs import configure_logging, log_writer
from model_runtime.server.daemon.options import (
    DaemonOptions,
    add_serve_arguments,
    default_cache_dir,
    options_from_args,
    tls_files,
)
from model_runtime.server.grpc import nghttp2
from model_runtime.server.grpc.budget import CallBudget
from model_runtime.server.grpc.server import (
    GrpcLimits,
    call_budget,
    grpc_max_connections,
    start_grpc_server,
    start_native_grpc_server,
)
from model_runtime.server.http.fastpath import FastInfer
from model_runtime.server.http.guard import ConnectionLimits
from model_runtime.server.http.routes import HttpFrontEnd
from model_runtime.server.http.runner import GuardedAppRunner, runner_of, start_site
from model_runtime.server.inference.cache import ResponseCache
from model_runtime.server.inference.looplag import LoopLag
from model_runtime.server.inference.plane import DataPlane, ServerOptions
from model_runtime.server.observability.metrics import DaemonMetrics
from model_runtime.server.observability.trace import Tracer
from model_runtime.server.repository.entries import ControlMode, parse_model_arg
from model_runtime.server.repository.repository import ModelRepository
from model_runtime.server.security.fdlimit import raise_open_file_limit
from model_runtime.server.security.restrict import GRPC_KEY_PREFIX, Restrictions
from model_runtime.server.security.tls import TLSFiles, grpc_credentials, ssl_context

__all__ = ["configure_logging", "main", "run_daemon", "serve", "serve_main"]

log = structlog.get_logger(__name__)


def _compiler(opts: DaemonOptions) -> Callable[..., Path]:
    from model_runtime.compiler import CompileOptions, compile_model

    cache = opts.executable_cache
    if cache is None:
        from model_runtime.flags import get_flags

        flag = get_flags().executable_cache_path
        cache = Path(flag) if flag else default_cache_dir()
    cache_path = str(cache)

    def compile_source(
        path: Path, batch_size: int | None = None, optimization_level: str | None = None
    ) -> Path:
        # A model's own batch (its config, or the one it fixes) wins over --batch-size.
        batch = opts.batch_size if batch_size is None else batch_size
        options = CompileOptions(batch_size=batch, executable_cache_path=cache_path)
        if optimization_level is not None:  # its config's optimization.graph.level
            options = replace(options, optimization_level=optimization_level)
        return compile_model(path, options=options)

    return compile_source


def build_repository(opts: DaemonOptions) -> tuple[ModelRepository, list[str]]:
    """The repository for ``opts`` and the names to load at start: every model (the demo
    model if none is given) in ``none`` and ``poll`` mode, the ``--load-model`` ones in
    ``explicit`` mode.

    Raises:
        InputValidationError: a model argument is malformed or two models share a name.
        ConfigurationError: the repository directory or a model file does not exist, or
            ``--load-model`` names an unknown model.
    """
    directory = opts.model_repository
    if directory is not None and not directory.is_dir():
        raise ConfigurationError(f"model repository {directory} is not a directory")
    for more in opts.more_repositories:
        if not more.is_dir():
            raise ConfigurationError(f"model repository {more} is not a directory")
    repo = ModelRepository(
        opts.runner,
        directory=directory,
        more_directories=opts.more_repositories,
        auto_complete=opts.triton.auto_complete,
        compile_source=_compiler(opts),
        control_mode=ControlMode(opts.model_control_mode),
        strict_readiness=opts.strict_readiness,
        reload_device_wait=opts.reload_device_wait,
    )
    if opts.executable_cache is not None:  # beside the executables: one cache to clear
        repo.python_env_cache = opts.executable_cache.parent / "python-envs"
    names = []
    models = list(opts.models)
    if not models and directory is None:
        from model_runtime.demo import DEMO_MODEL_NAME, DEMO_ONNX_PATH

        models = [f"{DEMO_MODEL_NAME}={DEMO_ONNX_PATH}"]
    for arg in models:
        name, path = parse_model_arg(arg)
        if not path.is_file():
            raise ConfigurationError(f"model file {path} does not exist")
        repo.add(name, path.resolve())
        names.append(name)
    names += [n for n in repo.scan() if n not in names]
    if repo.control_mode is not ControlMode.EXPLICIT or opts.load_models == ["*"]:
        return repo, names
    unknown = [n for n in opts.load_models if n not in names]
    if unknown:
        raise ConfigurationError(f"--load-model: no model named {unknown} (models: {names})")
    return repo, [n for n in names if n in opts.load_models]


async def serve(opts: DaemonOptions) -> int:
    """Run the daemon until SIGTERM/SIGINT; return the exit status.

    A model that fails to load is UNAVAILABLE (with the reason in the repository index); the
    others serve. In ``poll`` mode the repository is polled every ``repository_poll_secs``.

    Raises:
        ConfigurationError: the options do not describe a servable set of models.
        OSError: the address cannot be bound.
    """
    repo, names = build_repository(opts)
    http_restrictions = Restrictions.parse(opts.http_restricted_api, kind="api")
    grpc_restrictions = Restrictions.parse(
        opts.grpc_restricted_protocol, kind="protocol", prefix=GRPC_KEY_PREFIX
    )
    http_tls, grpc_tls = tls_files(opts, "http"), tls_files(opts, "grpc")
    plane = DataPlane(
        repo,
        ServerOptions(
            max_body_size=opts.max_body_size,
            request_timeout=opts.request_timeout,
            access_log=opts.access_log,
            admission_delay=opts.admission_delay or None,
            allow_client_shm=bool(opts.allow_client_shm),  # None was resolved by the options
            metrics=opts.triton.allow_metrics,
        ),
        DaemonMetrics(opts.triton.metrics_config, cpu=opts.triton.allow_cpu_metrics),
        tracer=Tracer(opts.triton.trace),
        cache=None if opts.triton.cache is None else ResponseCache(opts.triton.cache.size),
    )
    for note in opts.triton.notes:
        log.info("flag_not_applied", note=note)
    http = HttpFrontEnd(plane, restrictions=http_restrictions)
    limits = ConnectionLimits(
        header_timeout=opts.header_timeout,
        keepalive_timeout=opts.keepalive_timeout,
        max_connections=opts.max_connections,
    )
    # Before the connection limit is derived from it: a server may hold what the hard limit
    # allows, and a burst of clients must not meet the soft default of 1,024.
    before, after = raise_open_file_limit()
    if after != before:
        log.info("open_file_limit_raised", soft_before=before, soft=after)
    runner = GuardedAppRunner(
        http.app(),
        limits=limits,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=1.0,
    )
    # Infer requests over their model's admission limit are refused as their head arrives;
    # not while inference is restricted: a request without the header gets the restriction's
    # answer, which the middleware gives before admission.
    # Nor while traces continue a client's (OpenTelemetry): its `traceparent` is read there.
    if http_restrictions.get("inference") is None and not plane.tracer.reads_headers:
        runner.guard.head_admission = plane.admission.at_head
        # ... and those admitted, whole and plain, are answered there too (fastpath.py).
        runner.guard.fast = FastInfer(plane, access_log=opts.access_log)
    runner.guard.early_max_body = opts.max_body_size
    plane.metrics.registry.register(runner.guard)
    await runner.setup()
    grpc_limits = GrpcLimits(
        max_message_size=opts.max_body_size,
        idle_timeout=opts.keepalive_timeout,
        max_connections=grpc_max_connections(runner.guard.limit),
    )
    grpc_budget = call_budget(grpc_limits)  # kept across restarts of the listener
    plane.metrics.registry.register(grpc_budget)
    grpc_server: SupervisedListener | None = None
    http_server: SupervisedListener | None = None
    metrics_runner: Any = None
    metrics_server: SupervisedListener | None = None
    status = 0
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    writer = log_writer()
    if writer is not None:
        writer.batch_on(loop)  # access lines in batches while serving
    lag = LoopLag(plane.admission)  # sheds while the loop falls behind
    lag.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with repo:
            repo.starting = True  # not ready until the models of the start are loaded (or not)
            http_ssl = None if http_tls is None else ssl_context(http_tls)
            http_server = SupervisedListener(
                lambda port: start_site(
                    runner,
                    opts.host,
                    port,
                    backlog=opts.backlog,
                    reuse_port=opts.reuse_port or None,
                    ssl_context=http_ssl,
                ),
                lambda reason: plane.listener_changed("http", reason),
                name="HTTP",
            )
            port = None
            if opts.triton.allow_http:
                port = await http_server.start(opts.port)
            grpc_server = SupervisedListener(
                _grpc_starter(opts, plane, grpc_limits, grpc_restrictions, grpc_tls, grpc_budget),
                lambda reason: plane.listener_changed("grpc", reason),
            )
            grpc_port = await grpc_server.start(opts.grpc_port) if opts.triton.allow_grpc else None
            metrics_port = None
            if opts.triton.allow_metrics:
                metrics_runner = runner_of(http.metrics_app())
                await metrics_runner.setup()
                metrics_server = SupervisedListener(
                    lambda port: start_site(
                        metrics_runner, opts.host, port, reuse_port=opts.reuse_port or None
                    ),
                    lambda reason: plane.listener_changed("metrics", reason),
                    name="metrics",
                )
                metrics_port = await metrics_server.start(opts.triton.metrics_port)
            log.info(
                "daemon_listening",
                host=opts.host,
                port=port,
                grpc_port=grpc_port,
                grpc_transport=opts.grpc_transport,
                libnghttp2=nghttp2.MISSING or "loaded",
                metrics_port=metrics_port,
                models=names,
                model_control_mode=repo.control_mode.value,
            )
            failed = await _load_until_stopped(
                repo, names, stop, opts.triton.model_load_thread_count
            )
            repo.starting = False
            if failed and opts.triton.exit_on_error:
                log.error("daemon_exit_on_error", failed=failed)
                status = 1
                stop.set()
            log.info("heap_settled", frozen=settle_heap(), gen0_threshold=GEN0_THRESHOLD)
            if not stop.is_set():
                loaded = [e.name for e in repo.entries() if e.runner is not None]
                failed = [e.name for e in repo.entries() if e.wanted and e.runner is None]
                url = None if port is None else f"http://{opts.host}:{port}/v2"
                grpc_url = None if grpc_port is None else f"{opts.host}:{grpc_port}"
                log.info("daemon_ready", url=url, grpc=grpc_url, loaded=loaded, unavailable=failed)
                await _serve_until_stopped(repo, opts, stop)
            log.info("daemon_draining", grace_period=opts.grace_period)
            t0 = time.monotonic()
            if not await plane.drain(opts.grace_period):
                log.warning("drain_incomplete", grace_period=opts.grace_period)
            with anyio.move_on_after(max(0.0, opts.grace_period - (time.monotonic() - t0))):
                await repo.close_all()
    finally:
        if metrics_server is not None:
            await metrics_server.stop(None)
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        if grpc_server is not None:
            await grpc_server.stop(1.0)  # in-flight calls drained above; stragglers: 1 s
        if http_server is not None:
            await http_server.stop(None)  # supervision first: the cleanup closes its site
        await runner.cleanup()
        lag.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        plane.tracer.close()  # the traces that wait are written or exported
        if writer is not None:
            writer.batch_on(None)
    log.info("daemon_stopped", status=status)
    return status


def _grpc_starter(
    opts: DaemonOptions,
    plane: DataPlane,
    limits: GrpcLimits,
    restrictions: Restrictions,
    tls: TLSFiles | None,
    budget: CallBudget,
) -> Callable[[int], Awaitable[tuple[Any, int]]]:
    """How the gRPC listener starts on a port: on the transport ``opts.grpc_transport`` names
    (``native``: h2corn, ``nghttp2``: libnghttp2, ``aio``: grpcio's asyncio server)."""
    if opts.grpc_transport in ("native", "nghttp2"):
        return lambda port: start_native_grpc_server(
            plane, opts.host, port, limits, restrictions=restrictions, tls=tls,
            reuse_port=opts.reuse_port, budget=budget, backlog=opts.backlog,
            transport=opts.grpc_transport,
        )  # fmt: skip
    credentials = None if tls is None else grpc_credentials(tls)
    return lambda port: start_grpc_server(
        plane, opts.host, port, limits, restrictions=restrictions, credentials=credentials,
        reuse_port=opts.reuse_port, budget=budget,
    )  # fmt: skip


async def _load_until_stopped(
    repo: ModelRepository, names: Sequence[str], stop: asyncio.Event, at_once: int = 1
) -> list[str]:
    """Load every model, ``at_once`` at a time, giving up early on a signal; the names of
    those that failed. A model that fails is UNAVAILABLE with the reason (logged by the
    repository); the others load all the same."""
    failed: list[str] = []
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            await stop.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        await load_at_start(repo, names, at_once, failed)
        tg.cancel_scope.cancel()
    return failed


async def load_at_start(
    repo: ModelRepository, names: Sequence[str], at_once: int, failed: list[str]
) -> None:
    """Load ``names``, ``at_once`` at a time (Triton's ``--model-load-thread-count``), in
    their order; the names of those that fail are appended to ``failed``."""
    limiter = anyio.CapacityLimiter(at_once)

    async def one(name: str) -> None:
        async with limiter:
            try:
                await repo.ensure_loaded(name)  # an ensemble may have loaded it already
            except (ModelRuntimeError, OSError) as exc:
                failed.append(name)
                log.error("startup_load_failed", model=name, error=str(exc))

    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(one, name)


async def _serve_until_stopped(
    repo: ModelRepository, opts: DaemonOptions, stop: asyncio.Event
) -> None:
    """Wait for a signal; in ``poll`` mode, poll the repository meanwhile (a poll under way
    when the signal comes is cancelled: the drain starts at once)."""
    async with anyio.create_task_group() as tg:
        if repo.control_mode is ControlMode.POLL:
            tg.start_soon(_poll_forever, repo, opts.repository_poll_secs)
        await stop.wait()
        tg.cancel_scope.cancel()


async def _poll_forever(repo: ModelRepository, interval: float) -> None:
    while True:
        await anyio.sleep(interval)
        await repo.poll()


def _run(opts: DaemonOptions) -> int:
    configure_logging(
        opts.log_level,
        opts.log_format,
        opts.triton.log_file,
        opts.triton.log_switches,
        opts.triton.log_format,
    )
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(serve(opts))
    return uvloop.run(serve(opts))  # type: ignore[no-any-return]


def run_daemon(
    models: Sequence[str] = (),
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int | None = None,
    batch_size: int | None = None,
    config_file: str | None = None,
    fault_plan: str | None = None,
    model_repository: str | None = None,
) -> int:
    """Run the daemon in this thread until SIGTERM/SIGINT; return the exit status.

    Raises:
        ConfigurationError: bad options or config file.
        OSError: the address cannot be bound.
    """
    parser = build_parser()
    args = parser.parse_args([])
    args.models, args.host, args.port = list(models), host, port
    args.replicas, args.batch_size, args.config = replicas, batch_size, config_file
    args.fault_plan, args.model_repository = fault_plan, model_repository
    return _run(options_from_args(args))


def serve_main(args: argparse.Namespace) -> int:
    """Entry point for ``model-runtime serve``: ``args`` parsed with :func:`add_serve_arguments`.

    Returns the exit status (2 for a configuration error, reported on stderr).
    """
    try:
        opts = options_from_args(args)
    except (ConfigurationError, ModelRuntimeError) as exc:
        print(f"model-runtime serve: {exc}", file=sys.stderr)
        return 2
    try:
        return _run(opts)
    except (ConfigurationError, ModelRuntimeError, OSError) as exc:
        log.error("daemon_failed", error=str(exc))
        return 2 if isinstance(exc, ModelRuntimeError) else 1


def build_parser() -> argparse.ArgumentParser:
    """The ``serve`` argument parser (standalone: ``python -m model_runtime.server``)."""
    parser = argparse.ArgumentParser(
        prog="model-runtime serve",
        description="Serve models over the Open Inference Protocol v2 (KServe v2): HTTP and gRPC.",
    )
    add_serve_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m model_runtime.server [serve options]``."""
    return serve_main(build_parser().parse_args(argv))
