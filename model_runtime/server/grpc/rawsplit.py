"""A big ``ModelInferRequest`` decoded without copying its tensors.

Protobuf copies every ``bytes`` field it parses (a 60 MB input costs a 60 MB copy under the GIL,
and another at each access of ``raw_input_contents``). :func:`split_raw_inputs` walks the
message's top-level fields on the wire instead: the ``raw_input_contents`` entries (field 7)
become views of the received buffer, in their order, and everything else (names, shapes,
parameters: small) is parsed by protobuf as usual. Protobuf's rules for the rest hold (fields
in any order, repeated fields appended); a message that does not walk cleanly is left to
protobuf, whose error it then gets.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RAW_INPUT_CONTENTS", "split_raw_inputs"]

#: ``ModelInferRequest.raw_input_contents``: field 7, length-delimited (key 7 << 3 | 2).
RAW_INPUT_CONTENTS = 7
_RAW_KEY = RAW_INPUT_CONTENTS << 3 | 2


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    """The varint at ``at`` and the offset after it.

    Raises:
        IndexError: the data ends inside it.
        ValueError: longer than 10 bytes.
    """
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift >= 70:
            raise ValueError("varint too long")


def split_raw_inputs(
    message: Any, data: bytes | bytearray | memoryview
) -> tuple[Any, list[memoryview]] | None:
    """``data`` (a serialized ``ModelInferRequest``, bytes-like) as ``message`` (an empty one,
    merged into) without its raw input contents, and those contents as views of ``data`` in
    their order; None when ``data`` does not walk as a protobuf message (parse it whole)."""
    view = memoryview(data)
    raws: list[memoryview] = []
    rest: list[memoryview] = []
    at, end = 0, len(view)
    try:
        while at < end:
            start = at
            key, at = _varint(view, at)
            kind = key & 7
            if kind == 0:
                _, at = _varint(view, at)
            elif kind == 1:
                at += 8
            elif kind == 5:
                at += 4
            elif kind == 2:
                length, at = _varint(view, at)
                if key == _RAW_KEY:
                    if at + length > end:
                        return None
                    raws.append(view[at : at + length])
                    at += length
                    continue
                at += length
            else:
                return None  # groups (deprecated) and unknown wire types: protobuf decides
            if at > end:
                return None
            rest.append(view[start:at])
    except (IndexError, ValueError):
        return None
    message.ParseFromString(b"".join(rest))
    return message, raws
