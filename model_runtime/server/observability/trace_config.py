"""``--trace-config``: Triton's trace settings from the command line.

``--trace-config SETTING=VALUE`` sets a global setting (``level``, ``rate``, ``count``,
``mode``); ``--trace-config triton,SETTING=VALUE`` one of Triton's mode (``file``,
``log-frequency``); ``--trace-config opentelemetry,SETTING=VALUE`` one of OpenTelemetry's
(``url``, ``resource=KEY=VALUE`` (repeatable), ``bsp_max_queue_size``, ``bsp_schedule_delay``,
``bsp_max_export_batch_size``). Defaults are Triton's (level OFF, rate 1000, count -1, mode
triton, log-frequency 0, url ``http://localhost:4318/v1/traces``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from model_runtime.errors import ConfigurationError

__all__ = ["LEVELS", "TraceConfig", "parse_trace_config"]

#: Trace levels, in the order Triton lists them.
LEVELS = ("TIMESTAMPS", "TENSORS")
DEFAULT_URL = "http://localhost:4318/v1/traces"


@dataclass(slots=True)
class TraceConfig:
    """The trace settings the daemon starts with (see the module docstring)."""

    level: tuple[str, ...] = ()
    rate: int = 1000
    count: int = -1
    mode: str = "triton"
    file: str = ""
    log_frequency: int = 0
    url: str = DEFAULT_URL
    resource: dict[str, str] = field(default_factory=dict)
    #: Batch span processor settings given (``bsp_*`` -> value).
    bsp: dict[str, int] = field(default_factory=dict)


def _int(flag: str, value: str, low: int, high: int = 2**32 - 1) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ConfigurationError(f"--trace-config {flag}: expected an integer") from None
    if not low <= number <= high:
        raise ConfigurationError(f"--trace-config {flag}: expected {low}..{high}")
    return number


def parse_trace_config(values: Iterable[str]) -> TraceConfig:
    """The settings of every ``--trace-config`` value, in order (a later one wins).

    Raises:
        ConfigurationError: a malformed value, an unknown mode, setting or level, or a
            number out of range.
    """
    config = TraceConfig()
    for flag in values:
        mode, comma, rest = flag.partition(",")
        if not comma:
            mode, rest = "", flag
        key, eq, value = rest.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigurationError(
                f"--trace-config {flag}: expected [MODE,]SETTING=VALUE (e.g. level=TIMESTAMPS, "
                "triton,file=/tmp/trace.json, opentelemetry,url=http://host:4318/v1/traces)"
            )
        if mode == "":
            _global(config, flag, key, value)
        elif mode == "triton":
            if key == "file":
                config.file = value
            elif key == "log-frequency":
                config.log_frequency = _int(flag, value, 0)
            else:
                raise ConfigurationError(
                    f"--trace-config {flag}: triton mode has no setting {key!r} (file, "
                    "log-frequency)"
                )
        elif mode == "opentelemetry":
            _opentelemetry(config, flag, key, value)
        else:
            raise ConfigurationError(
                f"--trace-config {flag}: no trace mode {mode!r} (triton, opentelemetry)"
            )
    return config


def _global(config: TraceConfig, flag: str, key: str, value: str) -> None:
    if key == "level":
        if value == "OFF":
            config.level = ()
        elif value in LEVELS:
            config.level = tuple(lv for lv in LEVELS if lv in (*config.level, value))
        else:
            raise ConfigurationError(f"--trace-config {flag}: level is OFF, TIMESTAMPS or TENSORS")
    elif key == "rate":
        config.rate = _int(flag, value, 0)
    elif key == "count":
        config.count = _int(flag, value, -1, 2**31 - 1)
    elif key == "mode":
        if value not in ("triton", "opentelemetry"):
            raise ConfigurationError(f"--trace-config {flag}: mode is triton or opentelemetry")
        config.mode = value
    else:
        raise ConfigurationError(
            f"--trace-config {flag}: no global trace setting {key!r} (level, rate, count, "
            "mode); a mode's settings are written MODE,SETTING=VALUE"
        )


def _opentelemetry(config: TraceConfig, flag: str, key: str, value: str) -> None:
    if key == "url":  # Triton's docs write host:port/path; the exporter needs a scheme
        config.url = value if "://" in value else f"http://{value}"
    elif key == "resource":
        name, eq, attr = value.partition("=")
        if not eq or not name:
            raise ConfigurationError(f"--trace-config {flag}: resource is KEY=VALUE")
        config.resource[name] = attr
    elif key in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
        config.bsp[key] = _int(flag, value, 1)
    else:
        raise ConfigurationError(
            f"--trace-config {flag}: opentelemetry mode has no setting {key!r} (url, resource, "
            "bsp_max_queue_size, bsp_schedule_delay, bsp_max_export_batch_size)"
        )
