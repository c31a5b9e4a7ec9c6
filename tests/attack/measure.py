"""What the attack tests measure of the daemon and of the well-behaved client, for both
harnesses (:mod:`tests.attack.http_wire`, :mod:`tests.attack.grpc_wire`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tests.integration.test_daemon_support import Daemon

__all__ = ["AFTER_ANSWERS", "AFTER_MIN_S", "BEFORE_S", "Phase", "rss", "watch_after"]


#: The baseline is measured for at most this long before an attack: ~1,000 answers a protocol
#: here, enough for its p99 (a shorter window can only lower that p99, tightening its bound).
BEFORE_S = 3.0
#: After an attack the client is watched until each protocol has this many answers, and for at
#: least ``AFTER_MIN_S`` (the RSS is sampled meanwhile), at most the attack's own length:
#: whether it is served again is decided by then; a longer wait would only add answers.
AFTER_ANSWERS = 50
AFTER_MIN_S = 1.0


def watch_after(
    daemon: Daemon, answered: Callable[[], int], seconds: float, peak: int
) -> tuple[int, float]:
    """Sample the daemon's RSS every 0.1 s after an attack until ``answered()`` (the fewest
    answers of one protocol since the attack) reaches :data:`AFTER_ANSWERS` and
    :data:`AFTER_MIN_S` have passed, or ``seconds`` have; returns the largest RSS seen
    (``peak`` or more) and the seconds watched."""
    start = time.monotonic()
    while True:
        peak = max(peak, rss(daemon))
        lasted = time.monotonic() - start
        if lasted >= seconds or (lasted >= AFTER_MIN_S and answered() >= AFTER_ANSWERS):
            return peak, lasted
        time.sleep(0.1)


def rss(daemon: Daemon) -> int:
    """The daemon process's resident memory, in bytes."""
    with open(f"/proc/{daemon.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@dataclass
class Phase:
    """What one protocol of the client saw in one phase."""

    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.latencies) + self.failed

    def p99(self) -> float:
        return float(np.percentile(self.latencies, 99)) if self.latencies else float("inf")

    def __str__(self) -> str:
        return (
            f"{self.total} requests, {self.failed} failed, "
            f"p99 {self.p99() * 1e3:.1f} ms {self.errors[:3]}"
        )
