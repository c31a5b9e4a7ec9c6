#!/usr/bin/env bash
# Make the Triton peer of benchmarks/triton_peer.py in DEST (default .venv-peers/triton): a venv
# with benchmarks/peers/triton.txt (nvidia-pytriton, numpy) and onnxruntime==ORT_VERSION (ours),
# and the real tritonserver laid out ready to start, as pytriton lays it out itself:
#
#   DEST/tritonserver/bin/tritonserver       the wheel's binary (Triton 2.51.0 for pytriton 0.7.0)
#   DEST/tritonserver/backends/python/       the python backend, plus triton_python_backend_stub,
#                                            the wheel's stub for this venv's Python X.Y
#   DEST/tritonserver/caches/                the local response cache (unused, Triton wants it)
#   DEST/triton-layout.json                  what benchmarks/peers/triton_server.py reads to
#                                            start it (paths, LD_LIBRARY_PATH entries, versions)
#
# Once copied out of site-packages the binaries' RPATH ($ORIGIN/../../../nvidia_pytriton.libs)
# no longer finds the wheel's bundled libraries, and the stub links libpython X.Y, which for a
# pyenv interpreter lives in its LIBDIR, not in the system's: so the server is started with
# LD_LIBRARY_PATH=LIBDIR:site-packages/nvidia_pytriton.libs (for that process only) and the
# venv's bin first on PATH (the stub's embedded Python finds the venv through its python3).
# The wheel's binaries need glibc 2.34 at most: they run on this machine's 2.36 as they are,
# no private sysroot needed (the script checks it by running tritonserver --help).
#
# Usage: triton_install.sh DEST PYTHON ORT_VERSION. Progress goes to stdout; the last line on
# stderr says what failed. The Makefile removes DEST when this fails and writes the stamp
# DEST/.installed when it succeeds.
set -euo pipefail

DEST=${1:-.venv-peers/triton}
PYTHON=${2:-python3}
ORT_VERSION=${3:?usage: triton_install.sh DEST PYTHON ORT_VERSION}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() {
  echo "triton_install: $*" >&2
  exit 1
}

rm -rf "$DEST"
echo "venv: $DEST ($PYTHON)"
"$PYTHON" -m venv "$DEST" || die "$PYTHON -m venv $DEST failed"
py=$DEST/bin/python
"$py" -m pip install --quiet --retries 2 --timeout 15 --upgrade pip \
  || die "pip could not upgrade itself (no network?)"
echo "pip: -r $HERE/triton.txt onnxruntime==$ORT_VERSION"
"$py" -m pip install --quiet --retries 2 --timeout 15 -r "$HERE/triton.txt" \
  "onnxruntime==$ORT_VERSION" \
  || die "pip could not install nvidia-pytriton / onnxruntime==$ORT_VERSION (no network?)"
"$py" -m pip check || die "pip check: the venv's requirements conflict (above)"

# Where the wheel put things, and what this venv's Python needs.
read -r dist libs xy libdir < <("$py" - <<'EOF'
import pathlib, sys, sysconfig
import pytriton
root = pathlib.Path(pytriton.__file__).resolve().parent
print(root / "tritonserver", root.parent / "nvidia_pytriton.libs",
      f"{sys.version_info[0]}.{sys.version_info[1]}", sysconfig.get_config_var("LIBDIR"))
EOF
) || die "the venv's python cannot import pytriton"
stub=$dist/python_backend_stubs/$xy/triton_python_backend_stub
[[ -x $dist/bin/tritonserver ]] || die "the wheel has no $dist/bin/tritonserver"
[[ -f $stub ]] || die "the wheel has no python backend stub for Python $xy ($stub)"
[[ -d $libs ]] || die "the wheel has no $libs"
[[ -f $libdir/libpython$xy.so.1.0 ]] \
  || die "no $libdir/libpython$xy.so.1.0: the stub needs a shared libpython (--enable-shared)"

server=$DEST/tritonserver
echo "layout: $server (python backend stub for Python $xy)"
mkdir -p "$server"
cp -r "$dist/bin" "$dist/backends" "$dist/caches" "$server/"
find "$server" -name __pycache__ -prune -exec rm -rf {} +
cp "$stub" "$server/backends/python/triton_python_backend_stub"

# Every library resolves (the stub's libpython from LIBDIR), and the binary runs here.
ld_path=$libdir:$libs
for bin in "$server/bin/tritonserver" "$server/backends/python/triton_python_backend_stub" \
  "$server/backends/python/libtriton_python.so"; do
  deps=$(LD_LIBRARY_PATH=$ld_path ldd "$bin") || die "ldd $bin failed"
  if grep -F "not found" <<<"$deps" >&2; then
    die "$bin: the libraries above are missing"
  fi
done
LD_LIBRARY_PATH=$ld_path ldd "$server/backends/python/triton_python_backend_stub" \
  | grep -qF "$libdir/libpython$xy.so.1.0" || die "the stub does not take libpython from $libdir"
help=$(LD_LIBRARY_PATH=$ld_path "$server/bin/tritonserver" --help 2>&1 || true)
grep -q "^Usage: tritonserver" <<<"$help" \
  || die "tritonserver does not run here: $(tail -1 <<<"$help")"

versions=$("$py" -c 'from importlib.metadata import version as v
print(v("nvidia-pytriton"), v("onnxruntime"), v("numpy"))')
read -r pytriton_v ort_v numpy_v <<<"$versions"
"$py" - "$DEST/triton-layout.json" "$server" "$libdir" "$libs" "$xy" "$pytriton_v" "$ort_v" \
  "$numpy_v" <<'EOF'
import json, pathlib, sys
out, server, libdir, libs, xy, pytriton_v, ort_v, numpy_v = sys.argv[1:]
doc = {
    "tritonserver": str(pathlib.Path(server).resolve() / "bin" / "tritonserver"),
    "backend_directory": str(pathlib.Path(server).resolve() / "backends"),
    "cache_directory": str(pathlib.Path(server).resolve() / "caches"),
    "ld_library_path": [libdir, libs],
    "path": [str(pathlib.Path(out).resolve().parent / "bin")],
    "python": xy,
    "versions": {"nvidia-pytriton": pytriton_v, "onnxruntime": ort_v, "numpy": numpy_v},
}
pathlib.Path(out).write_text(json.dumps(doc, indent=2) + "\n")
EOF
echo "installed the Triton peer in $DEST ($(du -sh "$DEST" | cut -f1)): nvidia-pytriton" \
  "$pytriton_v, onnxruntime $ort_v, numpy $numpy_v"
