"""A warning logged at most once per interval, for events that repeat under load."""

from __future__ import annotations

import time

import structlog

__all__ = ["RateLimitedLog"]

# The logger these summaries always had (dashboards and tests select on it).
log = structlog.get_logger("model_runtime.server.access")


class RateLimitedLog:
    """A warning logged at most once per ``interval`` seconds, with how many times it happened
    since the last line: for events an overload or a misdirected client repeats (queue full,
    HTTP/2 on the HTTP port, bad request lines)."""

    def __init__(self, event: str, interval: float = 10.0) -> None:
        self.event = event
        self.interval = interval
        self.count = 0
        self._suppressed = 0
        self._last: float | None = None

    def __call__(self, **fields: object) -> None:
        self.count += 1
        now = time.monotonic()
        if self._last is not None and now - self._last < self.interval:
            self._suppressed += 1
            return
        log.warning(self.event, suppressed=self._suppressed, total=self.count, **fields)
        self._last, self._suppressed = now, 0
