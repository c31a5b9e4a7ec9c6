"""Logging for the examples: plain one-line events on stderr (the seed's tests grep them)."""

from __future__ import annotations

import logging
import sys

import structlog


def setup() -> None:
    """Render structlog events as ``[level] event key=value`` lines on stderr."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
