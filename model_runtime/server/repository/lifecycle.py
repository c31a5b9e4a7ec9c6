"""The life of a model version once started: installed as the one that serves (one step, no
await), its readiness watched, and retired (reported, then closed) when a reload swaps it out
or an unload ends it. :class:`~model_runtime.server.repository.repository.ModelRepository`
decides when; this module is how."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import anyio
import structlog

from model_runtime.server.repository.entries import ModelEntry, ModelState, ModelStats
from model_runtime.server.repository.versions import StartedVersion
from model_runtime.server.serving import RunnerLike, ServingRunner, replica_states

__all__ = ["RetireHook", "close_versions", "install", "retire", "watch_readiness"]

# The repository's logger: these events always came from it.
log = structlog.get_logger("model_runtime.server.repository.repository")

#: Awaited with (model, version, runner) just before a runner that served closes.
RetireHook = Callable[[str, str, RunnerLike], Awaitable[None]]


def install(
    entry: ModelEntry,
    version: str,
    new: StartedVersion,
    stats: dict[str, ModelStats],
    stop: anyio.Event,
) -> None:
    """Make ``new`` the runner ``entry`` serves ``version`` with, in one step (no await): a
    request reads either the old runner or the new. ``stop`` ends its readiness watch."""
    if entry.version != version:
        entry.stats = stats.get(version) or ModelStats()
    entry.version = version
    entry.inputs, entry.outputs, entry.served = new.inputs, new.outputs, new.served
    entry.datatypes = {s.name: s.datatype for s in new.outputs}
    entry.sequences = new.sequences
    if entry.runner is None:
        entry.runner = ServingRunner(new.runner)
    else:
        entry.runner.current = new.runner
    entry.stop = stop
    entry.state, entry.reason = ModelState.READY, ""


async def _first_of(events: Sequence[anyio.Event]) -> None:
    """Return when any of ``events`` is set."""
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


async def watch_readiness(
    entry: ModelEntry,
    runner: RunnerLike,
    stop: anyio.Event,
    changed: Callable[[str, bool], None],
) -> None:
    """Log (and report to ``changed``) every change of the model's readiness until ``stop``,
    however short: each replica's state sets an event on every status change."""
    states = replica_states(runner)
    ready = runner.is_ready
    while states and not stop.is_set():
        await _first_of([*(s.changed for s in states), stop])
        now = runner.is_ready
        if now != ready and not stop.is_set():
            ready = now
            statuses = [s.value for s in runner.replica_status()]
            log.info("model_readiness_changed", model=entry.name, ready=now, replicas=statuses)
            changed(entry.name, now)


async def retire(
    name: str, runner: RunnerLike, version: str | None, hook: RetireHook | None
) -> None:
    """Close a version that was swapped out: it finishes what it took, then lets go of its
    devices (logged, never raised: the new version serves already). A ``version`` that
    served is reported to ``hook`` first."""
    if version is not None:
        await _report(name, version, runner, hook)
    try:
        await runner.close()
    except Exception as exc:
        log.error("model_close_failed", model=name, error=str(exc))
    log.info("model_version_retired", model=name)


async def _report(name: str, version: str, runner: RunnerLike, hook: RetireHook | None) -> None:
    """Await ``hook`` for a runner about to close (logged, never raised)."""
    if hook is None:
        return
    try:
        with anyio.CancelScope(shield=True):  # an unload cancelled here still closes
            await hook(name, version, runner)
    except Exception as exc:
        log.error("model_retire_hook_failed", model=name, version=version, error=str(exc))


async def close_versions(entry: ModelEntry, hook: RetireHook | None) -> None:
    """Close every version of ``entry``, each reported to ``hook`` first (None at shutdown,
    where nobody reads the metrics again); never raises."""
    others, entry.versions = list(entry.versions.values()), {}
    for version in [*others, entry]:
        serving = version.runner
        if serving is None:
            continue
        version.state = ModelState.UNLOADING
        if version.stop is not None:
            version.stop.set()
        try:
            await _report(entry.name, version.version, serving.current, hook)
            await serving.close()
        except Exception as exc:
            log.error("model_close_failed", model=entry.name, error=str(exc))
        finally:
            version.runner = version.stop = version.served = version.sequences = None
            version.state, version.reason = ModelState.UNAVAILABLE, "unloaded"
