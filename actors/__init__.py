"""The actors: the actor core, the device, queue, session and watchdog actors, supervision."""

from model_runtime.logs import quiet_by_default

quiet_by_default()
