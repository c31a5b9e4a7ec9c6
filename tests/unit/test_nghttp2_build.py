"""The committed out-of-line cffi module (``server/grpc/_nghttp2_ffi.py``) is what
``nghttp2_build`` generates from its declarations today, and the daemon's import of the binding
no longer parses C."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from model_runtime.server.grpc import nghttp2_build


def _without_version(text: str) -> list[str]:
    # cffi writes its own version into the module (``_version = 0x2601``); a newer cffi reads
    # the older module, so only the declarations' part must match.
    return [line for line in text.splitlines() if not line.lstrip().startswith("_version")]


def test_the_committed_module_matches_the_declarations(tmp_path: Path) -> None:
    fresh = nghttp2_build.generate(tmp_path / "_nghttp2_ffi.py").read_text()
    committed = nghttp2_build.TARGET.read_text()
    assert _without_version(committed) == _without_version(fresh), (
        "server/grpc/_nghttp2_ffi.py is stale: run "
        "`python -m model_runtime.server.grpc.nghttp2_build` and commit the result"
    )


def test_opening_the_library_parses_no_c() -> None:
    code = (
        "import sys; import model_runtime.server.grpc.nghttp2 as ng; "
        "assert ng.MISSING is None, ng.MISSING; "
        "ng.lib.nghttp2_strerror(-508); ng.ffi.new('nghttp2_nv[]', 2); "
        "print(sorted(m for m in sys.modules if m.startswith(('pycparser', 'cffi.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
