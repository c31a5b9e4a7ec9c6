"""The daemon's garbage-collector settings: an application's choice, so the daemon makes it
and the library (``execute()`` in someone else's process) never does.

CPython's cyclic collector with its defaults took 2.4 s of the daemon's event loop in 20 s at
3x capacity, and paused it for 60 ms at a time. A full collection scans every container object (some
190,000 while the daemon served 3,500 connections: modules, onnx graphs, aiohttp and grpc
machinery, connections), none of them garbage; a young collection every 700 allocations
promotes the requests in flight, which the middle generation then scans again and again.
Measured with the overload benchmark's load generator (``benchmarks/loadgen.py``) at 9,900
requests/s (3x capacity) for 20 s, collections timed with ``gc.callbacks``: 2,155 young, 196
middle (3.8 ms each), 17 full (54-67 ms each, collecting nothing); 2.4 s of collection in all.

:func:`settle_heap` (called once the models of the start are loaded):

- **freezes** what survived the startup (``gc.freeze``): never scanned again;
- **collects the young generation every** :data:`GEN0_THRESHOLD` **allocations**: most
  requests' objects die before it, so fewer are promoted and rescanned. (50,000 was worse:
  its young collections took up to 36 ms.)

The same run with both: 204 young, 18 middle, 2 full collections (23 ms), 0.39 s in all; 3,018
answers/s against 2,750, and a refusal p99 of 22 ms against 50-85 ms.
"""

from __future__ import annotations

import gc

__all__ = ["GEN0_THRESHOLD", "settle_heap"]

#: Allocations (less deallocations) of container objects between young collections.
GEN0_THRESHOLD = 7000


def settle_heap() -> int:
    """Collect once, freeze what is left, and set the young generation's threshold to
    :data:`GEN0_THRESHOLD` (the older ones keep CPython's). Returns the objects frozen.

    Raises:
        nothing.
    """
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
    return gc.get_freeze_count()
