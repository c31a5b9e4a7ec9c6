"""Library logging: events go to the standard ``logging`` hierarchy and print nothing unless the
application configures logging.

Every module logs structured events through ``structlog.get_logger(__name__)``. An application
that configures structlog itself (the daemon and the CLI do, once, at their entry points) gets
the events its way. Until one does, :func:`quiet_by_default` routes them into ``logging``
under the module's name (``actors.*``, ``model_runtime.*``, ``supervisor``), rendered as
``key=value`` text, with a ``NullHandler`` on those roots: silent by default, visible with
``logging.basicConfig(level=logging.INFO)``, filterable per logger, captured by pytest. The
level check comes first, so a disabled event costs one ``isEnabledFor``.
"""

from __future__ import annotations

import logging

import structlog

__all__ = ["LOGGER_ROOTS", "quiet_by_default"]

#: The roots of the project's loggers.
LOGGER_ROOTS = ("actors", "model_runtime", "supervisor")


def quiet_by_default() -> None:
    """Route structlog into ``logging`` unless the application configured structlog already.

    Idempotent; called when the packages are imported.

    Raises:
        nothing.
    """
    for root in LOGGER_ROOTS:
        logger = logging.getLogger(root)
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[
            _drop_disabled,
            structlog.contextvars.merge_contextvars,
            structlog.processors.format_exc_info,
            structlog.processors.KeyValueRenderer(key_order=["event"], sort_keys=False),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        # An application configuring structlog later must take over these loggers too.
        cache_logger_on_first_use=False,
    )


_LEVELS = logging.getLevelNamesMapping()


def _drop_disabled(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Drop an event its (stdlib) logger would discard, before any rendering. Any other logger
    (an application may swap the factory and keep these processors) gets every event."""
    enabled = getattr(logger, "isEnabledFor", None)
    if enabled is not None and not enabled(_LEVELS.get(method.upper(), logging.INFO)):
        raise structlog.DropEvent
    return event
