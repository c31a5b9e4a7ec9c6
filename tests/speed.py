"""Compiled program vs the model it came from, timed in the same process (issue 13).

Shared by ``tests/integration/test_compiled_speed.py`` and ``benchmarks/compiled_vs_source.py``.
The compiled side is the real device path (:class:`CpuBackend` ``run_main``); the source side
is plain onnxruntime on the source model at the same batch (re-batched the way the compiler
does, weights as the model's own initializers), with the very session options the backend uses.
Runs are interleaved (ABBA) so a noisy neighbour slows both sides alike, and medians compared.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort

from actors.device.backends.cpu import CpuBackend
from actors.device.backends.ort_sessions import session_options
from actors.device.inventory import DeviceSpec
from model_runtime.compiler import CompileOptions
from model_runtime.compiler.rebatch import prepare, rebatch
from model_runtime.executable import Executable

__all__ = ["Timing", "compare", "source_at_batch"]


@dataclass(frozen=True, slots=True)
class Timing:
    """Median seconds per run of each side, and their ratio (compiled / source)."""

    compiled_s: float
    source_s: float
    runs: int

    @property
    def ratio(self) -> float:
        return self.compiled_s / self.source_s


def source_at_batch(model: onnx.ModelProto, batch: int) -> bytes:
    """The source model with its batch fixed at ``batch`` (as the compiler re-batches it)."""
    options = CompileOptions(batch_size=batch)
    prepared = prepare(model, options, "source")
    data: bytes = rebatch(prepared, batch, 0, "source").proto.SerializeToString()
    return data


def compare(
    exe: Executable,
    source: bytes,
    *,
    threads: int = 1,
    runs: int = 15,
    warmup: int = 3,
    seed: int = 0,
) -> Timing:
    """Time ``exe`` on a cpu device of ``threads`` against ``source`` (see module docstring)."""
    spec = DeviceSpec(0, "cpu", threads)
    backend = CpuBackend(spec)
    backend.load(exe, None)
    session = ort.InferenceSession(
        source, session_options(spec, exe), providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(seed)
    batch = {a.name: rng.standard_normal(a.shape).astype(a.dtype) for a in exe.metadata.user_inputs}
    feed = {a.handle: batch[a.name] for a in exe.metadata.user_inputs}
    names = [o.name for o in session.get_outputs()]
    batches = [batch] * exe.metadata.device_iterations

    def compiled() -> float:
        t = time.perf_counter()
        backend.run_main(batches)
        return time.perf_counter() - t

    def plain() -> float:
        t = time.perf_counter()
        for _ in batches:
            session.run(names, feed)
        return time.perf_counter() - t

    for _ in range(warmup):
        compiled()
        plain()
    c: list[float] = []
    s: list[float] = []
    for i in range(runs):
        if i % 2:
            c.append(compiled())
            s.append(plain())
        else:
            s.append(plain())
            c.append(compiled())
    backend.unload()
    return Timing(statistics.median(c), statistics.median(s), runs)
