#!/usr/bin/env bash
# Regenerate the Python code of every .proto in this folder (`make protos` runs this).
#
# protoc comes from grpcio-tools (`pip install grpcio-tools`, not a dependency of the package):
# *_pb2.py and *_pb2.pyi for every file, *_pb2_grpc.py for those with a service. Then two
# fix-ups, because protoc writes code for a top-level module in the default descriptor pool:
# - `import model_config_pb2` becomes an import from this package;
# - `_descriptor_pool.Default()` becomes our own pool (pool.py), so tritonclient's copies of
#   Triton's messages (same package and names, default pool) can live in the same process.
# Commit what it writes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"
package="model_runtime.server.triton"
cd "$here"

protos=(*.proto)
grpc_protos=()
for proto in "${protos[@]}"; do
  if grep -q '^service ' "$proto"; then
    grpc_protos+=("$proto")
  fi
done

"$python" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. "${protos[@]}"
if ((${#grpc_protos[@]})); then
  "$python" -m grpc_tools.protoc -I. --grpc_python_out=. "${grpc_protos[@]}"
fi

for proto in "${protos[@]}"; do
  stem="${proto%.proto}"
  for out in "${stem}_pb2.py" "${stem}_pb2.pyi" "${stem}_pb2_grpc.py"; do
    [[ -f "$out" ]] || continue
    # `import x_pb2 as y` (protoc's import of a sibling .proto) -> from the package.
    sed -i -E "s/^import ([A-Za-z0-9_]+_pb2)( as |$)/from ${package} import \1\2/" "$out"
  done
  pb2="${stem}_pb2.py"
  if grep -q '_descriptor_pool.Default()' "$pb2"; then
    sed -i \
      -e "s/_descriptor_pool\.Default()/_pool.POOL/" \
      -e "s/^from google.protobuf.internal import builder as _builder$/&\nfrom ${package} import pool as _pool/" \
      "$pb2"
  fi
done
