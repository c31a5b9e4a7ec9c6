"""A gRPC call that fails while a request is decoded in a worker thread frees the request's
bytes when it is answered, not when the cyclic garbage collector next runs (the thread's
future and the traceback through it form a cycle; a 60 MB message kept in one per failed call
grew the daemon by gigabytes)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any, NoReturn

import anyio
import grpc
import numpy as np
import pytest

from model_runtime.errors import ProtocolError
from model_runtime.server.grpc.framing import GrpcAbort
from model_runtime.server.grpc.service import InferenceServicer, _answers
from model_runtime.server.tensors.shm_io import decode_in_thread

pytestmark = pytest.mark.timeout(10)


class Context:
    async def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise GrpcAbort(code, details)


#: What the calls' bytes are, weakly.
FREED: list[weakref.ref[np.ndarray]] = []


class Servicer(InferenceServicer):
    """The servicer's error handling around a method that decodes in a worker thread."""

    def __init__(self) -> None:
        pass  # no data plane: only the error handling runs

    @_answers
    async def ModelInfer(self: InferenceServicer, request: Any, context: Any) -> Any:
        data = np.zeros(1 << 20, np.uint8)  # the request's bytes
        FREED.append(weakref.ref(data))

        def decode() -> Any:
            raise ProtocolError(f"input byte size mismatch ({data.nbytes} bytes)")

        return await decode_in_thread(decode)


def test_a_call_failed_in_a_decoding_thread_frees_its_bytes_when_answered() -> None:
    servicer = Servicer()

    async def main() -> None:
        with pytest.raises(GrpcAbort) as refused:
            await servicer.ModelInfer(None, Context())
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        del refused
        # The idle worker thread holds its last job until it is given the next one.
        await anyio.to_thread.run_sync(lambda: None)
        assert FREED and FREED[-1]() is None

    gc.disable()
    try:
        asyncio.run(main())
    finally:
        gc.enable()
