"""The life of a model version once started: installed as the one that serves (one step, no
await), its readiness watched, and retired (reported, then closed) when a reload swaps it out
or an unload ends it. :class:`~model_runtime.server.repository.repository.ModelRepository`
decides when; this module is how."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import anyio
import anyio.abc
import structlog

from model_runtime.errors import DeviceUnavailableError, ModelLoadError, ModelRuntimeError
from model_runtime.server.repository.entries import Fingerprint, ModelEntry, ModelState, ModelStats
from model_runtime.server.repository.versions import StartedVersion
from model_runtime.server.serving import RunnerLike, ServingRunner, replica_states

__all__ = [
    "RetireHook",
    "close_versions",
    "detached",
    "install",
    "load_failed",
    "retire",
    "watch_readiness",
    "why_failed",
]

_T = TypeVar("_T")

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


async def detached(tg: anyio.abc.TaskGroup | None, work: Coroutine[Any, Any, _T]) -> _T:
    """Run ``work`` in the repository's task group ``tg`` and wait for it: a client that goes
    away stops waiting but does not cancel a load or unload half done (closing the repository
    does).

    Raises:
        ModelRuntimeError: the repository is not open; else what ``work`` raises.
    """
    if tg is None:
        work.close()
        raise ModelRuntimeError("the model repository is not open (use `async with`)")
    done: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
    done.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody may wait

    async def run() -> None:
        try:
            done.set_result(await work)
        except Exception as exc:
            done.set_exception(exc)
        except BaseException:
            done.cancel()
            raise

    tg.start_soon(run)
    return await asyncio.shield(done)


def why_failed(exc: Exception, entry: ModelEntry) -> str:
    """Why a load of ``entry`` failed, for its reason and the client's answer."""
    why = str(exc) or type(exc).__name__
    if isinstance(exc, DeviceUnavailableError) and entry.runner is not None:
        why += (
            "; a reload loads the new version beside the serving one, which keeps its "
            "devices until the swap: free a device, or unload the model and load it again"
        )
    return why


def load_failed(entry: ModelEntry, exc: Exception, fp: Fingerprint | None) -> None:
    """Record a failed load of ``entry`` (``fp``: its files' fingerprint, so a poll tries
    again only when they change): UNAVAILABLE with the reason, or the serving version on with
    the reason noted."""
    entry.fingerprint = fp
    entry.load_failures += 1
    reason = str(exc) if isinstance(exc, ModelLoadError) else why_failed(exc, entry)
    if not reason.startswith("failed to load"):
        reason = f"failed to load '{entry.name}': {reason}"
    serving = entry.runner is not None
    if serving:
        entry.reason = f"{reason} (the previous version is still serving)"
    else:
        entry.state, entry.reason = ModelState.UNAVAILABLE, reason
    log.error("model_load_failed", model=entry.name, error=reason, still_serving=serving)
