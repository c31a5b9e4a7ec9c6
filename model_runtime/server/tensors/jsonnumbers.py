"""JSON tensor data to numpy: checked conversion, and big arrays without lists of Python objects.

Parsed the plain way, a JSON tensor becomes a list of Python numbers first: 32 bytes per float
(a pointer and a float object) whatever the JSON spelled, 8x the text of ``0.5,``. So before
the document is parsed, :func:`cut_number_arrays` cuts the text of every big ``"data"`` array
(numbers, true/false and brackets only: flat or nested) out of it and leaves a placeholder
string; the rest, small, is parsed as usual, and :func:`parse_number_span` converts each cut
text in slices of about :data:`CHUNK_BYTES` (split between elements, nested rows kept whole)
straight into the tensor's array. Peak memory is the body, the tensor and one slice's lists;
and a decoder running off the event loop hands the GIL back between slices.

Every slice is parsed by orjson, so only JSON is accepted. What is left outside the cut arrays
is bounded (:data:`MAX_SKELETON_BYTES`, or past it :data:`MAX_SKELETON_VALUES`), since parsing
it costs Python objects.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

import numpy as np
import orjson

from model_runtime.errors import ProtocolError
from model_runtime.server.answers import MAX_JSON_DEPTH, json_too_deep
from model_runtime.server.tensors.datatypes import DATATYPES
from model_runtime.server.tensors.jsoncost import values_at_most

__all__ = [
    "CHUNK_BYTES",
    "MAX_SKELETON_BYTES",
    "MAX_SKELETON_VALUES",
    "MIN_CUT_BYTES",
    "NO_CUTS",
    "Cuts",
    "Retry",
    "cut_number_arrays",
    "flatten",
    "parse_number_span",
    "values_to_array",
]

#: Text converted per slice (~1 ms of parsing, the longest the GIL is held at once); orjson
#: holds about 16x its input while it parses, so slices stay small.
CHUNK_BYTES = 256 << 10
#: Arrays with less text than this are parsed as lists (their lists are small).
MIN_CUT_BYTES = 16 << 10
#: The JSON left once the big arrays are cut out (names, shapes, small arrays, strings) is at
#: most this many bytes, or holds at most :data:`MAX_SKELETON_VALUES` values (each a Python
#: object once parsed: a big string or blanks cost their bytes, a list of small values 20x).
MAX_SKELETON_BYTES = 4 << 20
MAX_SKELETON_VALUES = 1 << 20

# A "data" key with an array value, then the run of characters such an array of numbers or
# true/false may hold. The array ends at the last ']' of the run: in a valid document only ','
# and blanks follow it before the run ends (at the '"' of the next key, or at '}').
_DATA_KEY = re.compile(rb'"data"\s*:\s*\[')
_RUN = re.compile(rb"[0-9eE.+\-,\s\[\]truefals]*")
_TAIL = re.compile(rb"[,\s]*")
#: Bytes scanned per call while looking for an array's end: the GIL is let go between calls.
_SCAN_BYTES = 4 << 20
_ROW_END = re.compile(rb"\]\s*,")
_PLACEHOLDER = "\x00model-runtime:"


class Retry(Exception):  # a signal between decoder passes, not an error
    """Decode the document again with exact integers (stdlib json); never leaves the codec."""


def _fail(message: str) -> ProtocolError:
    return ProtocolError(message)


class Cuts:
    """The arrays :func:`cut_number_arrays` cut out of one document: each one's ``(start,
    end)`` in the body, and the mark its placeholder carries, random per document, so that
    no string a client sends can pass for one (it stays a string: 'data' must be a list)."""

    __slots__ = ("_prefix", "spans")

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []
        self._prefix = f"{_PLACEHOLDER}{secrets.token_hex(8)}:"

    def placeholder(self) -> bytes:
        """The JSON string that stands for the next span (appended by the caller)."""
        return b'"\\u0000%s%d"' % (self._prefix[1:].encode(), len(self.spans))

    def index(self, value: Any) -> int | None:
        """The span ``value`` stands for; None if it is no placeholder of these cuts."""
        if self.spans and isinstance(value, str) and value.startswith(self._prefix):
            return int(value[len(self._prefix) :])
        return None


#: No arrays cut (a document decoded whole).
NO_CUTS = Cuts()


def cut_number_arrays(
    buf: bytes | bytearray, start: int, end: int
) -> tuple[bytes | memoryview, Cuts]:
    """The JSON document ``buf[start:end]`` with each big ``"data"`` array replaced by a
    placeholder string, and the :class:`Cuts` (where each cut array's text lies inside ``buf``,
    without its outer brackets). Nothing to cut: the document itself (a view, no copy).

    Raises:
        ProtocolError: what is left is over :data:`MAX_SKELETON_BYTES` and holds more than
            :data:`MAX_SKELETON_VALUES` values.
    """
    cuts = Cuts()
    spans = cuts.spans
    pieces: list[bytes | memoryview] = []
    view = memoryview(buf)
    if end - start < MIN_CUT_BYTES:  # no array in it can be big enough: skip the scan
        return view[start:end], cuts
    pos = search = start
    # A match can start at an escaped quote only in a key that ends in '\"data' (inside a
    # string every quote is escaped, and after a real closing quote comes no 'd'): a key the
    # protocol does not have, refused whether or not its value was cut.
    while (m := _DATA_KEY.search(buf, search, end)) is not None:
        search = m.end()
        if end - search < MIN_CUT_BYTES:
            break
        lo, hi = m.end(), _array_end(buf, m.end(), end)
        if hi < 0 or hi - lo < MIN_CUT_BYTES:
            continue
        pieces += [view[pos : m.start()], b'"data":' + cuts.placeholder()]
        spans.append((lo, hi))
        pos = search = hi + 1
    if not spans:
        _bound_skeleton(buf, start, end)
        return view[start:end], cuts
    pieces.append(view[pos:end])
    skeleton = b"".join(pieces)
    _bound_skeleton(skeleton, 0, len(skeleton))
    return skeleton, cuts


def _bound_skeleton(text: bytes | bytearray, start: int, end: int) -> None:
    if end - start > MAX_SKELETON_BYTES and not values_at_most(
        text, start, end, MAX_SKELETON_VALUES
    ):
        raise _fail(
            f"the request's JSON outside big 'data' arrays is {end - start} bytes and holds "
            f"more than {MAX_SKELETON_VALUES} values (at most {MAX_SKELETON_BYTES} bytes, or "
            f"{MAX_SKELETON_VALUES} values); send tensors as 'data' arrays or as binary data"
        )


def _array_end(buf: bytes | bytearray, lo: int, end: int) -> int:
    """The index of the ']' that closes the array whose text starts at ``lo``, if that text
    holds only numbers, true/false, commas, blanks and balanced brackets; else -1."""
    stop = lo
    while True:  # the run, a window at a time
        window = min(stop + _SCAN_BYTES, end)
        run = _RUN.match(buf, stop, window)
        stop = run.end() if run is not None else stop
        if stop < window or window >= end:
            break
    hi = buf.rfind(b"]", lo, stop)
    tail = _TAIL.match(buf, hi + 1, stop)
    if hi < 0 or tail is None or tail.end() != stop:
        return -1
    depth = 0
    for w in range(lo, hi, _SCAN_BYTES):
        w_end = min(w + _SCAN_BYTES, hi)
        depth += buf.count(b"[", w, w_end) - buf.count(b"]", w, w_end)
    return hi if depth == 0 else -1


def parse_number_span(
    name: str,
    datatype: str,
    buf: bytes | bytearray,
    span: tuple[int, int],
    shape: tuple[int, ...],
    count: int,
) -> np.ndarray:
    """Convert a cut array's text into a 1-D array of ``count`` elements of ``datatype``, one
    slice at a time; nested arrays are flattened in row-major order, as the protocol says.

    Raises:
        ProtocolError: the text is not JSON, the array does not hold ``count`` elements, or a
            value is not of the datatype or out of its range.
    """
    lo, hi = span
    # The text has room for at most (len + 1) // 2 elements ("1,1,1"): a shape that claims more
    # allocates no more than that, and is refused once the elements are counted.
    room = min(count, (hi - lo + 1) // 2)
    out = np.empty(room, DATATYPES[datatype])
    nested = buf.find(b"[", lo, hi) >= 0
    view = memoryview(buf)
    filled, pos, first = 0, lo, True
    while True:
        stop = _next_stop(buf, pos, hi, nested)
        text = b"".join((b"[", view[pos:stop], b"]"))
        try:
            values = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise _fail(f"the request is not valid JSON: input {name!r} 'data': {exc}") from None
        if not values and not (first and stop >= hi):  # "1,,2", "1,2,", ",1"
            raise _fail(f"the request is not valid JSON: input {name!r} 'data' has an empty slot")
        arr = _slice_to_array(name, datatype, values, text, nested)
        if filled + arr.size > room:
            raise _fail(f"input {name!r}: 'data' has more than the {count} elements")
        out[filled : filled + arr.size] = arr
        filled += arr.size
        if stop >= hi:
            break
        pos, first = stop + 1, False
    if filled != count:
        raise _fail(
            f"input {name!r}: shape {list(shape)} needs {count} elements, 'data' has {filled}"
        )
    return out


def _next_stop(buf: bytes | bytearray, pos: int, hi: int, nested: bool) -> int:
    """Where the slice starting at ``pos`` ends: a comma between elements (between whole rows
    when nested) about CHUNK_BYTES on, or ``hi``."""
    target = pos + CHUNK_BYTES
    if target >= hi:
        return hi
    if not nested:
        comma = buf.find(b",", target, hi)
        return hi if comma < 0 else comma
    depth = buf.count(b"[", pos, target) - buf.count(b"]", pos, target)
    last = target
    for m in _ROW_END.finditer(buf, target, hi):
        comma = m.end() - 1
        depth += buf.count(b"[", last, comma) - buf.count(b"]", last, comma)
        last = comma
        if depth == 0:
            return comma
    return hi


def _slice_to_array(
    name: str, datatype: str, values: list[Any], text: bytes, nested: bool
) -> np.ndarray:
    if nested:
        try:  # rectangular rows: numpy flattens them at C speed (and has under 100 dims)
            rows = np.array(values)
        except ValueError:  # ragged
            rows = None
        if rows is not None and rows.dtype.kind in "biuf":
            values = rows.ravel().tolist()  # a slice's worth of objects, made in C
        else:
            values = flatten(name, values, len(text))  # ragged: its depth is checked there
    bools = b"t" in text or b"f" in text  # true/false: the only letters besides e/E
    try:
        return values_to_array(name, datatype, values, exact=False, bools=bools)
    except Retry:  # integers past 64 bits: orjson made floats of them; this slice exactly
        exact = flatten(name, json.loads(text), len(text))
        return values_to_array(name, datatype, exact, exact=True, bools=bools)


def flatten(name: str, data: Any, limit: int) -> list[Any]:
    """``data`` (a list, maybe nested) flattened in row-major order; at most ``limit`` items.

    Raises:
        ProtocolError: ``data`` is not a list, or holds more than ``limit`` items.
    """
    if not isinstance(data, list):
        raise _fail(f"input {name!r}: 'data' must be a list")
    if not data or (not isinstance(data[0], list) and list not in map(type, data)):
        return data  # flat (a look at each element's type, in C)
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) + 1 >= MAX_JSON_DEPTH:  # Triton counts 'data' itself as depth 0
                    raise json_too_deep()
                stack.append(iter(item))
                break
            out.append(item)
            if len(out) > limit:
                raise _fail(f"input {name!r}: 'data' has more than the {limit} elements")
        else:
            stack.pop()
    return out


def values_to_array(
    name: str, datatype: str, data: list[Any], *, exact: bool, bools: bool | None = None
) -> np.ndarray:
    """A flat list of JSON values as an array of ``datatype``, checked, never wrapped.

    ``exact``: the values came from a parser that keeps every integer exact (the standard
    library's). orjson turns integers past 64 bits into floats, so without ``exact`` a float
    in integer data asks for the exact pass (:class:`Retry`) before anything is refused.
    ``bools``: whether ``data`` holds true/false (None: look), which numpy would silently
    take as 1 and 0 in a numeric array.

    Raises:
        ProtocolError: a value is not of the datatype's kind or out of its range.
        Retry: see ``exact``.
    """
    dtype = DATATYPES[datatype]
    if not data:
        return np.empty(0, dtype)
    try:
        arr = np.array(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise _fail(f"input {name!r}: 'data' is not a list of {datatype} values: {exc}") from None
    kind = arr.dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise _fail(f"input {name!r}: BOOL data must be true/false")
        return arr
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if kind in "iu":
            low, high = int(arr.min()), int(arr.max())
        elif kind in "Of" and all(type(v) is int for v in data):
            # Integers that do not all fit one of int64/uint64 ([1, 2**63], [-1, 2**63],
            # 2**64) come out of numpy as float64 or object: check them as Python ints.
            low, high = min(data), max(data)
            arr = np.array(data, dtype=dtype) if info.min <= low and high <= info.max else arr
        elif not exact:
            raise Retry
        else:
            raise _fail(f"input {name!r}: {datatype} data must be integers")
        # Checked before the cast: astype would wrap (-1 as UINT8 is 255) without a word.
        if low < info.min:
            raise _fail(_out_of_range(name, datatype, low, info))
        if high > info.max:
            raise _fail(_out_of_range(name, datatype, high, info))
    elif kind not in "iuf":
        raise _fail(f"input {name!r}: {datatype} data must be numbers")
    if bools is None:
        bools = bool in map(type, data)  # the loop runs in C
    if bools:
        kinds = "integers" if dtype.kind in "iu" else "numbers"
        raise _fail(f"input {name!r}: {datatype} data must be {kinds}, not true/false")
    return arr.astype(dtype, copy=False)


def _out_of_range(name: str, datatype: str, value: int, info: np.iinfo[Any]) -> str:
    return f"input {name!r}: value {value} is out of the {datatype} range [{info.min}, {info.max}]"
