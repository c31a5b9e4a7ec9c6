"""The daemon: Open Inference Protocol v2 (KServe v2) over HTTP (DESIGN.md §11).

``model-runtime serve`` calls :func:`serve_main` with options from :func:`add_serve_arguments`;
``python -m model_runtime.server`` does the same standalone.
"""

from model_runtime.server.daemon import build_parser, main, run_daemon, serve, serve_main
from model_runtime.server.options import DaemonOptions, add_serve_arguments, options_from_args

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
