"""The daemon's logs: structlog configured once for the process, lines written in batches."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import structlog

from model_runtime.errors import ConfigurationError
from model_runtime.server.observability.logging_ext import (
    LOG_SETTINGS,
    SwitchableRenderer,
    logger_class,
)
from model_runtime.server.observability.logwriter import BatchedLogWriter

__all__ = ["configure_logging", "log_writer"]

#: The log output :func:`configure_logging` made (None: printed); batches while serving.
_log_writer: BatchedLogWriter | None = None


def configure_logging(
    level: str = "info",
    fmt: str = "auto",
    file: Path | None = None,
    switches: Mapping[str, int] | None = None,
    format_name: str | None = None,
) -> None:
    """Configure structlog once for the process: contextvars first, JSON off a terminal;
    into ``file`` (appended) instead of stderr when given; ``switches``: Triton's log flags
    (``info``/``warning``/``error`` -> on, ``verbose`` -> level), over ``level``;
    ``format_name``: Triton's name of ``fmt`` (``default``, ``ISO8601``), as reported.

    Raises:
        ConfigurationError: ``file`` cannot be opened.
    """
    # Lines in batches (see logwriter); a stderr replaced by text (a test's capture): printed.
    stream = getattr(sys.stderr, "buffer", None)
    if file is not None:
        try:  # held by the log writer for the process's life
            stream = open(file, "ab")  # noqa: SIM115
        except OSError as exc:
            raise ConfigurationError(f"--log-file {file}: {exc.strerror or exc}") from exc
    json_logs = fmt == "json" or (fmt == "auto" and (file is not None or not sys.stderr.isatty()))
    factory: Callable[..., Any] = structlog.PrintLoggerFactory(file=sys.stderr)
    json_renderer: structlog.typing.Processor = structlog.processors.JSONRenderer()
    global _log_writer
    _log_writer = None
    if stream is not None:
        writer = _log_writer = BatchedLogWriter(stream)
        factory = lambda *_: writer  # noqa: E731 -- one writer for every logger
        # bytes, in C (what it cannot encode: its repr, as json.dumps's)
        json_renderer = structlog.processors.JSONRenderer(
            serializer=orjson.dumps, option=orjson.OPT_NON_STR_KEYS
        )
    # The logging extension switches severities and the renderer while the daemon serves.
    renderer = SwitchableRenderer(json_renderer, structlog.dev.ConsoleRenderer(), json_logs)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=logger_class(),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
    log_file = "" if file is None else str(file)
    LOG_SETTINGS.configure(level, format_name or fmt, log_file, renderer, switches)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


def log_writer() -> BatchedLogWriter | None:
    """The log output :func:`configure_logging` made (None: lines are printed)."""
    return _log_writer
