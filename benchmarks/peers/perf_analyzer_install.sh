#!/usr/bin/env bash
# Install NVIDIA's perf_analyzer (Triton's load generator) into a private directory, DEST
# (default .venv-peers/perf_analyzer), for benchmarks/peers/perf_analyzer to run.
#
# The real binary is in PyPI's perf-analyzer wheel tagged manylinux_2_38: pip on this machine's
# glibc 2.36 skips it and installs 0.1.0, a 2 kB placeholder, so the wheel is fetched with an
# explicit --platform (pinned, hash-checked) into DEST/wheel/. The binary needs glibc 2.38 and
# GLIBCXX_3.4.32, so Debian trixie's libc6, libstdc++6, libgcc-s1 and the libraries the binary
# names (libssl3t64, zlib1g, libzstd1) are unpacked with dpkg-deb -x into DEST/sysroot/: nothing
# is installed over the system's, and nothing is put on LD_LIBRARY_PATH; the wrapper runs the
# binary through DEST/sysroot's own dynamic loader with --library-path.
#
# The pins below are the .debs' pool paths on deb.debian.org and their SHA256 (from trixie's
# Packages index). Debian removes a version from the pool some time after a newer one
# supersedes it: then a download fails with 404 and the pins need updating (apt-cache show
# NAME, with trixie in a private sources.list, gives Filename and SHA256).
#
# Usage: perf_analyzer_install.sh [DEST [PYTHON]]. It builds in DEST.tmp and renames it to DEST
# when everything is checked, so an interrupted run leaves no half-made DEST. Progress goes to
# stdout; the last line on stderr says what failed.
set -euo pipefail

DEST=${1:-.venv-peers/perf_analyzer}
PYTHON=${2:-.venv/bin/python}

WHEEL_REQ='perf-analyzer==2.60.0 --hash=sha256:23ef56b107ae9233e5cf09fbdf508dd9b936a52f1bae2f63f53c8117087b3f25'
WHEEL_PLATFORM=manylinux_2_38_x86_64

# base URL, pool path, SHA256
DEBS=(
  "http://deb.debian.org/debian pool/main/g/glibc/libc6_2.41-12+deb13u5_amd64.deb b59b0625cd1a791375d40dab23a4d5d3d0641e3d0a773501becdc3725b7f99cf"
  "http://deb.debian.org/debian pool/main/g/gcc-14/libstdc++6_14.2.0-19_amd64.deb ab1fa05837aa7a92aae748fd07a18a35f7d18bb4a71c4724fe2bbf0e32089de0"
  "http://deb.debian.org/debian pool/main/g/gcc-14/libgcc-s1_14.2.0-19_amd64.deb 3c71917b490d1a17aed43196a2787a256ecf060526cdb20216a74bedc061b150"
  "http://deb.debian.org/debian pool/main/o/openssl/libssl3t64_3.5.9-1~deb13u1_amd64.deb ffefb9af363e0e4592251b2533eb06453c8e470f7772e40263c4b2129251a6d5"
  "http://deb.debian.org/debian pool/main/z/zlib/zlib1g_1.3.dfsg+really1.3.1-1+deb13u1_amd64.deb 8c27c342230503b73dfde629642c3b352e87b554e06d60cf58772f236a305ceb"
  "http://deb.debian.org/debian pool/main/libz/libzstd/libzstd1_1.5.7+dfsg-1_amd64.deb 2f6a2aeacfc925eba8b00ac9139bc4bfccf8cacb09eb93de067074b26948eef9"
)

die() {
  echo "perf_analyzer_install: $*" >&2
  exit 1
}

for tool in curl dpkg-deb sha256sum; do
  command -v "$tool" >/dev/null || die "needs $tool (apt-get install ${tool/sha256sum/coreutils})"
done
[[ -x $PYTHON ]] || die "no $PYTHON (run make install first)"

TMP=$DEST.tmp
rm -rf "$TMP"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/debs" "$TMP/sysroot"

echo "wheel: ${WHEEL_REQ%% *} ($WHEEL_PLATFORM) -> $TMP/wheel"
"$PYTHON" -m pip install --quiet --retries 2 --timeout 15 --no-deps --only-binary=:all: \
  --platform "$WHEEL_PLATFORM" --implementation py --target "$TMP/wheel" \
  --require-hashes -r <(echo "$WHEEL_REQ") \
  || die "pip could not install ${WHEEL_REQ%% *} for $WHEEL_PLATFORM from PyPI (no network?)"

for entry in "${DEBS[@]}"; do
  read -r base path sha <<<"$entry"
  deb=$TMP/debs/${path##*/}
  echo "deb: $base/$path"
  curl -fsS --retry 2 --connect-timeout 15 --max-time 300 -o "$deb" "$base/$path" \
    || die "could not download $base/$path (no network, or the pin is no longer in the pool)"
  echo "$sha  $deb" | sha256sum --check --quiet - || die "SHA256 mismatch for $path"
  dpkg-deb -x "$deb" "$TMP/sysroot"
done
rm -rf "$TMP/debs"

# Check that every library the binary needs resolves inside the sysroot (none from the system),
# and that it runs.
lib=$TMP/sysroot/usr/lib/x86_64-linux-gnu
bin=$TMP/wheel/perf_analyzer/bin/perf_analyzer
[[ -f $bin ]] || die "the wheel has no perf_analyzer/bin/perf_analyzer"
deps=$("$lib/ld-linux-x86-64.so.2" --inhibit-cache --library-path "$lib" --list "$bin") \
  || die "the private loader cannot load $bin"
if grep -E '=> ' <<<"$deps" | grep -v -F "=> $lib/" >&2; then
  die "libraries above resolve outside $TMP/sysroot: add their .debs"
fi
"$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$bin" --version \
  || die "$bin --version failed through the private loader"

rm -rf "$DEST"
mv "$TMP" "$DEST"
echo "installed perf_analyzer in $DEST ($(du -sh "$DEST" | cut -f1))"
