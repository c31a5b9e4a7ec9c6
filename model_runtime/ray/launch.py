"""The Serve application and ``model-runtime serve --ray``.

:func:`build_application` makes the Ray Serve application: ``replicas`` Ray replicas of
:class:`~model_runtime.ray.deployment.RuntimeReplica`, each with ``cpus_per_replica`` CPUs
(its devices) and the same :class:`~model_runtime.server.daemon.options.DaemonOptions` a daemon
takes (models, repository, runner settings, ``--replicas`` per model inside each Ray replica).

:func:`serve_main` runs it from the command line: it joins the cluster at ``--ray ADDRESS``
(``auto``: the one this machine belongs to, else a local one on ``--host``), starts Serve's
HTTP proxy on ``--host``/``--port``, deploys, and on SIGTERM/SIGINT deletes the application,
which drains every replica as the daemon drains (503 to new requests, in-flight ones finish
within ``--grace-period``, runners close and run their save programs), then exits 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

import ray
import structlog
from ray import serve

from model_runtime.errors import ConfigurationError, ModelRuntimeError
from model_runtime.ray.deployment import RuntimeReplica
from model_runtime.server.daemon.logs import configure_logging
from model_runtime.server.daemon.options import DaemonOptions, options_from_args

__all__ = [
    "APP_NAME",
    "DEPLOYMENT_NAME",
    "PROXY_TIMEOUT_MARGIN",
    "build_application",
    "http_options",
    "serve_main",
    "serve_on_ray",
]

log = structlog.get_logger(__name__)

APP_NAME = "model-runtime"
DEPLOYMENT_NAME = "ModelRuntime"
#: Requests one Ray replica may hold at once. Serve's default (5) would starve the batcher:
#: our queues batch many small callers, and admission control refuses past the latency budget.
MAX_ONGOING_REQUESTS = 512
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Seconds the proxies wait past the request timeout before they answer 408 themselves.
PROXY_TIMEOUT_MARGIN = 1.0


def build_application(
    opts: DaemonOptions,
    *,
    replicas: int = 1,
    cpus_per_replica: float = 1.0,
    max_replicas_per_node: int | None = None,
    devices: str | None = None,
    max_ongoing_requests: int = MAX_ONGOING_REQUESTS,
) -> Any:
    """The Serve application (``serve.run`` it): ``replicas`` replicas of the runtime.

    ``max_replicas_per_node`` spreads replicas over nodes (None: Serve places them);
    ``devices``: each replica's inventory in ``MODEL_RUNTIME_DEVICES`` syntax (None: one cpu
    device per CPU Ray assigns it).

    Raises:
        ConfigurationError: ``replicas`` < 1 or ``cpus_per_replica`` <= 0.
    """
    if replicas < 1:
        raise ConfigurationError(f"Ray replicas must be >= 1, got {replicas}")
    if not cpus_per_replica > 0:
        raise ConfigurationError(f"CPUs per Ray replica must be > 0, got {cpus_per_replica}")
    ingress = serve.ingress()(RuntimeReplica)
    options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "num_replicas": replicas,
        "ray_actor_options": {"num_cpus": cpus_per_replica},
        "max_ongoing_requests": max_ongoing_requests,
        # Serve force-kills a replica past this: leave the drain its grace period.
        "graceful_shutdown_timeout_s": opts.grace_period + 5.0,
        "health_check_period_s": 5.0,
    }
    if max_replicas_per_node is not None:
        options["max_replicas_per_node"] = max_replicas_per_node
    deployment: Any = serve.deployment(ingress, **options)
    return deployment.bind(opts, devices)


def serve_on_ray(
    opts: DaemonOptions,
    address: str = "auto",
    replicas: int = 1,
    cpus_per_replica: float = 1.0,
    stop: threading.Event | None = None,
) -> int:
    """Deploy on the Ray cluster at ``address`` and serve until ``stop`` is set (by default,
    until SIGTERM/SIGINT); return the exit status.

    Raises:
        ConfigurationError: bad options.
        ConnectionError: ``address`` names a cluster that cannot be reached.
    """
    app = build_application(opts, replicas=replicas, cpus_per_replica=cpus_per_replica)
    local = _init_ray(address, opts.host)
    stop = stop or _signal_event()
    try:
        serve.start(http_options=http_options(opts))
        serve.run(app, name=APP_NAME, route_prefix="/")
        url = f"http://{opts.host}:{opts.port}/v2"
        log.info(
            "ray_app_ready",
            url=url,
            replicas=replicas,
            cluster=ray.get_runtime_context().gcs_address,
        )
        stop.wait()
        log.info("ray_app_draining", grace_period=opts.grace_period)
        t0 = time.monotonic()
        serve.delete(APP_NAME)  # each replica drains (RuntimeReplica.__del__)
        log.info("ray_app_stopped", seconds=round(time.monotonic() - t0, 3))
    finally:
        if local:
            serve.shutdown()  # type: ignore[no-untyped-call]
            ray.shutdown()
    return 0


def http_options(opts: DaemonOptions) -> dict[str, Any]:
    """Serve's HTTP options for ``opts``: its address, and its request timeout as the proxies'
    end-to-end bound (plus :data:`PROXY_TIMEOUT_MARGIN`, so a replica that answers its own
    504 is heard first). Without it a request routed to a replica whose node just died waits
    until Ray declares the node dead; with it the proxy answers 408 by then."""
    options: dict[str, Any] = {"host": opts.host, "port": opts.port}
    if opts.request_timeout is not None:
        options["request_timeout_s"] = opts.request_timeout + PROXY_TIMEOUT_MARGIN
    return options


def _init_ray(address: str, host: str) -> bool:
    """Join the cluster at ``address``; with ``auto`` and no cluster, start a local one (on
    loopback when ``host`` is). Return True when the cluster is ours to stop."""
    node_ip = "127.0.0.1" if host in _LOOPBACK else None
    if address != "local":
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
            return False
        except ConnectionError:
            if address != "auto":
                raise
    ray.init(include_dashboard=False, _node_ip_address=node_ip, log_to_driver=False)
    return True


def _signal_event() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    return stop


def serve_main(args: argparse.Namespace) -> int:
    """``model-runtime serve --ray [ADDRESS] --ray-replicas N ...``: ``args`` parsed with
    :func:`~model_runtime.server.daemon.options.add_serve_arguments`. Returns the exit status (2 for
    a configuration error, reported on stderr).
    """
    try:
        opts = options_from_args(args)
    except (ConfigurationError, ModelRuntimeError) as exc:
        print(f"model-runtime serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(opts.log_level, opts.log_format)
    if getattr(args, "grpc_port", None) is not None:
        # Never silently ignored: Serve's gRPC proxy needs generated servicers of its own.
        print(
            "model-runtime serve: --grpc-port is not served with --ray (HTTP only)", file=sys.stderr
        )
        return 2
    try:
        return serve_on_ray(opts, opts.ray_address or "auto", opts.ray_replicas, opts.ray_cpus)
    except (ConfigurationError, ModelRuntimeError, ConnectionError) as exc:
        log.error("ray_serve_failed", error=str(exc))
        return 2 if isinstance(exc, ModelRuntimeError) else 1
