"""One model's settings in Triton's terms, as the runner and the daemon read them.

:class:`ModelSettings` is what :mod:`.config` makes of a ``config.pbtxt``, a TOML or a load's
override: each field None where the server-wide default applies, the parsed ``ModelConfig``
beside them, and the rules that read them per request (a request's deadline, its priority)
and per load (the runner's config). :class:`VersionPolicy` says which versions are served.
Frozen values: nothing here reads a file or raises but :meth:`ModelSettings.runner_config`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field as _field, replace
from pathlib import Path

from model_runtime.queue_policy import QueuePolicy
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.sequences import SequenceConfig
from model_runtime.server.tensors.parameters import execute_priority
from model_runtime.server.triton import model_config_pb2 as pb
from model_runtime.server.triton.ensemble import EnsembleConfig
from model_runtime.server.triton.ragged import RaggedSpec

__all__ = ["DEFAULT_SETTINGS", "ModelSettings", "VersionPolicy"]


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """Which versions are served: the ``latest`` N, ``all``, or ``specific`` ones."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: Iterable[int]) -> list[int]:
        """The versions to serve among ``available``, highest first."""
        found = sorted(set(available), reverse=True)
        if self.kind == "all":
            return found
        if self.kind == "specific":
            return [v for v in found if v in self.versions]
        return found[: self.num_versions]


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """One model's settings, each None where the server-wide default applies.

    ``batch_size``: the batch the executable is built for; ``max_batch_size``: the largest
    request (Triton's), reported in the config; ``timeout``: batch timeout (seconds);
    ``request_timeout``: a request's default deadline (seconds); ``config``: the parsed file
    (an empty ``ModelConfig`` when the model has none); ``source``: that file; ``origin``:
    where the settings came from when not from a file (a load's ``config`` override).
    ``batch_size`` None: the model decides (see :func:`~.layout.model_batch`); 0: no batch
    axis.
    """

    config: pb.ModelConfig
    source: Path | None = None
    origin: str | None = None
    batch_size: int | None = None
    max_batch_size: int | None = None
    replicas: int | None = None
    timeout: float | None = None
    max_queue_size: int | None = None
    request_timeout: float | None = None
    priority_levels: int | None = None
    default_priority_level: int | None = None
    #: ``default_queue_policy`` / ``priority_queue_policy`` (None: none given)
    queue_policy: QueuePolicy | None = None
    version_policy: VersionPolicy = VersionPolicy()
    #: ``dynamic_batching.preferred_batch_size``, sorted (each a batch the executable runs).
    preferred_batch_sizes: tuple[int, ...] = ()
    #: The settings are a Triton model directory's: Triton's rules complete the config.
    triton: bool = False
    #: Each output's class labels (its ``label_filename``, read at load by :mod:`.layout`).
    labels: Mapping[str, tuple[str, ...]] = _field(default_factory=dict)
    #: ``sequence_batching``: a stateful model (:mod:`.sequence`); its slots are counted for
    #: one instance here, and for the instances it runs when it loads.
    sequence: SequenceConfig | None = None
    #: ``backend: "python"``: a ``model.py`` run in instance processes
    #: (:mod:`model_runtime.python_backend`), not an executable.
    python: bool = False
    #: ``model_transaction_policy { decoupled: true }``: any number of responses per request.
    decoupled: bool = False
    #: ``platform: "ensemble"``: its steps (:mod:`.ensemble`); it runs other models, no file.
    ensemble: EnsembleConfig | None = None
    #: The compile's optimisation level (``optimization.graph.level``; None: the default).
    optimization_level: str | None = None
    #: Fields accepted that change nothing here, each with the reason (logged at load).
    notes: tuple[str, ...] = ()
    #: Ragged batching (``allow_ragged_batch``, ``batch_input``): the executable runs the
    #: model's own shapes and :mod:`.ragged` forms the batches (None: none).
    ragged: RaggedSpec | None = None

    def deadline(
        self, server: float | None, requested: float | None, priority: int = 0
    ) -> tuple[float | None, float | None, bool]:
        """A request's ``(timeout, queue_timeout, delay)`` at ``priority`` (an ``execute``
        priority): the seconds it may take in all (the server's ``server`` limit, None: none),
        the seconds it may wait in the queue, and whether past those it waits on (DELAY) rather
        than fails. Without a queue policy: no queue timeout, and the request's own timeout,
        else the model's default, bounds it all (within the server's); with one, its level's
        timeout (Triton's rule: :meth:`~model_runtime.queue_policy.LevelPolicy.timeout`) bounds
        its wait only, as Triton's does."""
        if self.queue_policy is not None:
            level = self.queue_policy.of(priority)
            return server, level.timeout(requested), level.delay
        timeout = requested if requested is not None else self.request_timeout
        if timeout is None:
            return server, None, False
        return (timeout if server is None else min(server, timeout)), None, False

    def priority(self, level: int, levels: int | None, default_level: int | None) -> int:
        """A request's protocol ``priority`` as ``execute(priority=...)``: the model's priority
        levels, else the server's (``levels`` / ``default_level``).

        Raises:
            nothing: a level past the levels is the default one (Triton's rule).
        """
        if self.priority_levels is not None:
            levels, default_level = self.priority_levels, self.default_priority_level
        return execute_priority(level, levels=levels, default_level=default_level)

    def runner_config(self, base: ModelRunnerConfig) -> ModelRunnerConfig:
        """``base`` (the server-wide runner settings) with this model's settings over it.

        Raises:
            ConfigurationError: the combination is invalid.
        """
        config = base
        if self.replicas is not None:
            config = replace(config, replication_factor=self.replicas)
        if self.timeout is not None:
            config = replace(config, timeout=self.timeout)
        if self.max_queue_size is not None:
            # Triton's queue policy bounds the queue instead of the latency budget.
            config = replace(config, max_queue_size=self.max_queue_size, latency_budget=None)
        if self.queue_policy is not None:
            config = replace(config, queue_policy=self.queue_policy)
            if self.queue_policy.bounded:  # bounds per level, instead of the latency budget
                config = replace(config, latency_budget=None)
        if self.sequence is not None:
            # A stateful model's steps are never refused for time (its sequence slots bound
            # its work; a step refused mid-sequence would break the client's session), as the
            # front end's admission exempts them.
            config = replace(config, latency_budget=None)
        config.validate()
        return config


#: The settings of a model without its own (every server-wide default applies).
DEFAULT_SETTINGS = ModelSettings(pb.ModelConfig())
