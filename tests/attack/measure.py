"""What the attack tests measure of the daemon and of the well-behaved client, for both
harnesses (:mod:`tests.attack.http_wire`, :mod:`tests.attack.grpc_wire`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tests.integration.test_daemon_support import Daemon

__all__ = ["Phase", "rss"]


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
