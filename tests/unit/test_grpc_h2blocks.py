"""Request header blocks read from a connection's bytes (:mod:`model_runtime.server.grpc.h2blocks`):
against nghttp2's own HPACK decoder fed the same blocks in order, every block read is the
block nghttp2 decodes, or none is given from then on (a fallback), never a different one;
however the blocks are framed (CONTINUATIONs, padding, priority, other frames between) and the
bytes cut into reads; a cached block is never read under a dynamic table it was not decoded
under. Then the transport (:class:`~model_runtime.server.grpc.h2proto.H2Protocol`, in process)
as a client sees it: repeated blocks of indexed fields, a table changed between two identical
blocks, a block past the header list limit."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from model_runtime.server.grpc import nghttp2 as ng
from model_runtime.server.grpc.call import OK, START_HEADERS, STREAM_EXTENSION
from model_runtime.server.grpc.framing import frame as grpc_frame
from model_runtime.server.grpc.h2blocks import (
    CACHE_BLOCK,
    CACHE_ENTRIES,
    CACHE_LIST,
    LOST,
    MAX_HEADER_LIST,
    Block,
    HeaderBlocks,
    keeps_table,
)
from model_runtime.server.grpc.h2proto import H2Protocol, ProtocolLimits
from model_runtime.server.grpc.nghttp2 import ffi, lib
from tests.attack.grpc_wire import (
    ACK,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    INFER_PATH,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    frame,
    settings,
)

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(lib is None, reason="no libnghttp2"),
]

CONTINUATION, PING, WINDOW_UPDATE = 9, 6, 8
PADDED, PRIORITY = 0x8, 0x20

Decoded = tuple[bytes, list[tuple[bytes, bytes]], int]


class Reference:
    """nghttp2's HPACK decoder, given every block in order (as the session's is)."""

    def __init__(self) -> None:
        holder = ffi.new("nghttp2_hd_inflater **")
        assert lib.nghttp2_hd_inflate_new(holder) == 0
        self.inflater = holder[0]

    def decode(self, block: bytes) -> Decoded | None:
        """The block's ``:path``, other fields and size; None: nghttp2 cannot decode it."""
        nv, flags = ffi.new("nghttp2_nv *"), ffi.new("int *")
        source, pos = ffi.from_buffer(block), 0
        path, headers, size = b"", [], 0
        while True:
            read = lib.nghttp2_hd_inflate_hd2(
                self.inflater, nv, flags, source + pos, len(block) - pos, 1
            )
            if read < 0:
                return None
            pos += read
            if flags[0] & ng.HD_INFLATE_EMIT:
                name = ffi.buffer(nv.name, nv.namelen)[:]
                value = ffi.buffer(nv.value, nv.valuelen)[:]
                size += len(name) + len(value) + 32
                if name == b":path":
                    path = value
                elif not name.startswith(b":"):
                    headers.append((name, value))
            if flags[0] & ng.HD_INFLATE_FINAL:
                lib.nghttp2_hd_inflate_end_headers(self.inflater)
                return path, headers, size
            assert read or flags[0] & ng.HD_INFLATE_EMIT

    def table(self) -> list[tuple[bytes, bytes]]:
        entries = []
        count = lib.nghttp2_hd_inflate_get_num_table_entries(self.inflater)
        for index in range(62, count + 1):
            nv = lib.nghttp2_hd_inflate_get_table_entry(self.inflater, index)
            entries.append(
                (ffi.buffer(nv.name, nv.namelen)[:], ffi.buffer(nv.value, nv.valuelen)[:])
            )
        return entries


# -- HPACK representations (RFC 7541 §6), written plainly (no Huffman) --


def _int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out, value = [first | limit], value - limit
    while value >= 0x80:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    return bytes([*out, value])


def _string(data: bytes) -> bytes:
    return _int(len(data), 7, 0) + data


def indexed(index: int) -> bytes:
    return _int(index, 7, 0x80)


def literal(kind: int, name: bytes | int, value: bytes) -> bytes:
    """``kind``: 0x40 with incremental indexing, 0x00 without, 0x10 never indexed."""
    bits = 6 if kind == 0x40 else 4
    head = _int(name, bits, kind) if isinstance(name, int) else bytes([kind]) + _string(name)
    return head + _string(value)


NAMES = [b"content-type", b"te", b"grpc-timeout", b"x-id", b"user-agent", b":path",
         b":authority", b"X-Upper", b""]  # fmt: skip
VALUES = st.sampled_from([b"", b"application/grpc", b"trailers", b"1S", b"a" * 130,
                          INFER_PATH, b"\x00\xff"])  # fmt: skip
_names = st.one_of(st.sampled_from(NAMES), st.integers(1, 70))
representation = st.one_of(
    st.integers(0, 72).map(indexed),
    st.builds(literal, st.sampled_from([0x40, 0x00, 0x10]), _names, VALUES),
    st.integers(0, 5000).map(lambda size: _int(size, 5, 0x20)),
    st.binary(max_size=4),  # anything at all
)
block = st.lists(representation, max_size=8).map(b"".join)


Wire = tuple[list[tuple[int, bytes]], list[bytes], list[int], list[int], bool]


@st.composite
def wire(draw: Any) -> Wire:
    """Header blocks (each with its stream; a repeated stream: that stream's trailers), the
    reads that bring them, framed every way a client may frame them, and the streams the
    frames end and reset, and whether they had a GOAWAY."""
    pool = draw(st.lists(block, min_size=1, max_size=5))
    picks = draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=10))
    sent: list[tuple[int, bytes]] = []
    ends: list[int] = []
    resets: list[int] = []
    goaway = False
    stream, data = 1, PREFACE + settings()
    for pick in picks:
        if sent and draw(st.booleans()) and draw(st.booleans()):
            target = sent[-1][0]  # the trailers of the last stream
        else:
            target, stream = stream, stream + 2
        payload = pool[pick]
        sent.append((target, payload))
        cuts = sorted(draw(st.lists(st.integers(0, len(payload)), max_size=3)))
        pieces = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True)]
        flags, head = 0, b""
        if draw(st.booleans()):
            flags |= PRIORITY
            head += struct.pack(">IB", 0, 15)
        pad = draw(st.integers(0, 3))
        if pad:
            flags |= PADDED
        if draw(st.booleans()):
            flags |= END_STREAM
            ends.append(target)
        first = (bytes([pad - 1]) if pad else b"") + head + pieces[0] + b"\0" * max(pad - 1, 0)
        last = len(pieces) == 1
        data += frame(HEADERS, flags | (END_HEADERS if last else 0), target, first)
        for i, piece in enumerate(pieces[1:], 2):
            data += frame(CONTINUATION, END_HEADERS if i == len(pieces) else 0, target, piece)
        for _ in range(draw(st.integers(0, 3))):
            other = draw(st.sampled_from(["ping", "window", "data", "end", "ack", "rst", "away"]))
            if other == "end":
                ends.append(target)
            elif other == "rst":
                resets.append(target)
            elif other == "away":
                goaway = True
            data += {
                "ping": frame(PING, 0, 0, b"12345678"),
                "window": frame(WINDOW_UPDATE, 0, 0, b"\0\0\1\0"),
                "data": frame(DATA, 0, target, b"d" * 300),
                "end": frame(DATA, END_STREAM, target, b"e" * 200),
                "ack": frame(SETTINGS, ACK, 0),
                "rst": frame(RST_STREAM, 0, target, b"\0\0\0\x08"),
                "away": frame(GOAWAY, 0, 0, b"\0" * 8),
            }[other]
    cuts = sorted(set(draw(st.lists(st.integers(1, len(data) - 1), max_size=6))))
    reads = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return sent, reads, ends, resets, goaway


@hsettings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wire())
def test_each_block_read_is_nghttp2s_decode_or_none_is_given(case: Wire) -> None:
    """And the streams ended and reset, and the GOAWAY, are each read once, in order."""
    sent, reads, ends, resets, goaway = case
    blocks = HeaderBlocks()
    got: dict[int, Block] = {}
    got_ends: list[int] = []
    got_resets: list[int] = []
    got_goaway = False
    for data in reads:
        blocks.feed(data)
        for stream_id, block_read in blocks.blocks.items():
            assert stream_id not in got  # (a stream's first block only: the others, trailers)
            got[stream_id] = block_read
        got_ends += blocks.ends
        got_resets += blocks.resets
        got_goaway = got_goaway or blocks.goaway
    assert blocks.broken is None
    assert (got_ends, got_resets, got_goaway) == (ends, resets, goaway)
    reference = Reference()
    expected: dict[int, Decoded | None] = {}
    finished = False
    for stream_id, payload in sent:  # nghttp2's decoder is given every block in order
        decoded = reference.decode(payload)
        expected.setdefault(stream_id, decoded)
        if decoded is None or decoded[2] > MAX_HEADER_LIST:
            finished = True  # nghttp2 ends the connection (or the transport its decoding)
            break
    fine = True
    for stream_id, want in expected.items():
        read = got.get(stream_id)
        if read is None or read is LOST:  # none given: the fallback, only once lost
            assert blocks.lost is not None, (stream_id, want)
            fine = False
            continue
        assert fine, "a block given after one was not"
        assert want is not None, "a block read that nghttp2 cannot decode"
        if want[2] > MAX_HEADER_LIST:
            assert read.size is None
        else:
            assert (read.path, read.headers, read.size) == want
    if not finished:
        assert blocks.lost is None, blocks.lost  # no fallback needed: none taken
    blocks.close()


@hsettings(max_examples=150, deadline=None)
@given(st.lists(block, max_size=3), block)
def test_a_block_said_to_keep_the_table_keeps_it(before: list[bytes], payload: bytes) -> None:
    reference = Reference()
    for earlier in before:
        if reference.decode(earlier) is None:
            return
    table = reference.table()
    if keeps_table(payload):
        reference.decode(payload)
        assert reference.table() == table


def test_the_cache_of_a_connection_stays_small() -> None:
    """Distinct blocks that keep the table, and big ones: each is read, and the connection
    keeps at most CACHE_ENTRIES of them, none past CACHE_BLOCK / CACHE_LIST bytes."""
    blocks = HeaderBlocks()
    data = PREFACE
    for i in range(40):
        value = str(i).encode() * (1 if i % 2 else 500)  # (the odd ones: big)
        data += frame(HEADERS, END_HEADERS, 1 + 2 * i, START + literal(0x00, b"x-id", value))
    blocks.feed(data)
    assert len(blocks.blocks) == 40
    cache = blocks._cache  # (memory a client can make a connection hold)
    assert 0 < len(cache) <= CACHE_ENTRIES
    assert all(len(k) <= CACHE_BLOCK and (v.size or 0) <= CACHE_LIST for k, v in cache.items())
    blocks.close()


def test_blocks_that_insert_or_resize_do_not_keep_the_table() -> None:
    assert keeps_table(indexed(2) + literal(0x00, b"x-id", b"1") + literal(0x10, 4, b"/"))
    assert not keeps_table(indexed(2) + literal(0x40, b"x-id", b"1"))
    assert not keeps_table(_int(0, 5, 0x20) + indexed(2))
    assert not keeps_table(literal(0x00, b"x-id", b"1")[:-1])  # cut short: unsure


# -- the transport, in process --


class _Recording:
    """A fast path that takes every call whole, keeps what it saw of each, and answers it
    (and what the app was handed: the calls of other methods, or not taken whole)."""

    path = INFER_PATH
    max_wait = 16 << 10

    def __init__(self) -> None:
        self.seen: dict[int, tuple[bytes, list[tuple[bytes, bytes]]]] = {}
        #: The app's calls whose request it read to its end.
        self.read_whole: set[int] = set()

    def start(self, conn: Any, stream: Any) -> bool:
        self.seen[stream.id] = (stream.path, list(stream.headers))
        conn.taken(stream)
        stream.ended_call = lambda: None
        stream.answer(START_HEADERS, grpc_frame(b""), OK, now=False)
        return True


class _Wire:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 5555)

    def close(self) -> None:
        self.closed = True

    abort = close


def _frames(out: bytes) -> list[tuple[int, int, int, bytes]]:
    seen = []
    while len(out) >= 9:
        size = int.from_bytes(out[:3], "big")
        stream = int.from_bytes(out[5:9], "big") & 0x7FFFFFFF
        seen.append((out[3], out[4], stream, bytes(out[9 : 9 + size])))
        out = out[9 + size :]
    return seen


GOING_AWAY = b"(the server sends GOAWAY)"


def _serve(reads: list[bytes]) -> tuple[_Recording, list[tuple[int, int, int, bytes]]]:
    fast = _Recording()

    async def run() -> bytes:
        def app(scope: dict[str, Any], receive: Any, _send: Any) -> Coroutine[Any, Any, None]:
            stream = scope["extensions"][STREAM_EXTENSION]
            fast.seen[stream.id] = (scope["raw_path"], list(scope["headers"]))  # (at its start)
            return _read(receive, stream.id)

        async def _read(receive: Any, stream_id: int) -> None:
            while (event := await receive())["type"] == "http.request":
                if not event["more_body"]:
                    fast.read_whole.add(stream_id)
                    return

        limits = ProtocolLimits(app, max_streams=16, idle_timeout=30.0, write_timeout=5.0,
                                max_connections=1, fast=fast)  # fmt: skip
        conn = H2Protocol(limits)
        wire = _Wire()
        conn.connection_made(wire)  # type: ignore[arg-type]
        conn.data_received(PREFACE + settings() + frame(SETTINGS, ACK, 0))
        for data in reads:
            if data == GOING_AWAY:
                conn.goaway()  # (the listener stops: its connections take no new calls)
            else:
                conn.data_received(data)
            await asyncio.sleep(0)
        conn.connection_lost(None)
        return bytes(wire.out)

    return fast, _frames(asyncio.run(run()))


def _call(stream: int, block: bytes) -> bytes:
    return frame(HEADERS, END_HEADERS, stream, block) + frame(DATA, END_STREAM, stream, b"\0" * 5)


START = indexed(3) + indexed(6) + literal(0x00, 1, b"x")  # POST, http, :authority x


def test_calls_with_repeated_blocks_and_a_table_changed_between_two_alike() -> None:
    """Calls whose blocks are indexed fields of the dynamic table, as gRPC clients send them;
    the fourth call changes the table (a new ``x-id`` at the index the second and third read)
    and the fifth and sixth send the second's bytes again: they are read with the new value,
    not the one the same bytes had before."""
    first = START + literal(0x40, b":path", INFER_PATH) + literal(0x40, b"x-id", b"one")
    again = START + indexed(63) + indexed(62)  # :path, x-id (the newest entry is 62)
    change = START + literal(0x40, b":path", INFER_PATH) + literal(0x40, b"x-id", b"two")
    reads = [_call(1, first), _call(3, again), _call(5, again), _call(7, change),
             _call(9, again), _call(11, again)]  # fmt: skip
    fast, seen = _serve(reads)
    one, two = (INFER_PATH, [(b"x-id", b"one")]), (INFER_PATH, [(b"x-id", b"two")])
    assert fast.seen == {1: one, 3: one, 5: one, 7: two, 9: two, 11: two}
    answered = {s for t, f, s, _ in seen if t == HEADERS and f & END_STREAM}
    assert answered == {1, 3, 5, 7, 9, 11}
    assert not any(t in (GOAWAY, RST_STREAM) for t, _, _, _ in seen), seen


def test_a_block_past_the_header_list_limit_resets_its_stream_and_ends_the_connection() -> None:
    """A block whose fields sum past MAX_HEADER_LIST (a big entry indexed again and again):
    its stream is reset, a call after it in the same read is refused (its block is not
    decoded: REFUSED_STREAM, a client may retry it), the call opened before it is answered,
    the connection is told to go away (GOAWAY NO_ERROR)."""
    big = literal(0x40, b"x-big", b"b" * 4000)
    bomb = START + literal(0x40, b":path", INFER_PATH) + big + indexed(62) * 20
    good = START + literal(0x00, b":path", INFER_PATH)
    opened = frame(HEADERS, END_HEADERS, 1, good)
    fast, seen = _serve([opened, frame(HEADERS, END_HEADERS | END_STREAM, 3, bomb)
                         + _call(5, good) + frame(HEADERS, END_HEADERS | END_STREAM, 7, good),
                         frame(DATA, END_STREAM, 1, b"\0" * 5)])  # fmt: skip
    assert (RST_STREAM, 0, 3, struct.pack(">I", ng.INTERNAL_ERROR)) in seen, seen
    for later in (5, 7):
        assert (RST_STREAM, 0, later, struct.pack(">I", ng.REFUSED_STREAM)) in seen, seen
    assert set(fast.seen) == {1}
    assert any(t == HEADERS and f & END_STREAM and s == 1 for t, f, s, _ in seen), seen
    goaway = [p for t, _, _, p in seen if t == GOAWAY]
    assert goaway and struct.unpack(">II", goaway[0][:8])[1] == ng.NO_ERROR, seen


def test_a_request_nghttp2_refuses_is_never_a_call_and_the_next_is() -> None:
    """A request without ``:authority`` (HTTP/2 messaging: nghttp2 resets it) is not handed
    to a call, with its DATA in the same read or the next; the calls after it are."""
    bad = indexed(3) + indexed(6) + literal(0x00, b":path", INFER_PATH)  # no :authority
    good = START + literal(0x00, b":path", INFER_PATH)
    fast, seen = _serve([
        _call(1, bad),
        frame(HEADERS, END_HEADERS, 3, bad), frame(DATA, END_STREAM, 3, b"\0" * 5),
        _call(5, good),
        frame(HEADERS, END_HEADERS | END_STREAM, 7, bad),
    ])  # fmt: skip
    assert set(fast.seen) == {5}
    reset = {s for t, _, s, _ in seen if t == RST_STREAM}
    assert {1, 3, 7} <= reset, seen


def test_trailers_do_not_open_a_call_and_end_the_request() -> None:
    """A request whose trailers (a second HEADERS, END_STREAM) end it: one call, started once
    the trailers came."""
    good = START + literal(0x00, b":path", INFER_PATH)
    trailers = literal(0x00, b"x-trailer", b"1")
    fast, seen = _serve([
        frame(HEADERS, END_HEADERS, 1, good) + frame(DATA, 0, 1, b"\0" * 5),
        frame(HEADERS, END_HEADERS | END_STREAM, 1, trailers),
    ])  # fmt: skip
    assert fast.seen == {1: (INFER_PATH, [])}
    assert any(t == HEADERS and f & END_STREAM and s == 1 for t, f, s, _ in seen), seen


def test_a_stream_past_the_concurrency_limit_is_refused_not_a_call() -> None:
    """Past the 16 streams a connection may have open, a request is refused by nghttp2 (the
    connection is ended: GOAWAY): it is not a call (of ModelInfer, or of another method, whose
    call starts with its headers)."""
    for path in (INFER_PATH, b"/inference.GRPCInferenceService/ModelStreamInfer"):
        good = START + literal(0x00, b":path", path)
        opened = b"".join(frame(HEADERS, END_HEADERS, 1 + 2 * i, good) for i in range(16))
        fast, seen = _serve([opened + frame(HEADERS, END_HEADERS | END_STREAM, 33, good)])
        assert any(t == GOAWAY for t, _, _, _ in seen), seen
        assert 33 not in fast.seen


def test_after_the_server_goes_away_new_streams_are_not_calls() -> None:
    """Once the server sent GOAWAY (a listener that stops), nghttp2 ignores new streams:
    they are not calls (of ModelInfer, or of a method whose call starts with its headers),
    while the one open before is answered."""
    for path in (INFER_PATH, b"/inference.GRPCInferenceService/ModelStreamInfer"):
        good = START + literal(0x00, b":path", path)
        late = frame(HEADERS, END_HEADERS | END_STREAM, 3, good)
        fast, seen = _serve([frame(HEADERS, END_HEADERS, 1, good), GOING_AWAY,
                             late + frame(DATA, END_STREAM, 1, b"\0" * 5)])  # fmt: skip
        assert set(fast.seen) == {1}, path
        assert any(t == GOAWAY for t, _, _, _ in seen), seen


def test_a_request_end_nghttp2_does_not_take_is_not_one() -> None:
    """A request whose last DATA (END_STREAM) is past its stream's window: nghttp2 resets the
    stream (FLOW_CONTROL_ERROR) without taking that frame, and the call never reads its
    request's end."""
    good = START + literal(0x00, b":path", INFER_PATH)
    body = frame(DATA, 0, 1, b"\0" * 16384) * 64  # the stream's whole window (1 MiB)
    fast, seen = _serve([frame(HEADERS, END_HEADERS, 1, good) + body
                         + frame(DATA, END_STREAM, 1, b"\0" * 100)])  # fmt: skip
    assert 1 in fast.seen  # (the app's: past the fast path's wait)
    assert (RST_STREAM, 0, 1, struct.pack(">I", 3)) in seen, seen  # FLOW_CONTROL_ERROR
    assert not fast.read_whole


def test_a_request_whose_end_nghttp2_refuses_is_not_a_call() -> None:
    """A request that ends with fewer bytes than its ``content-length`` said: nghttp2 resets
    the stream (PROTOCOL_ERROR) at its END_STREAM, and the call is not started."""
    block = START + literal(0x00, b":path", INFER_PATH) + literal(0x00, b"content-length", b"9")
    fast, seen = _serve([_call(1, block)])
    assert (RST_STREAM, 0, 1, struct.pack(">I", 1)) in seen, seen
    assert 1 not in fast.seen
