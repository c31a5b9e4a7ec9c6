"""When a device runs a main run on the event loop instead of its worker thread.

A run shorter than a thread hop, asked of an idle device, costs its caller less on the loop
than through the worker (see ``Device.runs_inline``); this module says how short is short.
"""

from __future__ import annotations

__all__ = ["INLINE_BELOW", "INLINE_HOPS", "inline_below"]

#: A main run of one row measured (moving average) under this many seconds, asked of an idle
#: device without a fault plan, runs on the event loop instead of the worker thread (a lone
#: request; bigger batches mean other callers, and replicas whose runs must overlap). On
#: the 2-core machine the hop there and back costs 80 µs empty and ~160 µs with a run (the
#: woken worker runs it on cold caches: MLP batch 1, 86 µs inline, 245 µs through the worker),
#: so such a run holds the loop for less than it would delay its caller. Under load the device
#: is never idle and nothing runs inline; heavier runs never block the loop; nor does a run
#: while another device of the runner is busy (``inline_allowed``: the loop serves it too).
INLINE_BELOW = 250e-6
#: ... or up to this many of the worker's measured hops (``Worker.hop_seconds``), on a host
#: slower than that one (the hop slows with the run), but never over 4 x ``INLINE_BELOW``.
INLINE_HOPS = 3.0


def inline_below(hop_seconds: float) -> float:
    """How short (seconds) a one-row run must measure to run inline, given the worker's
    measured hop (0: not measured): :data:`INLINE_BELOW`, or :data:`INLINE_HOPS` hops on a
    slower host, never over 4 x :data:`INLINE_BELOW`."""
    return min(4 * INLINE_BELOW, max(INLINE_BELOW, INLINE_HOPS * hop_seconds))
