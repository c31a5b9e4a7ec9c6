"""The Watchdog actor: heartbeats, stall detection and restarts."""

from actors.watchdog.actor import Watchdog, WatchTarget

__all__ = ["WatchTarget", "Watchdog"]
