"""The runtime as a Ray Serve application (the optional extra: ``pip install
'model-runtime[ray]'``); DESIGN.md §14.

Each Ray replica hosts the runtime's tree for the CPUs Ray gives it and answers the Open
Inference Protocol v2 through Serve's proxy with the daemon's own handlers
(:mod:`model_runtime.ray.asgi`); Python callers use the handle's ``infer(name, inputs)``.
``model-runtime serve --ray [ADDRESS] --ray-replicas N`` runs it (:func:`serve_main`).

Importing this package imports ``ray``.
"""

from __future__ import annotations

from model_runtime.ray.deployment import RuntimeReplica, replica_devices
from model_runtime.ray.launch import (
    APP_NAME,
    DEPLOYMENT_NAME,
    build_application,
    http_options,
    serve_main,
    serve_on_ray,
)

__all__ = [
    "APP_NAME",
    "DEPLOYMENT_NAME",
    "RuntimeReplica",
    "build_application",
    "http_options",
    "replica_devices",
    "serve_main",
    "serve_on_ray",
]
