"""One Ray Serve replica: the runtime's tree on its node's devices, behind the daemon's routes.

Each replica (:class:`RuntimeReplica`) is what one ``model-runtime serve`` daemon is, minus
the listeners: the same
:class:`~model_runtime.server.repository.repository.ModelRepository` built by the daemon's own
:func:`~model_runtime.server.daemon.serve.build_repository` (a ModelRunner per model, batching
with our queues, healing under our supervisor), and the same
:class:`~model_runtime.server.inference.plane.DataPlane` under the HTTP front end's handlers,
answering through Serve's proxy
(:mod:`model_runtime.ray.asgi`). Python callers use the deployment handle::

    handle = serve.get_app_handle("model-runtime")
    outputs = await handle.infer.remote("digits_mlp", {"pixels": batch})

Devices: a replica uses the CPUs Ray assigned to it, never every device it can see. Ray
does not pin CPUs, so the replica's inventory is ``cpu:<assigned CPUs>x1`` (or ``devices``,
``MODEL_RUNTIME_DEVICES``' syntax), and its device locks live in a directory of its own (Ray's
resource accounting, not our lock files, keeps replicas on one machine apart; nodes of a test
cluster share one machine and would otherwise take each other's ``device-0``).

Lifecycle: the constructor loads every model (one that fails is UNAVAILABLE, as in the
daemon) and returns when the start loads are done; the runtime's tree runs in a task of its
own on the replica's event loop (a model subtree's task group is entered and left in that one
task). Serve's graceful shutdown calls ``__del__``: new requests get 503, in-flight ones
finish within the grace period, every runner closes (save programs run), then the tree stops.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import ray
import structlog
from ray import serve

from model_runtime.errors import ModelRuntimeError, RunnerStoppedError
from model_runtime.ray.asgi import OipAsgiApp
from model_runtime.server.daemon.options import DaemonOptions
from model_runtime.server.daemon.serve import build_repository
from model_runtime.server.http.routes import HttpFrontEnd
from model_runtime.server.inference.plane import DataPlane, ServerOptions
from model_runtime.server.repository.entries import ModelState
from model_runtime.server.repository.repository import ModelRepository
from model_runtime.server.tensors.request import InferRequest

__all__ = ["RuntimeReplica", "replica_devices"]

log = structlog.get_logger(__name__)

DEVICES_ENV = "MODEL_RUNTIME_DEVICES"
LOCK_DIR_ENV = "MODEL_RUNTIME_DIR"
#: The runner's latency budget on Ray (seconds) unless configured: Serve's proxy has no
#: admission control, so the runner refuses a queue it would take longer than this to serve.
RAY_LATENCY_BUDGET = 1.0


def replica_devices(assigned: Mapping[str, float], devices: str | None = None) -> str:
    """The device inventory (``MODEL_RUNTIME_DEVICES`` syntax) of a replica that Ray gave
    ``assigned`` resources: ``devices`` if given, else one single-threaded cpu device per whole
    CPU assigned (at least one: a replica with a fractional CPU still needs a device)."""
    if devices:
        return devices
    return f"cpu:{max(1, int(assigned.get('CPU', 1.0)))}x1"


class RuntimeReplica:
    """The body of the Serve deployment (see the module docstring); :func:`~model_runtime.ray.
    launch.build_application` wraps it in ``serve.ingress`` and ``serve.deployment``."""

    # Serve awaits an async constructor (its ingress wrapper's __init__ is async too).
    async def __init__(self, opts: DaemonOptions, devices: str | None = None) -> None:  # type: ignore[misc]
        """Load the models of ``opts`` on this replica's devices.

        Raises:
            ConfigurationError: the options do not describe a servable set of models.
        """
        context = serve.get_replica_context()
        self.replica_id: str = context.replica_id.unique_id
        self.node_id: str = ray.get_runtime_context().get_node_id()
        assigned = ray.get_runtime_context().get_assigned_resources()  # type: ignore[no-untyped-call]
        # Before the first runner starts the runtime root (which reads the inventory).
        os.environ[DEVICES_ENV] = replica_devices(assigned, devices)
        lock_dir = Path(tempfile.gettempdir()) / f"model-runtime-ray-{os.getuid()}"
        self._lock_dir = lock_dir / self.replica_id
        os.environ[LOCK_DIR_ENV] = str(self._lock_dir)
        structlog.contextvars.bind_contextvars(ray_replica=self.replica_id)
        if opts.runner.latency_budget is None:  # Serve's proxy has no admission control
            opts = replace(opts, runner=replace(opts.runner, latency_budget=RAY_LATENCY_BUDGET))
        self.opts = opts
        repo, names = build_repository(opts)
        self.repository: ModelRepository = repo
        self.plane = DataPlane(
            repo,
            ServerOptions(
                max_body_size=opts.max_body_size,
                request_timeout=opts.request_timeout,
                access_log=False,  # Serve's replica logs one line per request already
                admission_delay=opts.admission_delay or None,
                # Serve's proxy routes no shared memory calls, and clients are on other nodes.
                allow_client_shm=False,
            ),
        )
        self._stop = asyncio.Event()
        self._loaded = asyncio.Event()
        self._host = asyncio.get_running_loop().create_task(self._run(names))
        await self._loaded.wait()
        if self._host.done():  # the repository could not even open
            self._host.result()
        log.info(
            "ray_replica_ready",
            replica=self.replica_id,
            node=self.node_id,
            devices=os.environ[DEVICES_ENV],
            loaded=[e.name for e in repo.entries() if e.runner is not None],
        )

    async def _run(self, names: list[str]) -> None:
        """Host the repository (its task group) from load to close, in this one task."""
        try:
            async with self.repository as repo:
                for name in names:
                    try:
                        await repo.load(name)
                    except (ModelRuntimeError, OSError) as exc:
                        log.error("startup_load_failed", model=name, error=str(exc))
                self._loaded.set()
                await self._stop.wait()
                await repo.close_all()
        finally:
            self._loaded.set()

    def __serve_build_asgi_app__(self) -> OipAsgiApp:
        """The HTTP application Serve's proxy reaches (called once, after the constructor)."""
        return OipAsgiApp(
            HttpFrontEnd(self.plane), {"replica": self.replica_id, "node": self.node_id}
        )

    async def infer(
        self,
        name: str,
        inputs: Mapping[str, np.ndarray],
        version: str | None = None,
        timeout: float | None = None,
        priority: int = 0,
    ) -> dict[str, np.ndarray]:
        """Run ``inputs`` on model ``name`` (``version``: the served one if None) within the
        server's request timeout (``timeout``, seconds, can only shorten it), at the protocol's
        ``priority`` (1 highest, 0 default): the handle's path, for Python callers.

        Raises:
            UnknownModelError: no such model or version.
            RunnerStoppedError: the model is not loaded or the replica is draining.
            InputValidationError: the inputs do not fit the model.
            QueueFullError: admission control refused the request (overload).
            ExecutionTimeoutError, TimeoutError: past the deadline.
            ModelRuntimeError: the device failed and recovery gave up on the request.
        """
        plane = self.plane
        entry = plane.entry(name, version)
        runner = entry.runner
        if plane.draining or runner is None or entry.state is not ModelState.READY:
            why = "the replica is draining" if plane.draining else f"is {entry.state.value}"
            raise RunnerStoppedError(f"model {entry.name!r}: {why}")
        request = InferRequest(None, dict(inputs), (), timeout=timeout, priority=priority)
        plane.enter_request(entry.name, entry.version)
        try:
            return await plane.execute(entry, runner, request)
        finally:
            plane.leave_request(entry.name, entry.version)

    def identity(self) -> dict[str, str]:
        """This replica's Ray replica id and node id."""
        return {"replica": self.replica_id, "node": self.node_id}

    async def check_health(self) -> None:
        """Serve's health check: fails once the runtime's host has ended or a model that
        should serve has no runner (its tree gave up on it); Serve then replaces the replica.
        A replica recovering a device (our supervisor's job) stays healthy.

        Raises:
            RuntimeError: unhealthy, saying why.
        """
        if self._host.done() and not self._stop.is_set():
            raise RuntimeError(f"the runtime's host ended: {self._host!r}")
        lost = [e.name for e in self.repository.entries() if e.wanted and e.runner is None]
        if lost:
            raise RuntimeError(f"model(s) not serving: {lost}")

    async def __del__(self) -> None:
        """Serve's graceful shutdown: drain (503 to new requests, in-flight ones finish within
        the grace period), close every runner (save programs run), stop the tree."""
        if not hasattr(self, "_host"):
            return
        grace = self.opts.grace_period
        if not await self.plane.drain(grace):
            log.warning("drain_incomplete", grace_period=grace)
        self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._host), grace)
        except (TimeoutError, Exception) as exc:  # never fail Serve's shutdown
            log.warning("ray_replica_close_failed", error=repr(exc))
        else:  # this replica's own lock files: nobody else opens them
            shutil.rmtree(self._lock_dir, ignore_errors=True)
        log.info("ray_replica_stopped", replica=self.replica_id)
