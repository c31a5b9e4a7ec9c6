"""The daemon's lifecycle: configure logs, start the HTTP server, load models, drain on signal.

Order on SIGTERM/SIGINT: new requests get 503 at once (readiness turns false), in-flight
requests finish (up to the grace period), every runner closes (finishes its queue, runs save
programs, detaches), then the listener closes and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio
import structlog
from aiohttp import web

from model_runtime.errors import ConfigurationError, ModelRuntimeError
from model_runtime.server.app import InferenceServer, ServerOptions
from model_runtime.server.options import (
    DaemonOptions,
    add_serve_arguments,
    default_cache_dir,
    options_from_args,
)
from model_runtime.server.repository import ModelRepository, parse_model_arg

__all__ = ["configure_logging", "main", "run_daemon", "serve", "serve_main"]

log = structlog.get_logger(__name__)


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog once for the process: contextvars first, JSON off a terminal."""
    json_logs = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


def _compiler(opts: DaemonOptions) -> Callable[[Path], Path]:
    from model_runtime.compiler import CompileOptions, compile_model

    cache = opts.executable_cache
    if cache is None:
        from model_runtime.flags import get_flags

        flag = get_flags().executable_cache_path
        cache = Path(flag) if flag else default_cache_dir()
    cache_path = str(cache)

    def compile_source(path: Path) -> Path:
        options = CompileOptions(batch_size=opts.batch_size, executable_cache_path=cache_path)
        return compile_model(path, options=options)

    return compile_source


def build_repository(opts: DaemonOptions) -> tuple[ModelRepository, list[str]]:
    """The repository for ``opts`` and the names to load at start (the demo model if none).

    Raises:
        InputValidationError: a model argument is malformed or two models share a name.
        ConfigurationError: the repository directory does not exist.
    """
    directory = opts.model_repository
    if directory is not None and not directory.is_dir():
        raise ConfigurationError(f"model repository {directory} is not a directory")
    repo = ModelRepository(
        opts.runner,
        directory=directory,
        compile_source=_compiler(opts),
    )
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
    return repo, names


async def serve(opts: DaemonOptions) -> int:
    """Run the daemon until SIGTERM/SIGINT; return the exit status.

    Raises:
        ConfigurationError: the options do not describe a servable set of models.
        OSError: the address cannot be bound.
    """
    repo, names = build_repository(opts)
    server = InferenceServer(
        repo, ServerOptions(max_body_size=opts.max_body_size, request_timeout=opts.request_timeout)
    )
    runner = web.AppRunner(
        server.app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0
    )
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    status = 0
    try:
        async with repo:
            site = web.TCPSite(runner, opts.host, opts.port)
            await site.start()
            port = _bound_port(runner, opts.port)
            log.info("daemon_listening", host=opts.host, port=port, models=names)
            status = await _load_until_stopped(repo, names, stop)
            if status == 0 and not stop.is_set():
                log.info("daemon_ready", url=f"http://{opts.host}:{port}/v2")
                await stop.wait()
            log.info("daemon_draining", grace_period=opts.grace_period)
            t0 = time.monotonic()
            if not await server.drain(opts.grace_period):
                log.warning("drain_incomplete", grace_period=opts.grace_period)
            with anyio.move_on_after(max(0.0, opts.grace_period - (time.monotonic() - t0))):
                await repo.close_all()
    finally:
        await runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("daemon_stopped", status=status)
    return status


def _bound_port(runner: web.AppRunner, default: int) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    return default


async def _load_until_stopped(
    repo: ModelRepository, names: Sequence[str], stop: asyncio.Event
) -> int:
    """Load every model, giving up early on a signal; 1 if a model failed to load."""
    status = 0
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            await stop.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        for name in names:
            try:
                await repo.load(name)
            except (ModelRuntimeError, OSError) as exc:
                log.error("startup_load_failed", model=name, error=str(exc))
                status = 1
                break
        tg.cancel_scope.cancel()
    return status


def _run(opts: DaemonOptions) -> int:
    configure_logging(opts.log_level, opts.log_format)
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
        description="Serve models over the Open Inference Protocol v2 (KServe v2) over HTTP.",
    )
    add_serve_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m model_runtime.server [serve options]``."""
    return serve_main(build_parser().parse_args(argv))
