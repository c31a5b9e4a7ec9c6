"""The device inventory: which devices this machine offers (seed: the devices Poplar lists).

Where it comes from, first match wins:

1. ``MODEL_RUNTIME_DEVICES``: comma-separated groups ``KIND:COUNTxTHREADS[:exclusive]``
   (``xTHREADS`` may be left out: 1 thread). ``cpu:2x1`` is two cpu devices of one intra-op
   thread each; ``cpu:1x2,cpu:1x1`` is one device of two threads and one of one thread;
   ``cpu:2x1:exclusive`` two cpu devices that are not shared inside the process;
   ``ipu-model:1x1`` is one simulated Mk2 IPU (version 2, 1472 tiles) computing with one thread.
2. The TOML file named by ``MODEL_RUNTIME_CONFIG``, its ``[[devices]]`` tables, e.g.::

       [[devices]]
       kind = "cpu"          # or "ipu-model"
       count = 2             # devices of this shape (default 1)
       threads = 1           # intra-op threads of each (default 1)
       exclusive = false     # cpu: one attachment at a time in this process too (default false)
       # ipu-model only: ipu_version (2), tiles_per_ipu (version default), num_ipus (1)
       # supports_remote_buffers (default: true for cpu, false for ipu-model)

3. The default: one ``cpu`` device per core this process may run on, one thread each. On a
   2-core machine that is two single-threaded devices: two replicas then never fight over a
   core, and one replica cannot oversubscribe the machine. (A single device with every core as
   intra-op threads is faster for one big batch but worse for many small callers.)

Device ids are 0, 1, ... in the order listed; the lock files in the runtime directory use them.

Sharing: a cpu device is shareable inside the process (:attr:`DeviceSpec.shareable`): replicas
of any number of models may attach it at once, each with its own worker thread computing with
the device's intra-op threads, so two cores serve any number of models. It stays exclusive
across processes (one OS lock per device). ``exclusive`` cpu devices and ipu-model devices are
exclusive inside the process too: one attachment at a time.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_runtime.errors import ConfigurationError

__all__ = [
    "CONFIG_ENV",
    "DEVICES_ENV",
    "DeviceSpec",
    "default_inventory",
    "inventory_from_env",
    "inventory_from_toml",
    "ipu_model_spec",
    "load_inventory",
    "parse_devices",
]

DEVICES_ENV = "MODEL_RUNTIME_DEVICES"
CONFIG_ENV = "MODEL_RUNTIME_CONFIG"
KINDS = ("cpu", "ipu-model")

#: Tiles per IPU and memory per tile (bytes) by IPU architecture version.
IPU_TILES = {1: 1216, 2: 1472}
IPU_TILE_MEMORY = {1: 256 * 1024, 2: 624 * 1024}
SMALL_IPU_TILES = 4

_GROUP = re.compile(
    r"^(?P<kind>[a-z-]+):(?P<count>\d+)(?:x(?P<threads>\d+))?(?::(?P<flag>exclusive))?$"
)


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One device of the inventory (or a created ipu-model device, id ``-1``).

    ``threads`` is the onnxruntime intra-op thread count the device computes with.
    ``ipu_version``, ``tiles_per_ipu`` and ``memory_per_tile`` describe an ipu-model (0 for cpu);
    ``num_ipus`` is the device's size in the seed's sense (cpu: 1). ``exclusive`` (cpu only)
    keeps a cpu device to one attachment at a time inside the process (see :attr:`shareable`).
    """

    id: int
    kind: str = "cpu"
    threads: int = 1
    ipu_version: int = 0
    tiles_per_ipu: int = 0
    memory_per_tile: int = 0
    supports_remote_buffers: bool = True
    num_ipus: int = 1
    exclusive: bool = False

    @property
    def shareable(self) -> bool:
        """True when several attachments of this process may hold the device at once: a cpu
        device not configured ``exclusive``. ipu-model devices are never shared."""
        return self.kind == "cpu" and not self.exclusive

    @property
    def memory_bytes(self) -> int:
        """Total memory of an ipu-model device (0 for cpu: unlimited here)."""
        return self.num_ipus * self.tiles_per_ipu * self.memory_per_tile

    def describe(self) -> str:
        if self.kind == "cpu":
            excl = ", exclusive" if self.exclusive else ""
            return f"device {self.id} (cpu, {self.threads} thread{'s' * (self.threads != 1)}{excl})"
        return (
            f"device {self.id} (ipu-model v{self.ipu_version}, {self.num_ipus} x "
            f"{self.tiles_per_ipu} tiles, {self.threads} thread{'s' * (self.threads != 1)})"
        )


def ipu_model_spec(
    device_id: int = -1,
    *,
    num_ipus: int = 1,
    ipu_version: int = 2,
    tiles_per_ipu: int = 0,
    threads: int = 1,
    supports_remote_buffers: bool = False,
) -> DeviceSpec:
    """The spec of a simulated IPU (``tiles_per_ipu=0``: the version's default).

    Raises:
        ConfigurationError: unknown version, or a non-positive size.
    """
    if ipu_version not in IPU_TILES:
        raise ConfigurationError(
            f"ipu-model: unknown IPU version {ipu_version} (known: {sorted(IPU_TILES)})"
        )
    if num_ipus < 1 or tiles_per_ipu < 0 or threads < 1:
        raise ConfigurationError(
            f"ipu-model: num_ipus={num_ipus}, tiles_per_ipu={tiles_per_ipu}, threads={threads} "
            "(need num_ipus >= 1, tiles_per_ipu >= 0, threads >= 1)"
        )
    return DeviceSpec(
        id=device_id,
        kind="ipu-model",
        threads=threads,
        ipu_version=ipu_version,
        tiles_per_ipu=tiles_per_ipu or IPU_TILES[ipu_version],
        memory_per_tile=IPU_TILE_MEMORY[ipu_version],
        supports_remote_buffers=supports_remote_buffers,
        num_ipus=num_ipus,
    )


def _make(
    device_id: int, kind: str, threads: int, extra: Mapping[str, Any], where: str
) -> DeviceSpec:
    if threads < 1:
        raise ConfigurationError(f"{where}: threads must be >= 1, got {threads}")
    exclusive = extra.get("exclusive", kind != "cpu")
    if not isinstance(exclusive, bool):
        raise ConfigurationError(f"{where}: exclusive must be true or false")
    if kind == "cpu":
        if set(extra) - {"supports_remote_buffers", "exclusive"}:
            bad = sorted(set(extra) - {"supports_remote_buffers", "exclusive"})
            raise ConfigurationError(f"{where}: keys {bad} do not apply to a cpu device")
        return DeviceSpec(
            device_id, "cpu", threads,
            supports_remote_buffers=bool(extra.get("supports_remote_buffers", True)),
            exclusive=exclusive,
        )  # fmt: skip
    if kind == "ipu-model":
        if not exclusive:
            raise ConfigurationError(f"{where}: ipu-model devices are always exclusive")
        try:
            return ipu_model_spec(
                device_id,
                num_ipus=int(extra.get("num_ipus", 1)),
                ipu_version=int(extra.get("ipu_version", 2)),
                tiles_per_ipu=int(extra.get("tiles_per_ipu", 0)),
                threads=threads,
                supports_remote_buffers=bool(extra.get("supports_remote_buffers", False)),
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
    raise ConfigurationError(f"{where}: unknown device kind {kind!r} (known: {', '.join(KINDS)})")


def parse_devices(text: str) -> list[DeviceSpec]:
    """Parse a ``MODEL_RUNTIME_DEVICES`` value (see the module docstring).

    Raises:
        ConfigurationError: naming the group that does not parse.
    """
    specs: list[DeviceSpec] = []
    groups = [g.strip() for g in text.split(",")]
    if not any(groups):
        raise ConfigurationError(f"{DEVICES_ENV}={text!r}: no device groups")
    for group in groups:
        m = _GROUP.match(group)
        where = f"{DEVICES_ENV}: group {group!r}"
        if m is None:
            raise ConfigurationError(f"{where} is not KIND:COUNTxTHREADS (e.g. cpu:2x1)")
        count = int(m["count"])
        threads = int(m["threads"] or 1)
        if count < 1:
            raise ConfigurationError(f"{where}: count must be >= 1")
        extra = {"exclusive": True} if m["flag"] else {}
        for _ in range(count):
            specs.append(_make(len(specs), m["kind"], threads, extra, where))
    return specs


def inventory_from_toml(path: str | os.PathLike[str]) -> list[DeviceSpec]:
    """Read the ``[[devices]]`` tables of a TOML config file (``[]`` when it has none).

    Raises:
        ConfigurationError: the file is missing, not TOML, or a table is malformed.
    """
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except OSError as exc:
        raise ConfigurationError(f"{CONFIG_ENV}: cannot read {p}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{CONFIG_ENV}: {p} is not valid TOML: {exc}") from exc
    tables = doc.get("devices")
    if tables is None:  # the file configures other things only
        return []
    if not isinstance(tables, list):
        raise ConfigurationError(f"{p}: 'devices' must be an array of tables ([[devices]])")
    specs: list[DeviceSpec] = []
    for i, table in enumerate(tables):
        where = f"{p}: [[devices]] #{i + 1}"
        if not isinstance(table, dict):
            raise ConfigurationError(f"{where} is not a table")
        extra = dict(table)
        kind = extra.pop("kind", "cpu")
        count = extra.pop("count", 1)
        threads = extra.pop("threads", 1)
        allowed = {"num_ipus", "ipu_version", "tiles_per_ipu", "supports_remote_buffers"}
        allowed.add("exclusive")
        if set(extra) - allowed:
            raise ConfigurationError(f"{where}: unknown keys {sorted(set(extra) - allowed)}")
        if not isinstance(kind, str) or not isinstance(count, int) or count < 1:
            raise ConfigurationError(f"{where}: kind must be a string and count an int >= 1")
        if not isinstance(threads, int):
            raise ConfigurationError(f"{where}: threads must be an int")
        for _ in range(count):
            specs.append(_make(len(specs), kind, threads, extra, where))
    return specs


def default_inventory() -> list[DeviceSpec]:
    """One single-threaded cpu device per core this process may use, shareable inside the
    process (any number of models' replicas; placement spreads them over the devices)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return [DeviceSpec(i, "cpu", 1) for i in range(max(1, cores))]


def inventory_from_env(environ: Mapping[str, str] | None = None) -> list[DeviceSpec] | None:
    """The inventory the environment configures, or ``None`` when it configures none.

    Raises:
        ConfigurationError: a malformed ``MODEL_RUNTIME_DEVICES`` or config file.
    """
    env = os.environ if environ is None else environ
    text = env.get(DEVICES_ENV, "").strip()
    if text:
        return parse_devices(text)
    path = env.get(CONFIG_ENV, "").strip()
    if path:
        return inventory_from_toml(path) or None
    return None


def load_inventory(environ: Mapping[str, str] | None = None) -> Sequence[DeviceSpec]:
    """The inventory: environment, else config file, else :func:`default_inventory`.

    Raises:
        ConfigurationError: a malformed ``MODEL_RUNTIME_DEVICES`` or config file.
    """
    return inventory_from_env(environ) or default_inventory()
