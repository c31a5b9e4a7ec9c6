"""The system's libnghttp2 (HTTP/2 framing, HPACK, flow control, flood limits), through cffi.

ABI mode, out of line: the declarations (the part of ``nghttp2/nghttp2.h`` 1.52 the gRPC
transport, :mod:`.h2proto`, calls) are in :mod:`.nghttp2_build`, which generates the committed
:mod:`._nghttp2_ffi` from them, so no start parses C. The library is opened at import
(Debian's ``libnghttp2-14``, which carries the rapid-reset and CONTINUATION-flood fixes). No
compiler step: only the shared library must be installed; where it is not, :data:`MISSING`
says why.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import _cffi_backend  # type: ignore[import-untyped,import-not-found]

from model_runtime.server.grpc import _nghttp2_ffi

__all__ = ["DATA_FLAG_EOF", "DATA_FLAG_NO_END_STREAM", "ERR_DEFERRED", "MISSING", "ffi", "lib"]

#: the out-of-line ffi's attributes (``new``, ``callback``, ``NULL``...), plus ``_backend`` as
#: an in-line ``cffi.FFI`` has it (the module whose ``unpack``/``memmove`` its callers take)
ffi: Any = SimpleNamespace(
    **{name: getattr(_nghttp2_ffi.ffi, name) for name in dir(_nghttp2_ffi.ffi) if name[0] != "_"},
    _backend=_cffi_backend,
)

#: why the library cannot be used (None: it can); the daemon then serves gRPC on h2corn
MISSING: str | None = None
try:
    lib: Any = ffi.dlopen("libnghttp2.so.14")
except OSError as exc:  # a system without Debian's libnghttp2-14 (or its equivalent)
    lib = None
    MISSING = f"libnghttp2.so.14 cannot be loaded ({exc}); install libnghttp2-14"

# Frame types, flags, settings and errors (nghttp2.h's enums).
DATA, HEADERS, RST_STREAM, PUSH_PROMISE, GOAWAY, CONTINUATION = 0x0, 0x1, 0x3, 0x5, 0x7, 0x9
FLAG_END_HEADERS, FLAG_PADDED, FLAG_PRIORITY = 0x4, 0x8, 0x20
FLAG_END_STREAM = 0x1
DATA_FLAG_EOF = 0x1
DATA_FLAG_NO_END_STREAM = 0x2
ERR_DEFERRED = -508
ERR_TEMPORAL_CALLBACK_FAILURE = -521
ERR_CALLBACK_FAILURE = -902
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
REFUSED_STREAM = 0x7
CANCEL = 0x8
ENHANCE_YOUR_CALM = 0xB
HD_INFLATE_FINAL, HD_INFLATE_EMIT = 0x1, 0x2
NV_FLAG_NO_COPY = 0x2 | 0x4  # the name and value outlive the submission (kept by the caller)
