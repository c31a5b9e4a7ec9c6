"""The daemon: Open Inference Protocol v2 (KServe v2) over HTTP (DESIGN.md §11).

``model-runtime serve`` builds its parser with :func:`add_serve_arguments` and calls
:func:`serve_main`; ``python -m model_runtime.server`` does the same standalone. Only the
options module is imported eagerly, so building the CLI parser does not import aiohttp.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# The daemon starts python model instances with fork and exec (libuv's spawn, under uvloop);
# grpc's fork handlers are for children that go on using grpc, which ours never do, and they
# log a line per spawn. Off before grpc is first imported, unless the operator set it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from model_runtime.server.daemon.options import (
    DaemonOptions,
    add_serve_arguments,
    options_from_args,
)

if TYPE_CHECKING:
    from model_runtime.server.daemon.serve import build_parser, main, run_daemon, serve, serve_main

__all__ = [
    "DaemonOptions",
    "add_serve_arguments",
    "build_parser",
    "main",
    "options_from_args",
    "run_daemon",
    "serve",
    "serve_main",
]

_LAZY = {"build_parser", "main", "run_daemon", "serve", "serve_main"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from model_runtime.server.daemon import serve as daemon

        return getattr(daemon, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
