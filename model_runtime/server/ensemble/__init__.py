"""Ensembles (Triton's ``platform: "ensemble"``): a request run as a graph of steps over other
models this daemon serves (:mod:`.schedule`), served by an :class:`.runner.EnsembleRunner` the
repository holds as it holds any runner. Each step is handed to a :class:`.runner.StepCaller`
that the data plane supplies, so it goes through its model's own queue and batcher."""

from model_runtime.server.ensemble.runner import Composing, EnsembleRunner, StepCaller
from model_runtime.server.ensemble.schedule import needed_steps, run_steps

__all__ = ["Composing", "EnsembleRunner", "StepCaller", "needed_steps", "run_steps"]
