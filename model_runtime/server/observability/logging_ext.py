"""Triton's logging extension: the daemon's log settings, read and changed while it serves.

:data:`LOG_SETTINGS` is the process's one set of settings (logging is process-wide), in
Triton's names (``log_file``, ``log_info``, ``log_warning``, ``log_error``,
``log_verbose_level``, ``log_format``). :func:`logger_class` is the structlog wrapper class the
daemon configures once; turning a severity off swaps its methods for no-ops on the class, so
every logger made before or after sees it and a disabled call costs what structlog's own
filtering costs (nothing is checked per call). ``log_verbose_level`` > 0 turns on debug lines
(there is one debug level here: every level > 0 means it). ``log_format``: Triton's
``default`` and ``ISO8601`` leave our lines as they are (they carry ISO 8601 times already);
``json`` and ``console`` (ours) switch the renderer at once.

Updates follow Triton's HTTP and gRPC handlers: only the settings given change (a JSON
``null`` changes nothing), ``log_file`` cannot be changed over the network (set it at start
with ``--log-file``), and a value of the wrong type or an unknown format is refused in
Triton's words with Triton's code; a refused update changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from model_runtime.server.answers import Code, HTTPError

__all__ = ["FORMATS", "LOG_SETTINGS", "LogSettings", "SwitchableRenderer", "logger_class"]

#: Formats a client may set: Triton's two, and ours.
FORMATS = ("default", "ISO8601", "json", "console")

_FILTERING: Any = structlog.make_filtering_bound_logger(logging.DEBUG)


class _RuntimeFilteringLogger(_FILTERING):  # type: ignore[misc,valid-type]
    """structlog's filtering logger with every level on; :class:`LogSettings` switches a
    severity off by putting no-ops on this class (and back on by removing them)."""


#: Severity -> the logger methods it switches.
_METHODS = {
    "debug": ("debug", "adebug"),
    "info": ("info", "ainfo", "msg", "amsg"),
    "warning": ("warning", "awarning", "warn", "awarn"),
    "error": (
        "error",
        "aerror",
        "exception",
        "aexception",
        "critical",
        "acritical",
        "fatal",
        "afatal",
    ),
}


def _nop(self: Any, event: Any = None, *args: Any, **kw: Any) -> None:
    return None


async def _anop(self: Any, event: Any = None, *args: Any, **kw: Any) -> None:
    return None


def logger_class() -> type:
    """The structlog ``wrapper_class`` whose severities :data:`LOG_SETTINGS` switches."""
    return _RuntimeFilteringLogger


class SwitchableRenderer:
    """The last structlog processor: renders with the renderer chosen now (JSON or console)."""

    def __init__(self, json: Callable[..., Any], console: Callable[..., Any], use_json: bool):
        self.json, self.console = json, console
        self.current = json if use_json else console

    def __call__(self, logger: Any, method: str, event: Any) -> Any:
        return self.current(logger, method, event)


class LogSettings:
    """The daemon's log settings (see the module docstring)."""

    def __init__(self) -> None:
        self.log_file = ""
        self.enabled = {"info": True, "warning": True, "error": True}
        self.verbose = 0
        self.format = "default"
        self.renderer: SwitchableRenderer | None = None

    def configure(
        self,
        level: str,
        fmt: str,
        log_file: str = "",
        renderer: SwitchableRenderer | None = None,
        switches: Mapping[str, int] | None = None,
    ) -> None:
        """Take the start-up settings: the lowest ``level`` logged (``debug`` ... ``error``),
        the format asked for (``auto`` reads as Triton's ``default``), the file (``""``:
        stderr), the renderer to switch, and Triton's flags (``switches``: ``info``,
        ``warning``, ``error`` -> on; ``verbose`` -> level) over ``level``."""
        order = ("debug", "info", "warning", "error")
        floor = order.index(level)
        self.verbose = 1 if floor == 0 else 0
        self.enabled = {name: order.index(name) >= floor for name in ("info", "warning", "error")}
        for name, value in (switches or {}).items():
            if name == "verbose":
                self.verbose = int(value)
            else:
                self.enabled[name] = bool(value)
        self.format = "default" if fmt == "auto" else fmt
        self.log_file = log_file
        self.renderer = renderer
        self._apply()

    def settings(self) -> dict[str, Any]:
        """The settings now, as Triton's ``GET /v2/logging`` answers them."""
        return {
            "log_file": self.log_file,
            "log_info": self.enabled["info"],
            "log_warning": self.enabled["warning"],
            "log_error": self.enabled["error"],
            "log_verbose_level": self.verbose,
            "log_format": self.format,
        }

    def update_json(self, doc: Any) -> dict[str, Any]:
        """Apply the settings of a ``POST /v2/logging`` body (parsed JSON); the settings after.

        Raises:
            HTTPError: not an object, a value of the wrong type, ``log_file``, or an unknown
                format (Triton's texts and codes); nothing changed.
        """
        if not isinstance(doc, dict):
            raise HTTPError.triton(
                Code.INVALID_ARG, "dynamic logging request must be a JSON object", "bad_request"
            )
        given = {k: v for k, v in doc.items() if v is not None}
        if "log_file" in given:
            raise _file_refused()
        for name in ("log_info", "log_warning", "log_error"):
            if name in given and not isinstance(given[name], bool):
                raise _bad(f"attempt to access JSON non-boolean as boolean for '{name}'")
        verbose = given.get("log_verbose_level")
        if "log_verbose_level" in given and (
            isinstance(verbose, bool) or not isinstance(verbose, int) or verbose < 0
        ):
            raise _bad(
                "attempt to access JSON non-unsigned-integer as unsigned-integer for "
                "'log_verbose_level'"
            )
        fmt = given.get("log_format")
        if "log_format" in given:
            if not isinstance(fmt, str):
                raise _bad("attempt to access JSON non-string as string for 'log_format'")
            if fmt not in FORMATS:  # Triton answers this one UNAVAILABLE over HTTP
                raise HTTPError.triton(
                    Code.UNAVAILABLE, f"invalid argument for --log_format, got: {fmt}", "bad_format"
                )
        return self._set(given)

    def update_grpc(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a gRPC ``LogSettingsRequest``'s ``settings`` map (``SettingValue`` messages
        with ``bool_param`` / ``uint32_param`` / ``string_param``); the settings after.

        Raises:
            HTTPError: a value of the wrong kind, ``log_file``, or an unknown format
                (Triton's texts, INVALID_ARGUMENT / UNIMPLEMENTED); nothing changed.
        """
        if "log_file" in settings:
            raise _file_refused()
        given: dict[str, Any] = {}
        kinds = {
            "log_info": ("bool_param", "boolean"),
            "log_warning": ("bool_param", "boolean"),
            "log_error": ("bool_param", "boolean"),
            "log_verbose_level": ("uint32_param", "int32"),
            "log_format": ("string_param", "string"),
        }
        for name, (field, word) in kinds.items():
            if name not in settings:
                continue
            value = settings[name]
            if value.WhichOneof("parameter_choice") != field:
                raise _bad(f"expect {word} for '{name}'")
            given[name] = getattr(value, field)
        fmt = given.get("log_format")
        if fmt is not None and fmt not in FORMATS:
            raise _bad(f"invalid argument for log_format, got: {fmt}")
        return self._set(given)

    def _set(self, given: Mapping[str, Any]) -> dict[str, Any]:
        for name in ("info", "warning", "error"):
            if f"log_{name}" in given:
                self.enabled[name] = bool(given[f"log_{name}"])
        if "log_verbose_level" in given:
            self.verbose = int(given["log_verbose_level"])
        if "log_format" in given:
            self.format = str(given["log_format"])
        self._apply()
        structlog.get_logger(__name__).info("log_settings_changed", **self.settings())
        return self.settings()

    def _apply(self) -> None:
        on = dict(self.enabled, debug=self.verbose > 0)
        for severity, methods in _METHODS.items():
            for name in methods:
                if on[severity]:
                    if name in _RuntimeFilteringLogger.__dict__:
                        delattr(_RuntimeFilteringLogger, name)
                else:
                    setattr(_RuntimeFilteringLogger, name, _anop if name[0] == "a" else _nop)
        renderer = self.renderer
        if renderer is not None and self.format in ("json", "console"):
            renderer.current = renderer.json if self.format == "json" else renderer.console


def _bad(message: str) -> HTTPError:
    return HTTPError.triton(Code.INVALID_ARG, message, "bad_request")


def _file_refused() -> HTTPError:
    return HTTPError.triton(
        Code.UNSUPPORTED,
        "log file location can not be updated through network protocol",
        "unsupported",
    )


#: The process's log settings (the daemon configures them at start).
LOG_SETTINGS = LogSettings()
