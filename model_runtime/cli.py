"""The ``model-runtime`` command: compile, inspect and run executables; serve them (daemon).

Errors the runtime raises on purpose print ``error: <message>`` and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from model_runtime import __version__
from model_runtime.errors import ModelRuntimeError

__all__ = ["main"]

EXIT_ERROR = 2


def _configure_logging() -> None:
    # Logs go to stderr (stdout carries the command's result); JSON when not on a terminal.
    renderer: Any = (
        structlog.dev.ConsoleRenderer()
        if sys.stderr.isatty()
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def _parser() -> argparse.ArgumentParser:
    from model_runtime.compiler.options import OPTIMIZATION_LEVELS

    parser = argparse.ArgumentParser(prog="model-runtime", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="compile an ONNX model into an executable (.mrx)")
    c.add_argument("model", help="the ONNX model file")
    c.add_argument("-o", "--output", help="executable to write (default: MODEL.mrx)")
    c.add_argument("--batch-size", type=int, required=True, help="rows per main-program run")
    c.add_argument(
        "--device-iterations", type=int, default=1, help="batches one main run consumes (1)"
    )
    c.add_argument(
        "--replication-factor", type=int, default=1, help="replicas the target holds (1)"
    )
    c.add_argument("--target", default="cpu", help="cpu or ipu-model (cpu)")
    c.add_argument("--ipu-version", type=int, default=2, help="IPU version of ipu-model (2)")
    c.add_argument(
        "--tiles-per-ipu", type=int, default=0, help="tiles of ipu-model (0: the version's)"
    )
    c.add_argument("--batch-dim", type=int, default=0, help="the inputs' batch axis (0)")
    c.add_argument(
        "--batch-buckets",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let the program also run batches of 1, 2, 4, ... when it computes the same rows "
        "(checked by running it), so a lone request is not padded (default on)",
    )
    c.add_argument(
        "--variable", action="append", default=[], metavar="NAME", help="a mutable initializer"
    )
    c.add_argument(
        "--variable-update",
        action="append",
        default=[],
        metavar="OUTPUT=VARIABLE",
        help="graph output holding a variable's new value",
    )
    c.add_argument(
        "--optimization-level",
        choices=OPTIMIZATION_LEVELS,
        default="extended",
        help="onnxruntime graph optimisation applied offline (extended)",
    )
    c.add_argument("--cache", metavar="DIR", help="executable cache directory")
    c.add_argument("--name", help="model name recorded in the executable")

    i = sub.add_parser("inspect", help="describe an executable")
    i.add_argument("file", help="the executable (.mrx)")
    i.add_argument("--json", action="store_true", help="print JSON")

    r = sub.add_parser("run", help="run one batch of random inputs (reference runner)")
    r.add_argument("file", help="the executable (.mrx)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs (0)")

    from model_runtime.server import add_serve_arguments  # options only: no aiohttp import

    s = sub.add_parser(
        "serve", help="serve models over the Open Inference Protocol v2 (HTTP and gRPC)"
    )
    add_serve_arguments(s)

    d = sub.add_parser("demo", help="compile the demo model and run one batch (no server)")
    d.add_argument("--batch-size", type=int, default=4, help="batch size to compile for (4)")
    return parser


def _cmd_compile(args: argparse.Namespace) -> int:
    from model_runtime.compiler import CompileOptions, compile_model
    from model_runtime.errors import ConfigurationError

    updates: dict[str, str] = {}
    for item in args.variable_update:
        out, eq, var = item.partition("=")
        if not eq or not out or not var:
            raise ConfigurationError(f"--variable-update wants OUTPUT=VARIABLE, got {item!r}")
        updates[out] = var
    options = CompileOptions(
        batch_size=args.batch_size,
        device_iterations=args.device_iterations,
        replication_factor=args.replication_factor,
        target=args.target,
        ipu_version=args.ipu_version,
        tiles_per_ipu=args.tiles_per_ipu,
        variables=tuple(args.variable),
        variable_updates=updates,
        batch_dim=args.batch_dim,
        optimization_level=args.optimization_level,
        executable_cache_path=args.cache,
        model_name=args.name,
        batch_buckets=args.batch_buckets,
    )
    print(compile_model(args.model, args.output, options))
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from model_runtime.executable import Executable
    from model_runtime.executable.summary import format_summary, summarize

    exe = Executable.load(args.file)
    if args.json:
        print(json.dumps(summarize(exe), indent=2, sort_keys=True, default=str))
    else:
        print(format_summary(exe))
    return 0


def _print_outputs(outputs: dict[str, np.ndarray]) -> None:
    for name, value in outputs.items():
        flat = value.reshape(-1)[:5]
        print(f"{name}: {value.dtype.name}{list(value.shape)} first values {flat.tolist()}")


def _cmd_run(args: argparse.Namespace) -> int:
    from model_runtime.compiler import random_inputs, run_reference
    from model_runtime.executable import Executable

    exe = Executable.load(args.file)
    inputs = random_inputs(exe, seed=args.seed)
    _print_outputs(run_reference(exe, inputs))
    return 0


def _demo_model() -> Path:
    demo = Path(__file__).parent / "demo" / "digits_mlp.onnx"
    if demo.exists():
        return demo
    import onnx

    light = Path(os.path.dirname(onnx.__file__)) / "backend/test/data/light/light_squeezenet.onnx"
    return light


def _cmd_serve(args: argparse.Namespace) -> int:
    if args.ray is not None:
        try:
            from model_runtime.ray import serve_main as serve_on_ray
        except ImportError as exc:
            print(f"error: --ray needs the 'ray' extra ({exc}): pip install 'model-runtime[ray]'")
            return EXIT_ERROR
        return serve_on_ray(args)
    from model_runtime.server import serve_main

    return serve_main(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from model_runtime.compiler import CompileOptions, compile_model, random_inputs, run_reference
    from model_runtime.executable import Executable

    # The first end-to-end path, without the actors: compile -> load -> run one batch.
    with tempfile.TemporaryDirectory(prefix="model-runtime-demo-") as tmp:
        model = _demo_model()
        print(f"demo: compiling {model.name} for batch size {args.batch_size}")
        path = compile_model(
            model, Path(tmp) / "demo.mrx", CompileOptions(batch_size=args.batch_size)
        )
        exe = Executable.load(path)
        outputs = run_reference(exe, random_inputs(exe))
        for name, value in outputs.items():
            anchor = exe.metadata.anchor(name)
            if anchor.batch_dim is None:
                continue
            rows = np.moveaxis(value, anchor.batch_dim, 0).reshape(
                value.shape[anchor.batch_dim], -1
            )
            print(f"{name}: predictions {rows.argmax(axis=1).tolist()} for {len(rows)} samples")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``model-runtime`` command line; return the exit status.

    Raises:
        SystemExit: from argparse on bad usage (status 2) or ``--help`` (status 0).
    """
    args = _parser().parse_args(argv)
    if args.command != "serve":  # the daemon configures its own logging
        _configure_logging()
    commands = {
        "compile": _cmd_compile,
        "inspect": _cmd_inspect,
        "run": _cmd_run,
        "serve": _cmd_serve,
        "demo": _cmd_demo,
    }
    try:
        return commands[args.command](args)
    except ModelRuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
