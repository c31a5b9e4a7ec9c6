"""The daemon programs ``benchmarks/http_cost.py --profile`` and ``--stages`` run.

Each is the source of a ``python -c`` program that starts the daemon (``runpy``) with a probe
around it: :data:`PROFILED` under cProfile (thread CPU time), :data:`STAGED` with each function
of :data:`STAGES` wrapped to add up its thread CPU time and calls, dumped as JSON on SIGUSR1.
Both are ``str.format`` templates (``out``; ``stages`` for :data:`STAGED`).
"""

from __future__ import annotations

__all__ = ["PROFILED", "SLOWED", "STAGED", "STAGES"]

PROFILED = """
import cProfile, runpy, sys, time
sys.argv[0] = "model_runtime.server"
p = cProfile.Profile(time.thread_time)
p.enable()
try:
    runpy.run_module("model_runtime.server", run_name="__main__")
finally:
    p.disable()
    p.dump_stats({out!r})
"""


#: The stages ``--stages`` measures: (module, class or "", function).
STAGES = [
    ("model_runtime.server.http.connection", "GuardedConnection", "data_received"),
    ("model_runtime.server.inference.plane", "DataPlane", "decode"),
    ("model_runtime.server.http.fastcall", "", "submit"),
    ("model_runtime.server.http.fastcall", "FastCall", "_ran"),
    ("model_runtime.server.inference.plane", "DataPlane", "encode"),
    ("model_runtime.server.inference.plane", "DataPlane", "finish_request"),
    ("model_runtime.server.http.pipelined", "ProtocolLevelAnswers", "fast_answer"),
    ("model_runtime.server.http.fastcall", "FastCall", "_end"),
    ("actors.session.runs", "DeviceRuns", "_finish"),
]

STAGED = """
import gc, importlib, inspect, json, runpy, signal, sys, time
clock = time.thread_time_ns
spent = {{}}

def wrap(module, cls, name):
    owner = importlib.import_module(module)
    owner = getattr(owner, cls) if cls else owner
    fn = getattr(owner, name)
    key = (cls or module.rsplit(".", 1)[1]) + "." + name
    acc = spent[key] = [0, 0]
    def staged(*args, **kwargs):
        t = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[0] += clock() - t
            acc[1] += 1
    static = isinstance(inspect.getattr_static(owner, name), staticmethod)
    setattr(owner, name, staticmethod(staged) if static else staged)

for stage in {stages!r}:
    wrap(*stage)

collecting = spent["gc.collect"] = [0, 0]  # the cyclic collector's, whoever triggers it
def collector(phase, info):
    if phase == "start":
        collecting.append(clock())
    elif len(collecting) > 2:
        collecting[0] += clock() - collecting.pop()
        collecting[1] += 1
gc.callbacks.append(collector)

def dump(*_):
    with open({out!r}, "w") as f:
        json.dump(spent, f)

signal.signal(signal.SIGUSR1, dump)
sys.argv[0] = "model_runtime.server"
runpy.run_module("model_runtime.server", run_name="__main__")
"""

#: ``--callgrind``'s daemon: the event loop's lag timer (admission's, due every ``LAG_TICK``
#: seconds of clock time) ticks ``slowdown`` times less often, as often per request as it does
#: outside valgrind, which runs the daemon about that many times slower. Otherwise its ticks
#: grow the count per request by valgrind's slowdown and by the host's load. Likewise the
#: limit under which a device runs a measured one-row run inline on the loop
#: (``actors.device.inline.INLINE_BELOW``) grows by the slowdown, so the runs that go inline
#: outside valgrind go inline inside it.
SLOWED = """
import runpy, sys
try:
    from model_runtime.server.inference import looplag
except ImportError:  # (a tree from before the lag timer)
    pass
else:
    looplag.LoopLag.__init__.__defaults__ = (looplag.LAG_TICK * {slowdown!r},)
from actors.device import inline
inline.INLINE_BELOW *= {slowdown!r}
sys.argv[0] = "model_runtime.server"
runpy.run_module("model_runtime.server", run_name="__main__")
"""
