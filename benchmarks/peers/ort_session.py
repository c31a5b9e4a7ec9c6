"""The onnxruntime session every peer server runs: the runtime's cpu device options.

Imported by the peer servers inside their own virtual environments (plain onnxruntime, nothing
of the project), so MLServer, KServe and the daemon compute with the same session: ``threads``
intra-op threads, one inter-op thread, sequential execution, every graph optimization, thread
pool spinning off (``actors/device/backends/cpu.py``).
"""

from __future__ import annotations

import onnxruntime as ort


def make_session(path: str, threads: int) -> ort.InferenceSession:
    """An onnxruntime CPU session of the model at ``path`` with the runtime's options."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.log_severity_level = 3  # errors only: no warnings about unused initializers
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
