"""Stateful models: Triton's sequence batcher, with each sequence's state kept on the host.

A stateful model (an RNN over a session, streaming speech, an online accumulator) keeps state
between the requests of one client: a *sequence*, named by its correlation id (an integer other
than 0, or a non-empty string), opened by a request with ``start`` and closed by one with
``end``. Triton describes such a model in ``config.pbtxt``'s ``sequence_batching``: control
inputs the batcher fills (START, END, READY, CORRID) and implicit ``state`` pairs, an input the
model reads its state from and an output it writes the next state to.

Here the model itself is stateless (an ONNX graph of inputs to outputs): :class:`SequenceRunner`
wraps a runner, and for each step of a sequence feeds the control inputs and the sequence's
current state beside the client's inputs, runs the step like any request (so steps of
different sequences share batches: the runner's dynamic batching puts one row per sequence in
a batch), and keeps the state output as the sequence's state once the step succeeded. The state
lives on the host, in :class:`SequenceTable`, never on a device, so:

* a step is applied exactly once: the state changes only when its step's answer is produced; a
  step that fails (a device fault the runner could not retry away, a timeout) leaves the state
  as it was, and the client may send it again;
* a replica reset, restart or evacuation loses no state: the runner retries or moves the batch
  like any other, and the next step of every sequence reads the state of its last completed
  step, on whichever replica runs it (Triton keeps implicit state on its instance, so a fault
  there loses the sequence);
* a reload keeps live sequences (the repository hands the table to the model's next version
  when its sequence settings are the same).

Triton's rules, as its sequence batcher applies them: a request of a sequence model must name
a sequence (:data:`NO_CORRELATION_ID`); one row per request (:data:`BATCH_ONE`); the first
request of a sequence must set ``start`` (:data:`NOT_STARTED`, which also says when the
sequence was released for idling); a ``start`` for a live sequence ends that one and begins
anew (Triton's "previous sequence will be terminated early", logged); a sequence idle longer
than ``max_idle`` is released; at most ``slots`` sequences are live at once (Triton's direct
strategy: one slot per batch row per instance), and a new one waits for a slot (Triton's
backlog), within the request's timeout. The steps of one sequence run one at a time, in the
order they arrived.
"""

from __future__ import annotations

from model_runtime.sequences.config import (
    Control,
    ControlKind,
    SequenceConfig,
    SequenceStep,
    StatePair,
)
from model_runtime.sequences.runner import SequenceRunner
from model_runtime.sequences.table import SequenceCounts, SequenceTable

__all__ = [
    "Control",
    "ControlKind",
    "SequenceConfig",
    "SequenceCounts",
    "SequenceRunner",
    "SequenceStep",
    "SequenceTable",
    "StatePair",
]
