"""Inference request JSON through simdjson: numeric tensor data straight into arrays.

Parsed by orjson, every number of a ``"data"`` array becomes a Python object that numpy then
reads back one at a time, and that is freed after: for a 784-float request, about 290 µs of the
daemon's ~820 µs per request on the 2-core machine. simdjson parses the document into its tape
and copies a numeric array out of it as one buffer of doubles (or 64-bit integers), nested rows
flattened in row-major order, as the protocol reads them; an array that holds anything else
(true/false, a string, null) is refused by that copy and read as a list instead.

:func:`load` gives the document as Python objects, each such ``"data"`` as :class:`Numbers`; or
None where simdjson does not parse it, or might read it otherwise than orjson (a key given
twice, whose last value orjson keeps; a key with a NUL; a byte order mark, which simdjson skips
and orjson refuses), or slowly (an object with many keys): the caller then decodes it with
orjson, which accepts or refuses it as always. :meth:`Numbers.array` raises
:class:`~model_runtime.server.tensors.jsonnumbers.Retry` wherever the plain decoder's checks must
decide (a count that does not fit the shape, an integer out of range), so this path accepts exactly
what the plain one does (any nesting, read in row-major order as Triton reads it), and gives
the same arrays: it is only faster. Bodies past :data:`MAX_TAPE_BYTES` take the plain path, whose
memory is bounded slice by slice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import simdjson

from model_runtime.server.answers import MAX_JSON_DEPTH, json_too_deep
from model_runtime.server.tensors.datatypes import DATATYPES
from model_runtime.server.tensors.jsonnumbers import Retry

__all__ = ["MAX_TAPE_BYTES", "Numbers", "load", "numbers"]

#: The largest JSON read here (the tape takes about 8 bytes per number, the copy 8 more).
MAX_TAPE_BYTES = 1 << 20

# The buffer each numeric datatype is read into: doubles for floats (what orjson's floats are),
# 64-bit integers (signed or not) for integers, then checked against the datatype's range.
_OF_KIND: dict[str, tuple[Literal["d", "i", "u"], np.dtype[Any]]] = {
    "f": ("d", np.dtype(np.float64)),
    "i": ("i", np.dtype(np.int64)),
    "u": ("u", np.dtype(np.uint64)),
}
_BUFFER = {name: _OF_KIND[t.kind] for name, t in DATATYPES.items() if t.kind in _OF_KIND}
#: Integers up to this are doubles exactly.
_EXACT = float(2**53)
_EXACT_SQUARED = _EXACT * _EXACT
_MIN, _MAX = np.minimum.reduce, np.maximum.reduce  # values.min(), .max() without their wrappers
_BOM = b"\xef\xbb\xbf"
#: An object of the protocol has a handful of keys; one with more goes the plain way (each
#: key is looked up by a walk over them all: many keys would cost their square).
_MAX_KEYS = 16
_NOT_PARSED = (ValueError, TypeError, RuntimeError, UnicodeDecodeError, KeyError)


class Numbers:
    """A ``"data"`` array read as one flat buffer (float64, int64 or uint64)."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def array(self, datatype: str, count: int) -> np.ndarray:
        """The values as ``count`` elements of ``datatype`` (the one they were read for).

        Raises:
            Retry: not ``count`` values, or one out of the datatype's range: the plain decoder
                says what is wrong; or, for FP32 and FP16, one past 2**53: a JSON integer that
                large rounds to a double here first, and the plain decoder may round it to the
                datatype straight (when all the data are integers), to another neighbour.
        """
        values = self.values
        if values.size != count:
            raise Retry
        dtype = DATATYPES[datatype]
        if values.size and dtype.itemsize < 8:
            if dtype.kind == "f":
                # One past 2**53 makes the sum of squares past 2**106 (a sum past it without
                # one is only read the plain way: the same arrays, slower); one pass, not two.
                if float(np.dot(values, values)) > _EXACT_SQUARED:
                    raise Retry
            else:
                info = np.iinfo(dtype)
                if _MIN(values) < info.min or _MAX(values) > info.max:
                    raise Retry
        return values.astype(dtype, copy=False)


def load(text: bytes | bytearray) -> dict[str, Any] | None:
    """The JSON object ``text`` as Python objects, numeric input data as :class:`Numbers`;
    None where the plain decoder must read it (see the module docstring).

    Raises:
        ProtocolError: a numeric ``data`` array nests past Triton's depth (100), which the
            plain decoder refuses too.
    """
    if len(text) > MAX_TAPE_BYTES or text.startswith(_BOM):  # orjson refuses a BOM
        return None
    # Nesting as deep as Triton's limit takes that many brackets: with fewer, no look.
    top = _deep_top if text.count(b"[") >= MAX_JSON_DEPTH else _top
    try:
        doc = simdjson.Parser().parse(text)  # a parser per document: its proxies pin it
        if not isinstance(doc, simdjson.Object):
            return None
        return _object(doc, top)
    except _NOT_PARSED:
        return None


def numbers(text: bytes | bytearray | memoryview, datatype: str) -> Numbers | None:
    """The JSON array ``text`` of numbers as :func:`load` reads a ``"data"`` array of input
    ``datatype``; None: not such an array (the plain decoder reads it)."""
    buffer = _BUFFER.get(datatype)
    if buffer is None:
        return None
    of_type, dtype = buffer
    parser = _parsers.__dict__.get("parser")
    if parser is None:
        parser = _parsers.parser = simdjson.Parser()
    try:
        # The array is copied out before this returns: no proxy of it outlives the parse, so
        # the thread's parser is used again (a parser per array costs its allocation).
        value = parser.parse(bytes(text))
        if not isinstance(value, simdjson.Array):
            return None
        return Numbers(np.frombuffer(value.as_buffer(of_type=of_type), dtype))
    except _NOT_PARSED:
        return None
    finally:
        value = None


#: Each thread's parser for :func:`numbers` (pysimdjson's parser is not thread-safe).
_parsers = threading.local()


class _Misread(ValueError):
    """An object simdjson's lookup would misread: a key given twice (it finds the first value,
    orjson keeps the last), or holding a NUL (it looks up what comes before it); or would
    read slowly (too many keys)."""


def _object(obj: simdjson.Object, field: Callable[[str, Any], Any]) -> dict[str, Any]:
    if len(obj) > _MAX_KEYS:  # simdjson finds a key by a walk over the object's keys
        raise _Misread("too many keys")
    out: dict[str, Any] = {}
    for key in obj:  # every key, a repeated one again
        if key in out or "\x00" in key:
            raise _Misread(key)
        out[key] = field(key, obj[key])
    return out


def _top(key: str, value: Any, *, deep: bool = False) -> Any:
    if key == "inputs" and isinstance(value, simdjson.Array):
        return [_input(v, deep) if isinstance(v, simdjson.Object) else _plain(v) for v in value]
    return _plain(value)


def _deep_top(key: str, value: Any) -> Any:
    return _top(key, value, deep=True)


def _input(item: simdjson.Object, deep: bool) -> dict[str, Any]:
    datatype = item.get("datatype")
    buffer = _BUFFER.get(datatype) if isinstance(datatype, str) else None

    def field(key: str, value: Any) -> Any:
        if key == "data" and buffer is not None and isinstance(value, simdjson.Array):
            of_type, dtype = buffer
            try:
                flat = np.frombuffer(value.as_buffer(of_type=of_type), dtype)
            except (TypeError, ValueError):  # true/false, strings, null, out of 64 bits
                return _plain(value)
            if deep and _depth(value.mini) >= MAX_JSON_DEPTH:
                raise json_too_deep()
            return Numbers(flat)
        return _plain(value)

    return _object(item, field)


def _depth(text: bytes | str) -> int:
    """How many arrays nest in a numeric array's text, itself included: its values lie at
    Triton's depths 1 to this (no strings in it, so every bracket counts)."""
    if isinstance(text, str):  # pysimdjson's stubs say str; it gives bytes
        text = text.encode()
    chars = np.frombuffer(text, np.uint8)
    steps = (chars == ord("[")).astype(np.int32) - (chars == ord("]"))
    return int(np.cumsum(steps).max(initial=0))


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value
