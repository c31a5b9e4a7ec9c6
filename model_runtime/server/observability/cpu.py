"""Triton's CPU metrics, read from ``/proc`` when metrics are scraped: ``nv_cpu_utilization``
(the share of all cores busy since the previous scrape; since boot at the first),
``nv_cpu_memory_total_bytes`` and ``nv_cpu_memory_used_bytes`` (``MemTotal`` less
``MemAvailable``, as Triton counts it), and Triton's pinned memory gauges (0: no pinned pool
here). Without ``/proc`` (not Linux) the CPU families are left out."""

from __future__ import annotations

from pathlib import Path

__all__ = ["CpuMetrics"]


class CpuMetrics:
    """The CPU families' text, with the busy and total jiffies of the previous read."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._last: tuple[int, int] | None = None

    def _jiffies(self) -> tuple[int, int]:
        """(busy, total) jiffies of all cores since boot."""
        line = (self._proc / "stat").read_text().splitlines()[0]
        values = [int(v) for v in line.split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        total = sum(values[:8])  # guest time is already in user and nice
        return total - idle, total

    def _memory(self) -> tuple[int, int]:
        """(total, used) bytes of RAM."""
        info: dict[str, int] = {}
        for line in (self._proc / "meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                info[key] = int(parts[0]) * 1024
        total = info.get("MemTotal", 0)
        return total, total - info.get("MemAvailable", info.get("MemFree", 0))

    def lines(self) -> list[str]:
        """The families' text exposition lines."""
        pinned = [
            "# HELP nv_pinned_memory_pool_total_bytes Pinned memory pool total memory size, "
            "in bytes",
            "# TYPE nv_pinned_memory_pool_total_bytes gauge",
            "nv_pinned_memory_pool_total_bytes 0.0",
            "# HELP nv_pinned_memory_pool_used_bytes Pinned memory pool used memory size, in bytes",
            "# TYPE nv_pinned_memory_pool_used_bytes gauge",
            "nv_pinned_memory_pool_used_bytes 0.0",
        ]
        try:
            busy, total = self._jiffies()
            mem_total, mem_used = self._memory()
        except (OSError, ValueError, IndexError):
            return pinned
        before_busy, before_total = self._last or (0, 0)
        self._last = (busy, total)
        span = total - before_total
        utilization = (busy - before_busy) / span if span > 0 else 0.0
        return [
            "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]",
            "# TYPE nv_cpu_utilization gauge",
            f"nv_cpu_utilization {min(1.0, max(0.0, utilization)):.6f}",
            "# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes",
            "# TYPE nv_cpu_memory_total_bytes gauge",
            f"nv_cpu_memory_total_bytes {float(mem_total)!r}",
            "# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes",
            "# TYPE nv_cpu_memory_used_bytes gauge",
            f"nv_cpu_memory_used_bytes {float(mem_used)!r}",
            *pinned,
        ]
